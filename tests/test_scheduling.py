"""How ``pytest -n 2 --dist loadgroup`` shares the run (conftest.py), checked on a
real two-worker run of three small modules. The book's tests belong to the lane (notebooks, book,
browser), so they run on one worker, in order; every other module stays on one worker; and each test
carries its group (pytest-xdist 3.8 with pytest 9.2 drops the groups silently: pytest-xdist#1386)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

MODULES = ["tests/test_book.py", "tests/test_prose.py", "tests/test_progress.py"]


@pytest.mark.slow  # starts a pytest run with two workers: about 15 s
def test_two_workers_keep_the_lane_and_each_module_on_one_worker(tmp_path):
    # An empty "built book": the book's tests fail at once instead of building it (only where
    # they run matters here).
    env = dict(os.environ, BOOK_HTML=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
                           "-o", "addopts=", *MODULES], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] \w+ (\S+)@(\S+)", proc.stdout, re.M)
    assert ran, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, nodeid, group in ran:
        module = nodeid.split("::", 1)[0]
        assert group == ("notebooks-book-browser" if module == "tests/test_book.py" else module), (nodeid, group)
        workers.setdefault(group, set()).add(worker)
    assert set(workers) == {"notebooks-book-browser", "tests/test_prose.py", "tests/test_progress.py"}
    assert all(len(w) == 1 for w in workers.values()), workers
    # in the order of the file, as the lane runs the notebooks, then the book, then the browser
    ran_book = list(dict.fromkeys(re.split(r"[:\[]+", n)[1] for _, n, g in ran if g == "notebooks-book-browser"))
    assert ran_book == re.findall(r"^def (test_\w+)", (ROOT / MODULES[0]).read_text(), re.M)


def test_the_exercise_notebooks_and_their_checks_leave_the_lane():
    """The public book shows each exercise as its student copy, not run (scripts/student_pages.py), so the
    exercises' nbval cells and the checks of their executed outputs (test_colab_like.py) are a group of their
    own, off the lane (the run's longest unit); the chapters, the book and the browser tests stay in it."""
    import importlib.util
    from types import SimpleNamespace as NS

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    IPyNbCell = type("IPyNbCell", (), {"get_closest_marker": lambda self, name: None, "nodeid": "x.ipynb::Cell 0"})

    def cell(path):
        item = IPyNbCell()
        item.parent = NS(fspath=ROOT / path)
        return item

    def check(path, fixtures=("executed_notebooks",)):
        return NS(fixturenames=list(fixtures), callspec=NS(params={"path": ROOT / path}), nodeid="tests/t.py::t",
                  get_closest_marker=lambda name: None)

    ex, ch = "exercises/3c-bubbles-and-paid-capacity.ipynb", "chapters/01-forward-vs-training/02-memory-inventory.ipynb"
    assert root.xdist_group_of(cell(ex), "notebooks") == root.xdist_group_of(check(ex), "book") == root.EXERCISE_RUNS
    assert root.xdist_group_of(cell(ch), "notebooks") == root.xdist_group_of(check(ch), "book") == root.LANE
    assert root.xdist_group_of(check(ex, ("executed_notebooks", "built_book")), "book") == root.LANE
