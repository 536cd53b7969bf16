"""Quizzes that ask for reasoning, not for a sentence of the page: a right choice must not repeat a heading or a
common-mistakes bullet of its own page word for word, and every choice quiz explains its answer."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(p for p in (ROOT / "chapters").glob("0[12]-*/[0-9]*.md"))  # chapters 1 and 2 so far
RIGHT = re.compile(r'Choice\(\s*"([^"]+)"\s*,\s*correct=True')


def _words(text):
    return re.findall(r"[a-z0-9]+", text.lower())


def _shingles(text, n=4):
    w = _words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_right_choice_repeats_no_heading_or_mistake_of_its_page(page):
    text = page.read_text()
    if "## Check yourself" not in text:
        pytest.skip("no quizzes")
    quiz = text[text.index("## Check yourself"):]
    headings = [h for h in re.findall(r"^#{2,3} (.+)$", text, flags=re.M)]
    mistakes = text[text.index("## Common mistakes"):text.index("## Check yourself")] if "## Common mistakes" in text else ""
    bullets = re.split(r"\n- ", mistakes)[1:]
    for right in RIGHT.findall(quiz):
        for source in headings + bullets:
            shared = _shingles(right, 3) & _shingles(source, 3)
            assert not shared, f"{page.name}: right choice {right!r} repeats {source!r} ({' '.join(next(iter(shared)))})"


def test_choice_quizzes_on_chapters_1_and_2_explain_their_answer():
    for page in PAGES:
        quiz = page.read_text().split("## Check yourself")[-1].split("## Key takeaways")[0]
        for block in re.split(r"\n```\n", quiz):
            if "SingleChoice(" in block or "MultipleSelect(" in block:
                assert "explanation=" in block, f"{page.name}: a choice quiz without an explanation"


def test_the_kv_quiz_asks_for_a_model_not_in_the_table():
    text = (ROOT / "chapters/01-forward-vs-training/06-fine-tuning-and-serving.md").read_text()
    quiz = text[text.index("## Check yourself"):]
    assert "LLAMA3_70B" not in quiz and "LLAMA3_8B" not in quiz and "kv_cache_bytes_per_token(" in quiz
