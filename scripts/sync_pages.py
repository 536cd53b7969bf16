"""Write each page's notebook from its text source.

    python scripts/sync_pages.py              # every page: chapters/*/NN-*.md and exercises/*.md
    python scripts/sync_pages.py PAGE.md ...  # these pages only
    python scripts/sync_pages.py --check      # list the notebooks that differ; exit 1 if any
    python scripts/sync_pages.py --setup-cell # first make every page's first cell the shared setup cell

A page is a MyST Markdown file paired with a notebook by jupytext (its front
matter says ``jupytext: formats: ipynb,md:myst``). The ``.md`` is the source
you edit; the ``.ipynb`` beside it is generated (for Colab, downloads, nbval and
the book build) and committed. It is written without outputs, and its cell ids
are taken from each cell's content, so the same ``.md`` always gives the same
bytes and an edit changes only the cells it touches (``jupytext --sync`` would
keep a notebook's outputs and invent new ids). tests/test_text_sources.py fails
when a notebook differs from what this script writes.

The first cell of every page is the shared setup cell (``setup_cell_source``;
tests/test_notebook_setup.py checks it). It names the repository URL, which
is written in one place, ``_config.yml``: after changing either, run with
``--setup-cell``.
"""
from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
PAIRED = re.compile(r"^---\n(?:.*\n)*?jupytext:\n(?:.*\n)*?\s+formats: ipynb,md:myst\n(?:.*\n)*?---\n")


def repository_url() -> str:
    """The repository URL, read from the one place it is written: _config.yml."""
    text = (ROOT / "_config.yml").read_text()
    m = re.search(r"^repository:\s*\n(?:\s+#.*\n)*\s+url:\s*(\S+)", text, re.M)
    if not m:
        raise RuntimeError("_config.yml has no repository.url")
    return m.group(1)


#: Packages lessonlib needs that the setup cell installs only when they are missing
#: (never upgrades: Colab keeps its own torch and ipywidgets).
SETUP_NEEDS = ("torch", "numpy", "matplotlib", "ipywidgets", "tqdm")


def setup_cell_source(url: str | None = None) -> str:
    """The first cell of every notebook.

    In a clone of the course it puts that checkout's ``lessonlib`` first on the
    path (also for the processes a page starts, through PYTHONPATH). Elsewhere
    (Colab), when ``lessonlib`` is not installed, it installs it from the
    repository with ``--no-deps`` (the environment variable LESSONLIB_SOURCE,
    any pip requirement, overrides the URL; the tests point it at a local
    repository), then only the packages of SETUP_NEEDS that are missing. It
    never upgrades torch or ipywidgets.
    """
    url = url or repository_url()
    needs = ", ".join(f'"{n}"' for n in SETUP_NEEDS)
    return (
        "# @title Setup: lessonlib from this checkout, or installed without touching torch or ipywidgets\n"
        f"# On Colab it installs lessonlib from {url} (no upgrades).\n"
        "import importlib.util, os, pathlib, subprocess, sys\n"
        "here = pathlib.Path.cwd()\n"
        "clone = next((p for p in (here, *here.parents) if (p / \"lessonlib\" / \"__init__.py\").exists()), None)\n"
        "if clone:  # a clone of the course: use its lessonlib, here and in started processes\n"
        "    sys.path.insert(0, str(clone))\n"
        "    os.environ[\"PYTHONPATH\"] = os.pathsep.join(filter(None, [str(clone), os.environ.get(\"PYTHONPATH\")]))\n"
        "elif importlib.util.find_spec(\"lessonlib\") is None:\n"
        f"    source = os.environ.get(\"LESSONLIB_SOURCE\", \"git+{url}\")\n"
        "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", \"--no-deps\", source], check=True)\n"
        f"missing = [m for m in ({needs}) if importlib.util.find_spec(m) is None]\n"
        "if missing:  # only what is absent; installed versions stay as they are\n"
        "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", *missing], check=True)\n"
        "importlib.invalidate_caches()\n"
        "from lessonlib.measure.device import environment_report\n"
        "print(environment_report())"
    )


def setup_cell_metadata() -> dict:
    """The setup cell is hidden in all three places: the book (``hide-input``), JupyterLab
    (``jupyter.source_hidden``) and Colab (a form: ``# @title`` and ``cellView: form``)."""
    return {"cellView": "form", "jupyter": {"source_hidden": True}, "tags": ["hide-input"]}


def write_setup_cell(md: Path) -> bool:
    """Make the first cell of the text source ``md`` the current setup cell; True when it changed."""
    nb = jupytext.read(md, fmt="md:myst")
    first = nb.cells[0]
    meta = {**first.metadata, **setup_cell_metadata()}
    if first.cell_type == "code" and first.source == setup_cell_source() and first.metadata == meta:
        return False
    if first.cell_type == "code" and first.source.startswith("# @title Setup"):
        first.source, first.metadata = setup_cell_source(), meta
    else:
        nb.cells.insert(0, nbformat.v4.new_code_cell(setup_cell_source(), metadata=setup_cell_metadata()))
    md.write_text(jupytext.writes(nb, fmt="md:myst"))
    return True


def is_page(path: Path) -> bool:
    """True for a text source paired with a notebook (its front matter names ``ipynb,md:myst``)."""
    return path.suffix == ".md" and bool(PAIRED.match(path.read_text()))


def pages() -> list[Path]:
    """Every paired text source of the book (chapters and exercises)."""
    return sorted(p for d in ("chapters", "exercises") for p in (ROOT / d).rglob("*.md")
                  if ".ipynb_checkpoints" not in p.parts and is_page(p))


def without_version(text: str) -> str:
    """``text`` less jupytext's version line (it changes with every jupytext release)."""
    return re.sub(r"^    jupytext_version: .*\n", "", text, count=1, flags=re.M)


def notebook(md: Path) -> nbformat.NotebookNode:
    """The notebook of the text source ``md``: no outputs, cell ids from the cells' content."""
    nb = jupytext.read(md, fmt="md:myst")
    seen: dict[str, int] = {}
    for cell in nb.cells:
        key = cell.cell_type + "\0" + cell.source
        seen[key] = seen.get(key, 0) + 1
        cell.id = hashlib.sha1(f"{key}\0{seen[key]}".encode()).hexdigest()[:8]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.validate(nb)
    return nb


def notebook_text(md: Path) -> str:
    """The bytes of the notebook of ``md``, as this script writes them."""
    return nbformat.writes(notebook(md)) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    mds = [Path(a).resolve() for a in argv[1:] if not a.startswith("--")] or pages()
    if "--setup-cell" in argv:
        for md in mds:
            if write_setup_cell(md):
                print(f"wrote the setup cell of {md.relative_to(ROOT)}")
    differ = []
    for md in mds:
        if not is_page(md):
            print(f"{md}: not a paired text source (no 'formats: ipynb,md:myst' in its front matter)")
            return 2
        ipynb = md.with_suffix(".ipynb")
        text = notebook_text(md)
        if not ipynb.exists() or ipynb.read_text() != text:
            differ.append(ipynb)
            if not check:
                ipynb.write_text(text)
    verb = "differ from their text source" if check else "written"
    for p in differ:
        print(f"{verb}: {p.relative_to(ROOT)}")
    if check and differ:
        print("run: python scripts/sync_pages.py")
    return 1 if check and differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
