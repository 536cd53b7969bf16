"""Author notebooks from percent-format Python files, with the shared setup cell.

    python scripts/nbtools.py SRC.py DEST.ipynb

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


def setup_cell_source(url: str | None = None) -> str:
    url = url or repository_url()
    return (
        "# Setup: use lessonlib from this repository, or install it (Colab) from\n"
        f"# {url}\n"
        "import importlib.util, subprocess, sys\n"
        "if importlib.util.find_spec(\"lessonlib\") is None:\n"
        "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\",\n"
        f"                    \"git+{url}\"], check=True)\n"
        "from lessonlib.measure.device import environment_report\n"
        "print(environment_report())"
    )


def setup_cell() -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(setup_cell_source(), metadata={"tags": ["hide-input"]})


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
    if len(argv) != 3:
        sys.exit(__doc__)
    nb = py_to_notebook(Path(argv[1]).read_text())
    nbformat.validate(nb)
    nbformat.write(nb, argv[2])
    print(f"wrote {argv[2]} ({len(nb.cells)} cells)")


if __name__ == "__main__":
    main(sys.argv)
