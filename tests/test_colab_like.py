"""Every notebook once in a Colab-like runtime, and the live widgets under each ipywidgets version.

The Colab-like runtime is one venv with only torch (the pinned CPU wheel),
ipykernel, matplotlib and the ipywidgets Colab ships (7.7): ``colab_env.runtime``.
Every notebook runs once, there: nbval runs it in that venv's kernel (the
repository's conftest.py), and the book build renders those outputs. The tests
here read the same outputs, rendered as plain Jupyter renders them (nbconvert,
no myst-nb), and assert: no quiz answer in the visible text; numbers written
from the run appear (Markdown output); the runtime's torch and ipywidgets
unchanged and no lessonlib installed into it. (No raw ``{glue}`` role:
tests/test_pages.py checks the sources.)

Run from the checkout, a notebook's setup cell imports the checkout's lessonlib.
Its other branch, the one Colab takes, is the same cell on every page
(tests/test_notebook_setup.py): ``test_a_page_outside_a_clone_installs_lessonlib_as_on_colab``
runs one page from a folder outside the checkout in a fresh Colab-like venv, where
the setup cell installs lessonlib from a local bare repository standing in for the
GitHub URL (LESSONLIB_SOURCE).

The ipywidgets matrix runs only what differs between the versions: no page
calls ``.widget()`` (a page's quizzes and calculators are HTML and JavaScript,
the same under both), so ``test_live_widgets_work_with_this_ipywidgets`` builds
``quiz.widget()`` and ``Explorer.widget()`` in a venv holding only that
ipywidgets, once for 7.7 and once for 8.
"""
from __future__ import annotations

import re
import textwrap

import nbformat
import pytest

import colab_env as ce
from conftest import ROOT, course_notebooks
import sync_pages

NOTEBOOKS = [pytest.param(p, id=p.stem) for p in course_notebooks()]
#: The page run as on Colab: a short one (a few seconds), with quizzes and numbers in its outputs.
ON_COLAB = ROOT / "exercises" / "3c-bubbles-and-paid-capacity.ipynb"

# Quiz definitions in visible code give the answer away.
DEFINITION = re.compile(r"correct\s*=\s*True|\banswer\s*=|explanation\s*=")


def shown_as_plain_jupyter_shows_it(nb, path) -> list[str]:
    """What is wrong with an executed notebook as plain Jupyter shows it (``[]``: nothing)."""
    text = ce.visible_text(ce.render_html(nb))
    problems = []
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
    print(f"{path.relative_to(ROOT)}: {len(defs)} definitions, {len(shown)} answers shown, "
          f"{len(numbers)} numbers from the run")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_run_in_the_colab_like_runtime_shows_no_answer_and_its_numbers(executed_notebooks, path):
    rel = path.relative_to(ROOT).as_posix()
    if rel not in executed_notebooks:
        pytest.skip(f"nbval did not run {rel} to the end in this session (run it with the notebooks)")
    problems = shown_as_plain_jupyter_shows_it(nbformat.read(executed_notebooks[rel], as_version=4), path)
    assert not problems, f"{rel}:\n- " + "\n- ".join(problems)


def test_the_notebooks_left_the_colab_like_runtime_as_it_was(executed_notebooks):
    """After every notebook ran in it: the same torch and ipywidgets, and still no lessonlib."""
    if not executed_notebooks:
        pytest.skip("no notebook ran in this session")
    venv, built = ce.runtime()
    assert built["ipywidgets"].startswith(ce.COLAB_WIDGETS + ".") and not built["lessonlib"]
    assert ce.versions(venv) == built


@pytest.mark.environments
@pytest.mark.slow
def test_a_page_outside_a_clone_installs_lessonlib_as_on_colab(tmp_path):
    """The setup cell's Colab branch: lessonlib from the repository (here a local bare one), torch and
    ipywidgets untouched; the page then runs and shows no answer, as every page does under nbval."""
    venv = ce.make_venv(tmp_path / "venv", ce.COLAB_WIDGETS)
    before = ce.versions(venv)
    assert not before["lessonlib"]
    source = ce.bare_repository(tmp_path / "course.git")
    nb = ce.execute(ON_COLAB, venv, tmp_path / "work", source)
    after = ce.versions(venv)
    assert after["lessonlib"], "lessonlib was not installed from the repository"
    assert (after["torch"], after["ipywidgets"]) == (before["torch"], before["ipywidgets"]), (before, after)
    problems = shown_as_plain_jupyter_shows_it(nb, ON_COLAB)
    assert not problems, "\n- ".join(problems)


@pytest.mark.environments
@pytest.mark.slow
@pytest.mark.parametrize("widgets", list(ce.IPYWIDGETS))
def test_live_widgets_work_with_this_ipywidgets(widgets, tmp_path):
    """quiz.widget() and Explorer.widget(): build, answer wrong then right, move a slider.

    In a venv with only this ipywidgets (and what it needs): the quiz and calculator modules need
    nothing else (no torch), and lessonlib comes from the checkout.
    """
    venv = ce.make_venv(tmp_path / "venv", widgets, torch=False)
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
        # the boxes are in the quiz's shown (shuffled) order: tick the right one by its text
        next(b for b in m.selector.boxes if b.description == "x").value = True
        m.check_button.click(); assert "Correct" in m.feedback.value
        p = Prediction("p?", "revealed").widget(); p.button.click(); assert "revealed" in p.answer.value
        e = Explorer(lambda d: f"{d * 2}", {"d": [1, 2, 3]}).widget()
        e.inputs["d"].value = 3; assert e.output.value == "6"
        print(ipywidgets.__version__)
    """)
    out = ce.run([str(venv / "bin" / "python"), "-c", script], cwd="/", env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.strip().startswith(widgets + ".")


@pytest.mark.environments
@pytest.mark.slow
def test_setup_cell_in_a_clone_uses_the_checkout():
    """Run from a folder of the checkout, the setup cell imports the checkout's lessonlib."""
    venv = ce.runtime()[0]
    code = sync_pages.setup_cell_source() + "\nimport lessonlib; print('FROM', lessonlib.__file__)"
    out = ce.run([str(venv / "bin" / "python"), "-c", code], cwd=ROOT / "chapters",
                 env={"PATH": "/usr/bin:/bin", "LESSONLIB_SOURCE": "/nonexistent"})
    assert f"FROM {ROOT}/lessonlib/__init__.py" in out
