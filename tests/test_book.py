"""The book builds with warnings as errors, and every page it should have exists."""
import json
import re

from conftest import ROOT
from built_pages import control_character_faults, figure_faults


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


def folded_faults(html: str) -> list[str]:
    """Where a solution or a hidden check shows outside a closed ``<details>`` toggle (an empty list: none)."""
    faults = []
    for m in re.finditer(r"BEGIN SOLUTION|BEGIN HIDDEN TESTS", html):
        stack = []
        for tag in re.finditer(r"<details\b[^>]*>|</details>", html[:m.start()]):
            if tag.group(0).startswith("</"):
                stack and stack.pop()
            else:
                stack.append(tag.group(0))
        if not stack or re.search(r"\sopen(\s|=|>)", stack[-1]):
            faults.append(f"{m.group(0)} at character {m.start()} is not folded")
    return faults


def test_exercise_solutions_are_folded_in_the_built_book(built_book):
    """Review I1: the instructor pages are public in the book; each solution and hidden check stays folded
    behind its toggle ("Show code cell content"), never shown open on the page."""
    pages = sorted((built_book / "exercises").glob("[0-9]*.html"))
    assert pages, f"no exercise pages in {built_book}"
    for page in pages:
        html = page.read_text(errors="replace")
        assert "BEGIN SOLUTION" in html, f"{page.name}: the solutions are missing (the instructor pages hold them)"
        assert not folded_faults(html), (page.name, folded_faults(html)[:3])
