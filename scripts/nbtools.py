"""Author notebooks from percent-format Python files, with the shared setup cell.

    python scripts/nbtools.py SRC.py DEST.ipynb
    python scripts/nbtools.py --update-setup NOTEBOOK.ipynb...   (re-insert the setup cell)

SRC.py uses ``# %%`` to start a code cell and ``# %% [markdown]`` to start a
markdown cell (each markdown line starts with ``# ``). Leading comment lines of
a code cell set its metadata and are removed from its source:

- ``# tags: hide-input, remove-cell``: cell tags;
- ``# alt: A line chart of ...``: alt text for the figure the cell draws
  (myst-nb's ``mystnb.image.alt``); every figure needs one. The setup cell
(SETUP_CELL) is inserted as the first cell of every notebook; the notebook is
written without outputs, as the course commits them.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


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


def setup_cell() -> nbformat.NotebookNode:
    """The setup cell with its input hidden in all three places: the book
    (``hide-input``), JupyterLab (``jupyter.source_hidden``) and Colab (a form:
    ``# @title`` and ``cellView: form``)."""
    return nbformat.v4.new_code_cell(setup_cell_source(), metadata=setup_cell_metadata())


def setup_cell_metadata() -> dict:
    return {"tags": ["hide-input"], "jupyter": {"source_hidden": True}, "cellView": "form"}


def replace_setup_cell(nb: nbformat.NotebookNode) -> bool:
    """Make the first cell the current setup cell; True when it changed."""
    first = nb.cells[0]
    meta = dict(first.metadata)
    meta.update(setup_cell_metadata())
    if first.source == setup_cell_source() and first.metadata == meta:
        return False
    first.source = setup_cell_source()
    first.metadata = meta
    return True


def py_to_notebook(src: str) -> nbformat.NotebookNode:
    cells = [setup_cell()]
    blocks = re.split(r"^# %%", src, flags=re.M)
    for block in blocks[1:]:
        header, _, body = block.partition("\n")
        if header.strip().startswith("[markdown]"):
            lines = [l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.rstrip().splitlines()]
            cells.append(nbformat.v4.new_markdown_cell("\n".join(lines).strip("\n")))
        else:
            body = body.strip("\n")
            meta = {}
            while True:
                first, _, rest = body.partition("\n")
                if first.startswith("# tags:"):
                    meta["tags"] = [t.strip() for t in first[len("# tags:"):].split(",") if t.strip()]
                elif first.startswith("# alt:"):
                    meta["mystnb"] = {"image": {"alt": first[len("# alt:"):].strip()}}
                else:
                    break
                body = rest
            cells.append(nbformat.v4.new_code_cell(body.strip("\n"), metadata=meta))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main(argv: list[str]) -> None:
    if argv[1:2] == ["--update-setup"]:
        # python scripts/nbtools.py --update-setup NB.ipynb...: re-insert the setup cell
        for path in argv[2:]:
            nb = nbformat.read(path, as_version=4)
            if replace_setup_cell(nb):
                nbformat.write(nb, path)
                print(f"updated the setup cell of {path}")
        return
    if len(argv) != 3:
        sys.exit(__doc__)
    nb = py_to_notebook(Path(argv[1]).read_text())
    nbformat.validate(nb)
    nbformat.write(nb, argv[2])
    print(f"wrote {argv[2]} ({len(nb.cells)} cells)")


if __name__ == "__main__":
    main(sys.argv)
