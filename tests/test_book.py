"""The book builds with warnings as errors, and every page it should have exists."""
import json
import re

from conftest import ROOT
from built_pages import control_character_faults, figure_faults, math_faults


def test_book_builds_with_zero_warnings(built_book):
    log = (built_book.parents[1] / "build.log").read_text() if (built_book.parents[1] / "build.log").exists() else ""
    assert (built_book / "index.html").exists()
    assert not re.search(r"\bWARNING\b(?!.*Kernel is running over TCP)", log), log[-3000:]


def test_every_toc_entry_became_a_page(built_book):
    toc = (ROOT / "_toc.yml").read_text()
    for entry in re.findall(r"file:\s*(\S+)", toc):
        assert (built_book / f"{entry}.html").exists(), entry


def test_no_page_references_a_cdn(built_book):
    pages = sorted(built_book.rglob("*.html"))
    assert pages, f"no pages in {built_book}"
    for page in pages:
        text = page.read_text(errors="replace")
        for m in re.finditer(r"""<script[^>]+src=["'](https?:)?//""", text):
            raise AssertionError(f"{page.name} loads a remote script: {text[m.start():m.start()+160]}")


def test_no_page_shows_a_matplotlib_repr_or_a_figure_twice(built_book):
    """Rendering: a figure appeared twice (drawn, then displayed again) and cells printed
    'Text(0.5, 0, ...)' or '<matplotlib.legend.Legend at 0x...>'."""
    pages = sorted((built_book / "chapters").rglob("*.html")) + sorted((built_book / "exercises").rglob("*.html"))
    assert pages, f"no pages in {built_book}"
    faults = {p.name: f for p in pages if (f := figure_faults(p.read_text(errors="replace")))}
    assert not faults, faults


def test_no_page_shows_a_control_character(built_book):
    """Rendering: "(n/s - \\tfrac12)" showed as "(n/s - <tab>frac12)", a LaTeX command in a Python string that was not
    raw. No built chapter or exercise page, its prose and its executed cells' outputs, holds a tab, form feed,
    backspace, bell or vertical tab."""
    pages = sorted((built_book / "chapters").rglob("*.html")) + sorted((built_book / "exercises").rglob("*.html"))
    assert pages, f"no pages in {built_book}"
    faults = {p.name: f for p in pages if (f := control_character_faults(p.read_text(errors="replace")))}
    assert not faults, faults
    executed = sorted((built_book.parent / "jupyter_execute").rglob("*.ipynb"))
    faults = {}
    for nb in executed:
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            for out in cell.get("outputs", []):
                texts = [out.get("text", "")] + [v for k, v in out.get("data", {}).items() if k.startswith("text/")]
                for text in texts:
                    if f := control_character_faults("".join(text) if isinstance(text, list) else text):
                        faults[f"{nb.name} cell {i}"] = f
    assert not faults, faults


def test_no_page_shows_maths_the_build_did_not_pair_up(built_book):
    """Rendering: a ``$$`` equation written inside a paragraph of 3.7's ring fold was read as ``$`` and inline maths,
    and the rest of the fold swapped its text and its maths. No page shows a ``$`` beside rendered maths, or a
    ``\\(``, ``\\)`` or ``$$`` in its prose outside maths and code."""
    pages = sorted(built_book.rglob("*.html"))
    assert len(pages) > 20, f"too few pages in {built_book}"
    faults = {p.relative_to(built_book).as_posix(): f for p in pages if (f := math_faults(p.read_text(errors="replace")))}
    assert not faults, faults
    assert math_faults('solves\n$<span class="math notranslate nohighlight">\\(x\\)</span>')  # the check can fail


#: What only the instructor copy of an exercise holds: solution and hidden-test markers, the grader's
#: registrations, and the closing summary of results (the cells tagged ``instructor-only``).
INSTRUCTOR_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "@grader(",
                      "What this exercise showed", "instructor-only")


def answer_lines(nb, student) -> list[str]:
    """Lines of the instructor notebook ``nb`` that its student copy ``student`` leaves out (solutions, hidden
    tests, the summary), long enough to be the exercise's own (at least 30 characters)."""
    from lessonlib.grading.handout import cell_source

    kept = "\n".join(cell_source(c) for c in student.cells)
    lines = {line.strip() for c in nb.cells for line in cell_source(c).splitlines()}
    return sorted(line for line in lines if len(line) >= 30 and line not in kept)


def test_the_public_book_shows_each_exercise_as_its_student_copy(built_book):
    """Review (every round): the public book showed each exercise's solutions, hidden tests and summary, folded.
    Each exercise page is now the student copy (lessonlib.grading.handout.student_notebook): its page, the
    notebook its download button gives (_sources) and no executed copy holds an answer; it has no launch button."""
    import html as html_lib

    import nbformat

    from lessonlib.grading.handout import answer_leaks, exercise_notebooks, student_notebook

    exercises = exercise_notebooks(ROOT / "exercises")
    assert len(exercises) >= 12, exercises
    for stem, path in exercises.items():
        page = built_book / "exercises" / f"{stem}.html"
        html = page.read_text(errors="replace")
        text = html_lib.unescape(re.sub(r"<[^>]+>", "", html))
        assert "NotImplementedError" in text, f"{page.name}: not the student copy (no stub)"
        shown = [m for m in INSTRUCTOR_MARKERS if m in html or m in text]
        assert not shown, f"{page.name} shows {shown}"
        nb = nbformat.read(path, as_version=4)
        leaked = [line for line in answer_lines(nb, student_notebook(nb)) if line in text]
        assert not leaked, f"{page.name} shows {len(leaked)} lines of the answers, e.g. {leaked[:3]}"
        assert "colab.research.google.com" not in html, f"{page.name} has a launch button"
        download = built_book / "_sources" / "exercises" / f"{stem}.ipynb"
        assert download.exists(), download
        # the download, and the copy myst-nb keeps of the page's notebook (not run: no outputs)
        for copy in (download, built_book.parent / "jupyter_execute" / "exercises" / f"{stem}.ipynb"):
            assert not copy.exists() or answer_leaks(nbformat.read(copy, as_version=4)) == [], copy
    # nothing the html folder serves for an exercise (page, source, download) holds a solution (the grading
    # page, which names the markers, is no exercise)
    served = [p for p in built_book.rglob("*") if p.is_file() and p.name.split(".")[0] in exercises]
    assert len(served) >= 2 * len(exercises), served
    leaking = [p.name for p in served if "BEGIN SOLUTION" in p.read_text(errors="replace")]
    assert not leaking, leaking
