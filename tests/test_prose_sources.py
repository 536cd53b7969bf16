"""The course's prose is its own.

* No run of 10 words is shared with the source documents the course was
  written from (``../shared/seeds`` next to the repository, or the folder in
  ``COURSE_SEEDS``; skipped where they are absent, as in CI and on Colab).
* Learner-facing text never calls those documents "the seed": learners have none.
"""
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = 10


def _seed_dir():
    env = os.environ.get("COURSE_SEEDS")
    candidates = [Path(env)] if env else []
    candidates += [ROOT.parent / "shared" / "seeds", Path("/work/shared/seeds")]
    return next((p for p in candidates if p.is_dir() and any(p.iterdir())), None)


def _words(text):
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower().replace("’", "'"))


def _runs(words, n=RUN):
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def course_texts():
    """(place, text) for every page and notebook cell a learner reads, and lessonlib's docstrings."""
    out = []
    for path in sorted(ROOT.glob("*.md")) + sorted(ROOT.glob("chapters/**/*.md")) + sorted(ROOT.glob("exercises/*.md")):
        out.append((str(path.relative_to(ROOT)), path.read_text()))
    for path in sorted(ROOT.glob("chapters/**/*.ipynb")) + sorted(ROOT.glob("exercises/*.ipynb")):
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            out.append((f"{path.relative_to(ROOT)} cell {i}", "".join(cell["source"])))
    for path in sorted((ROOT / "lessonlib").rglob("*.py")):
        out.append((str(path.relative_to(ROOT)), path.read_text()))
    return out


def repository_texts():
    """course_texts() and the tests' own source: a fixture is text in the repository too."""
    return course_texts() + [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "tests").rglob("*.py"))]


def shared_runs(texts, sources):
    """{place: [runs of RUN words it shares with the sources]}."""
    source_runs = set()
    for text in sources:
        source_runs |= _runs(_words(text))
    found = {}
    for place, text in texts:
        hits = sorted(_runs(_words(text)) & source_runs)
        if hits:
            found[place] = hits
    return found


def test_the_check_finds_a_copied_run():
    # Invented text: a test's fixture must not itself quote a source document (the test below
    # scans tests/ too).
    source = "The harbour ferry company counts its passengers at every pier before the evening tide turns."
    copied = ("intro", "As we saw, the harbour ferry company counts its passengers at every pier before noon.")
    own = ("intro", "Ferries carry people; counting them is a different job altogether.")
    assert shared_runs([copied], [source]) == {"intro": [
        "harbour ferry company counts its passengers at every pier before",
        "the harbour ferry company counts its passengers at every pier"]}
    assert shared_runs([own], [source]) == {}


def test_no_ten_word_run_from_the_source_documents():
    seeds = _seed_dir()
    if seeds is None:
        pytest.skip("the source documents are not on this machine")
    sources = [p.read_text(errors="replace") for p in sorted(seeds.iterdir()) if p.is_file()]
    found = shared_runs(repository_texts(), sources)
    assert not found, "rephrase these passages:\n" + "\n".join(f"{k}: {v}" for k, v in found.items())


LEARNER_SEED = re.compile(r"\bseed (example|documents?|lessons?|texts?|transcripts?)\b|"
                          r"\bseed's (example|serial|numbers?|units?)\b", re.I)


def test_learner_text_never_mentions_the_seed_documents():
    found = [(place, m.group(0)) for place, text in course_texts() for m in LEARNER_SEED.finditer(text)]
    assert not found, found
