"""Running a notebook leaves no files behind: the check the nbval run makes (the repository's conftest.py).

Each notebook's kernel gets a temp folder of its own (``TMPDIR``) and the
notebook's folder is listed before its first cell; after its last cell both
must be as they were once its kernel has shut down, or that cell's teardown fails. Here a toy notebook that leaks a
temp folder and a file is run under nbval and must fail, naming both; one that
cleans up passes.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import uuid

import nbformat
import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # starts pytest and a kernel


def _run(cells: list[str]) -> subprocess.CompletedProcess:
    # Under the repository, so that its conftest.py (where the check lives) applies; _build/ is ignored by git.
    folder = ROOT / "_build" / f"leak-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    try:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
        nbformat.write(nb, folder / "toy.ipynb")
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                               "--nbval-lax", str(folder / "toy.ipynb")],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_notebook_that_leaves_files_behind_fails_naming_them():
    # A TemporaryDirectory held in a variable, "removed when the kernel exits": it is not.
    proc = _run(["import pathlib, tempfile", "kept = tempfile.TemporaryDirectory(prefix='exercise-leak-')",
                 "pathlib.Path('results.csv').write_text('x')"])
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "toy.ipynb left files behind" in proc.stdout
    assert "in the temp folder: exercise-leak-" in proc.stdout and "results.csv" in proc.stdout


def test_a_notebook_that_removes_what_it_writes_passes():
    proc = _run(["import pathlib, shutil, tempfile",
                 "d = tempfile.mkdtemp(prefix='exercise-clean-')\npathlib.Path('results.csv').write_text('x')",
                 "shutil.rmtree(d)\npathlib.Path('results.csv').unlink()"])
    assert proc.returncode == 0, proc.stdout[-3000:]
