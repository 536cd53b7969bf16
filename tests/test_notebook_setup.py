"""Every notebook starts with the shared setup cell, is committed clean, and is in the book."""
from __future__ import annotations

import re

import nbformat
import pytest

from conftest import ROOT, course_notebooks
import sync_pages

NOTEBOOKS = course_notebooks()
IDS = [str(p.relative_to(ROOT)) for p in NOTEBOOKS]


def test_there_are_notebooks_to_check():
    assert NOTEBOOKS, "no notebooks found under chapters/ or exercises/"


def test_repository_url_is_written_once_in_config():
    text = (ROOT / "_config.yml").read_text()
    url = sync_pages.repository_url()
    assert url.startswith("https://github.com/")
    assert text.count(url) == 1
    assert re.search(r"^\s+colab_url:\s*https://colab\.research\.google\.com\s*$", text, re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_first_cell_is_the_setup_cell_naming_the_configured_url(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "code"
    assert first.source == sync_pages.setup_cell_source(), (
        f"{path.name}: the first cell must be the shared setup cell (scripts/sync_pages.py)")
    assert f"git+{sync_pages.repository_url()}" in first.source
    # Hidden in all three places: book (tag), JupyterLab (source_hidden), Colab (form).
    assert "hide-input" in first.metadata.get("tags", [])
    assert first.metadata.get("jupyter", {}).get("source_hidden") is True
    assert first.metadata.get("cellView") == "form" and first.source.startswith("# @title ")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} have stored outputs; clear them before committing"


def test_every_notebook_and_page_is_in_the_table_of_contents():
    toc = (ROOT / "_toc.yml").read_text()
    listed = set(re.findall(r"file:\s*(\S+)", toc))
    for path in NOTEBOOKS:
        rel = str(path.relative_to(ROOT).with_suffix(""))
        assert rel in listed, f"{rel} is not in _toc.yml"
    for entry in listed:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), f"_toc.yml lists missing {entry}"


CHAPTER_NOTEBOOKS = [p for p in NOTEBOOKS if p.parts[len(ROOT.parts)] == "chapters"]
SECTIONS = [
    ("objectives", r"^##\s+What you will be able to do"),
    ("prediction prompt", r"^##\s+What do you think happens\?"),
    ("common mistakes", r"^##\s+Common mistakes"),
    ("quiz", r"^##\s+Check yourself"),
    ("key takeaways", r"^##\s+Key takeaways"),
]


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in CHAPTER_NOTEBOOKS])
def test_chapter_page_follows_the_page_pattern_in_order(path):
    nb = nbformat.read(path, as_version=4)
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    positions = []
    for name, pattern in SECTIONS:
        m = re.search(pattern, md, re.M)
        assert m, f"{path.name} lacks its {name} section ({pattern})"
        positions.append(m.start())
    assert positions == sorted(positions), f"{path.name}: sections out of order"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "Prediction(" in code, f"{path.name}: no prediction prompt quiz"
    assert re.search(r"\b(SingleChoice|MultipleSelect|Numeric)\(", code), f"{path.name}: no quiz"
