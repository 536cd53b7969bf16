"""Every notebook in a Colab-like runtime: a clean venv with ipywidgets 7.7 and with 8.x.

For each ipywidgets version one fresh venv holds only torch (the pinned CPU
wheel), ipykernel, ipywidgets and matplotlib. Each chapter and exercise
notebook is copied to a folder outside the checkout and executed there; its
setup cell installs lessonlib the way it does on Colab, from a local bare
repository standing in for the GitHub URL (LESSONLIB_SOURCE). The result is
rendered as plain Jupyter renders it (nbconvert, no myst-nb), and the test
asserts: no raw ``{glue`` role; no quiz answer in the visible text; numbers
written from the run appear (Markdown output); torch and ipywidgets unchanged.
"""
from __future__ import annotations

import re
import textwrap

import pytest

import colab_env as ce
from conftest import ROOT, course_notebooks
import sync_pages

NOTEBOOKS = course_notebooks()
CASES = [(w, p) for w in ce.IPYWIDGETS for p in NOTEBOOKS]  # one venv at a time, notebooks in sequence
IDS = [f"ipywidgets{w}-{p.stem}" for w, p in CASES]

# Quiz definitions in visible code give the answer away.
DEFINITION = re.compile(r"correct\s*=\s*True|\banswer\s*=|explanation\s*=")

pytestmark = [pytest.mark.environments, pytest.mark.slow]


@pytest.fixture(scope="session")
def runtimes(tmp_path_factory):
    """{ipywidgets major: (venv, versions before anything ran)}, built on first use."""
    base = tmp_path_factory.mktemp("colab")
    source = ce.bare_repository(base / "course.git")
    cache = {}

    def get(widgets):
        if widgets not in cache:
            venv = ce.make_venv(base / f"venv{widgets}", widgets)
            cache[widgets] = (venv, ce.versions(venv))
        return cache[widgets]

    get.source, get.base = source, base
    return get


@pytest.mark.parametrize("widgets,path", CASES, ids=IDS)
def test_notebook_in_a_colab_like_runtime(runtimes, widgets, path):
    venv, before = runtimes(widgets)
    assert before["ipywidgets"].startswith(widgets + ".") and not before["lessonlib"]
    nb = ce.execute(path, venv, runtimes.base / "run" / widgets / path.stem, runtimes.source)
    after = ce.versions(venv)
    html = ce.render_html(nb)
    text = ce.visible_text(html)
    problems = []
    if (after["torch"], after["ipywidgets"]) != (before["torch"], before["ipywidgets"]):
        problems.append(f"the setup cell changed the runtime: {before} -> {after}")
    if not after["lessonlib"]:
        problems.append("lessonlib was not installed from the repository")
    raw = re.findall(r"\{glue[^}]*\}\s*\S+", text)
    if raw:
        problems.append(f"{len(raw)} raw glue roles, e.g. {raw[:2]}")
    defs = sorted({m.group(0) for m in DEFINITION.finditer(text)})
    if defs:
        problems.append(f"quiz definitions visible in code: {defs}")
    shown = [a for a in ce.answer_texts(nb) if a in text]
    if shown:
        problems.append(f"{len(shown)} quiz answers visible before answering, e.g. {shown[0][:100]!r}")
    chapter = path.parts[len(ROOT.parts)] == "chapters"
    # A chapter's measured numbers belong in its prose (Markdown output); an
    # exercise may print its measured results.
    numbers = ce.output_numbers(nb, ("text/markdown",) if chapter else ("text/markdown", "stream"))
    if not numbers:
        problems.append("no numbers from the run appear " + ("in the prose (no Markdown output carries one)"
                                                             if chapter else "in the outputs"))
    print(f"{path.relative_to(ROOT)} ipywidgets {after['ipywidgets']}: {len(raw)} raw glue, "
          f"{len(defs)} definitions, {len(shown)} answers shown, {len(numbers)} numbers from the run")
    assert not problems, f"{path.relative_to(ROOT)} with ipywidgets {before['ipywidgets']}:\n- " + "\n- ".join(problems)


@pytest.mark.parametrize("widgets", list(ce.IPYWIDGETS))
def test_live_widgets_work_with_this_ipywidgets(runtimes, widgets):
    """quiz.widget() and Explorer.widget(): build, answer wrong then right, move a slider."""
    venv, _ = runtimes(widgets)
    script = textwrap.dedent("""
        import ipywidgets
        from lessonlib.book.quiz import Choice, SingleChoice, Numeric, Prediction, MultipleSelect
        from lessonlib.book.interactive import Explorer
        q = SingleChoice("q?", [Choice("a"), Choice("b", correct=True)])
        w = q.widget(); w.selector.value = 0; w.check_button.click()
        assert "Not quite" in w.feedback.value, w.feedback.value
        w.selector.value = 1; w.check_button.click()
        assert "Correct" in w.feedback.value
        n = Numeric("n?", answer=2.5, tolerance=0.1).widget(); n.selector.value = "9"; n.check_button.click()
        assert "too high" in n.feedback.value
        m = MultipleSelect("m?", [Choice("x", correct=True), Choice("y")]).widget()
        m.selector.boxes[0].value = True; m.check_button.click(); assert "Correct" in m.feedback.value
        p = Prediction("p?", "revealed").widget(); p.button.click(); assert "revealed" in p.answer.value
        e = Explorer(lambda d: f"{d * 2}", {"d": [1, 2, 3]}).widget()
        e.inputs["d"].value = 3; assert e.output.value == "6"
        print(ipywidgets.__version__)
    """)
    out = ce.run([str(venv / "bin" / "python"), "-c", script], cwd="/", env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.strip().startswith(widgets + ".")


def test_setup_cell_in_a_clone_uses_the_checkout(runtimes, tmp_path):
    """Run from a folder of the checkout, the setup cell imports the checkout's lessonlib."""
    venv, _ = runtimes("8")
    code = sync_pages.setup_cell_source() + "\nimport lessonlib; print('FROM', lessonlib.__file__)"
    out = ce.run([str(venv / "bin" / "python"), "-c", code], cwd=ROOT / "chapters",
                 env={"PATH": "/usr/bin:/bin", "LESSONLIB_SOURCE": "/nonexistent"})
    assert f"FROM {ROOT}/lessonlib/__init__.py" in out
