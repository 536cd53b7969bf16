"""Every notebook once in a Colab-like runtime, and the live widgets under each ipywidgets version.

The Colab-like runtime is one fresh venv with only torch (the pinned CPU
wheel), ipykernel, matplotlib and the ipywidgets Colab ships (7.7). Each
chapter and exercise notebook is copied to a folder outside the checkout and
executed there; its setup cell installs lessonlib the way it does on Colab,
from a local bare repository standing in for the GitHub URL
(LESSONLIB_SOURCE). The result is rendered as plain Jupyter renders it
(nbconvert, no myst-nb), and the test asserts: no quiz answer in the visible
text; numbers written from the run appear (Markdown output); torch and
ipywidgets unchanged. (No raw ``{glue}`` role: tests/test_pages.py checks the
sources.)

The ipywidgets matrix runs only what differs between the versions: no page
calls ``.widget()`` (a page's quizzes and calculators are HTML and JavaScript,
the same under both), so ``test_live_widgets_work_with_this_ipywidgets`` builds
``quiz.widget()`` and ``Explorer.widget()`` in a venv holding only that
ipywidgets, once for 7.7 and once for 8.

With ``pytest -n 2`` each notebook is its own unit, so both workers share
them; the runtime is built once, by whichever worker needs it first (a file
lock), and the other reuses it.
"""
from __future__ import annotations

import fcntl
import os
import re
import textwrap

import pytest

import colab_env as ce
from conftest import ROOT, course_notebooks
import sync_pages

#: The ipywidgets Colab ships: the notebooks run under it.
COLAB_WIDGETS = "7"
# one unit each under `pytest -n 2 --dist loadgroup` (conftest.py), so that both workers share them
NOTEBOOKS = [pytest.param(p, id=p.stem, marks=pytest.mark.xdist_group(f"colab-like {p.stem}"))
             for p in course_notebooks()]

# Quiz definitions in visible code give the answer away.
DEFINITION = re.compile(r"correct\s*=\s*True|\banswer\s*=|explanation\s*=")

pytestmark = [pytest.mark.environments, pytest.mark.slow]


@pytest.fixture(scope="session")
def runtime(tmp_path_factory):
    """(venv, versions before anything ran, pip requirement of the course): built once a run.

    Under xdist the workers share one (in the run's common temporary folder, behind a file lock:
    pytest-xdist's documented way to run a session fixture once).
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    base = (base.parent if worker else base) / "colab-like"
    base.mkdir(exist_ok=True)
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / "ready").exists():
            ce.bare_repository(base / "course.git")
            ce.make_venv(base / "venv", COLAB_WIDGETS)
            (base / "ready").write_text("")
    venv = base / "venv"
    return venv, ce.versions(venv), f"git+file://{base / 'course.git'}", base


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_in_a_colab_like_runtime(runtime, path, tmp_path):
    venv, before, source, _ = runtime
    assert before["ipywidgets"].startswith(COLAB_WIDGETS + ".") and not before["lessonlib"]
    nb = ce.execute(path, venv, tmp_path / path.stem, source)
    after = ce.versions(venv)
    html = ce.render_html(nb)
    text = ce.visible_text(html)
    problems = []
    if (after["torch"], after["ipywidgets"]) != (before["torch"], before["ipywidgets"]):
        problems.append(f"the setup cell changed the runtime: {before} -> {after}")
    if not after["lessonlib"]:
        problems.append("lessonlib was not installed from the repository")
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
    print(f"{path.relative_to(ROOT)} ipywidgets {after['ipywidgets']}: "
          f"{len(defs)} definitions, {len(shown)} answers shown, {len(numbers)} numbers from the run")
    assert not problems, f"{path.relative_to(ROOT)} with ipywidgets {before['ipywidgets']}:\n- " + "\n- ".join(problems)


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


def test_setup_cell_in_a_clone_uses_the_checkout(runtime):
    """Run from a folder of the checkout, the setup cell imports the checkout's lessonlib."""
    venv = runtime[0]
    code = sync_pages.setup_cell_source() + "\nimport lessonlib; print('FROM', lessonlib.__file__)"
    out = ce.run([str(venv / "bin" / "python"), "-c", code], cwd=ROOT / "chapters",
                 env={"PATH": "/usr/bin:/bin", "LESSONLIB_SOURCE": "/nonexistent"})
    assert f"FROM {ROOT}/lessonlib/__init__.py" in out
