"""A page named by its number is that page: "page 3.7" is the seventh page of chapter 3 as ``_toc.yml`` orders it.

The book numbers its pages from ``_toc.yml`` (``numbered: 2``), so the numbers move when a page is added or
moved, while the prose that cites them does not. Two checks, over every page source, the introduction and
lessonlib's strings (which pages print):

- a link whose text carries a page number points at the page with that number;
- every number cited as "page X.Y" or "pages X.Y and X.Z" is a page that exists.

Whether an unlinked "page 3.7" names the right topic is left to the readers.
"""
import re
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

NUMBER = re.compile(r"\b(\d)\.(\d{1,2})\b")
LINK = re.compile(r"\[([^\]\n]*?)\]\(([^)\s#]+?\.(?:ipynb|md))(?:#[^)]*)?\)")
# "page 3.7", "pages 3.10 and 3.11", "pages 1.3, 1.4 and 3.14", "pages 3.2–3.4"
CITED = re.compile(r"\b[Pp]ages? (\d\.\d{1,2}(?:(?:,|,? and|,? or| to|–|-) \d\.\d{1,2}|–\d\.\d{1,2})*)")


def numbered_pages() -> dict[str, str]:
    """``{"chapters/03-x/07-y": "3.7", "chapters/03-x/index": "3"}`` for the numbered part of ``_toc.yml``."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    out = {}
    for part in toc["parts"]:
        if not part.get("numbered"):
            continue
        for c, chapter in enumerate(part["chapters"], 1):
            out[chapter["file"]] = str(c)
            for s, section in enumerate(chapter.get("sections", []), 1):
                out[section["file"]] = f"{c}.{s}"
    return out


def sources() -> list[Path]:
    return sorted([ROOT / "intro.md", *(ROOT / "chapters").rglob("*.md"), *(ROOT / "exercises").glob("*.md"),
                   *(ROOT / "lessonlib").rglob("*.py")])


def test_the_toc_numbers_the_pages_the_book_shows():
    pages = numbered_pages()
    assert pages["chapters/03-distributed-speedup/07-sequence-and-context-parallel"] == "3.7"
    assert sum(1 for n in pages.values() if "." in n) >= 20, pages


def wrong_links(path: Path, root: Path = ROOT) -> list[str]:
    """Links in ``path`` whose text carries a page number other than the linked page's."""
    pages, wrong = numbered_pages(), []
    for m in LINK.finditer(path.read_text()):
        try:
            key = str((path.parent / m.group(2)).resolve().relative_to(root.resolve()).with_suffix(""))
        except ValueError:
            continue
        number = NUMBER.search(m.group(1))
        if number and key in pages and number.group(0) != pages[key]:
            wrong.append(f"{m.group(0)}: that page is {pages[key]}")
    return wrong


def missing_pages(text: str) -> list[str]:
    """Numbers cited as pages in ``text`` that the book does not have."""
    exists = set(numbered_pages().values())
    return [f"page {a}.{b}" for m in CITED.finditer(text) for a, b in NUMBER.findall(m.group(1))
            if f"{a}.{b}" not in exists]


def test_a_numbered_link_points_at_the_page_with_that_number():
    wrong = {str(p.relative_to(ROOT)): w for p in sources() if (w := wrong_links(p))}
    assert not wrong, wrong


def test_every_cited_page_exists():
    missing = {str(p.relative_to(ROOT)): m for p in sources() if (m := missing_pages(p.read_text()))}
    assert not missing, missing


def test_the_checks_can_fail(tmp_path):
    folder = tmp_path / "chapters" / "03-distributed-speedup"
    folder.mkdir(parents=True)
    planted = folder / "zz-planted.md"
    planted.write_text("See [page 3.6](07-sequence-and-context-parallel.ipynb) and [page 3.7](07-sequence-and-"
                       "context-parallel.ipynb), and pages 3.2 and 3.99.\n")
    assert wrong_links(planted, root=tmp_path) == [
        "[page 3.6](07-sequence-and-context-parallel.ipynb): that page is 3.7"]
    assert missing_pages(planted.read_text()) == ["page 3.99"]
