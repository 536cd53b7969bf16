"""How a test run is put together (applies to tests/ and to the notebooks nbval collects).

Phases and markers. Every collected test gets its phase's markers, and the run
goes phase by phase: unit tests, then the notebooks under nbval (marked
``notebooks``), then the grader tests on the real exercises (``notebooks``),
then the book build (``book``), then the built pages in Chromium
(``browser``), then the tests that build extra environments
(``environments``, marked in their files). Everything but the unit tests is
also marked ``slow``, and so are the few unit tests that start processes
(marked in their files): ``pytest -m "not slow"`` is the inner loop. The run
ends with a table of seconds by phase (with two workers the phases overlap, so
the table adds up to more than the run's wall time).

Two workers share the run with pytest-xdist's own scheduler for groups
(``pytest -n 2 --dist loadgroup``, as ``scripts/test.sh`` runs it): a group
goes whole, in order, to one worker. The chapter notebooks, the book build and
the browser tests are one group (the lane, ``LANE``): the book renders the
outputs nbval kept in that process. The exercise notebooks and the checks of
their outputs are a group of their own (``EXERCISE_RUNS``, on the other worker):
the public book shows each exercise as its student copy, not run. Every other
test module is a group of its own (its fixtures are built once), unless its
tests name their own ``xdist_group``. The lane goes out first, then
the groups likely to be long, so that no long one is left to run alone at the end.
(With ``-n 2`` alone, xdist shares single tests: the lane is split and the book
build executes the notebooks nbval ran on the other worker: slower, still right.)

Each notebook runs once, in the Colab-like runtime (``tests/colab_env.py``: a venv
with only torch, ipykernel, matplotlib and Colab's ipywidgets, built on first use
inside ``.venv`` and kept). nbval is the notebook test, run in that venv's
kernel; this file keeps the outputs of every notebook whose cells all passed
under nbval in this run, and the book build (``built_book`` in
tests/conftest.py) renders the chapters' instead of executing them again, as
the checks of how plain Jupyter shows a page read them (tests/test_colab_like.py;
they and the book are the lane's ``book`` phase). A notebook that failed, was
skipped or did not run under nbval is executed by the book build as before, so
a failing cell fails the run twice rather than never. The notebooks run under
nbval as the book build runs them (``LESSONLIB_STATIC_BUILD=1``, the static-page
mode of :mod:`lessonlib.progress`; its live mode is tested in tests/test_progress.py).
"""
from __future__ import annotations

import copy
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

# phase -> (order, markers added)
PHASES = {
    "unit": (0, ()),
    "notebooks": (1, ("notebooks", "slow")),
    "exercises": (2, ("notebooks", "slow")),
    "book": (3, ("book", "slow")),
    "browser": (4, ("browser", "slow")),
    # tests that build an extra environment (a Colab-like venv, JupyterLab,
    # nbgrader) carry @pytest.mark.environments; CI runs them, timed on their own
    "environments": (5, ("environments", "slow")),
}


def _is_nbval(item) -> bool:
    return type(item).__name__ == "IPyNbCell"


def phase_of(item) -> str:
    if _is_nbval(item):
        return "notebooks"
    if item.get_closest_marker("environments"):
        return "environments"
    if Path(str(item.fspath)).name == "test_browser.py" or item.get_closest_marker("browser"):
        return "browser"
    if {"built_book", "executed_notebooks"} & set(getattr(item, "fixturenames", ())):
        return "book"  # needs the outputs nbval kept in the lane's process
    if item.get_closest_marker("notebooks"):
        return "exercises"
    return "unit"


#: The xdist_group of the tests that must run in order in one process: the chapters under nbval,
#: then the book build (which renders nbval's outputs, kept in that process), then the browser tests.
LANE = "notebooks-book-browser"
LANE_PHASES = ("notebooks", "book", "browser")
#: The exercise notebooks under nbval, then the checks of their outputs (tests/test_colab_like.py): the
#: public book shows their student copies, not run, so they need not be in the lane.
EXERCISE_RUNS = "exercise-notebooks"


def runs_an_exercise_notebook(item) -> bool:
    """An exercise notebook's cell under nbval, or a test of one exercise's executed outputs."""
    if _is_nbval(item):
        path = Path(str(item.parent.fspath))
    elif "executed_notebooks" in getattr(item, "fixturenames", ()) and "built_book" not in item.fixturenames:
        path = Path(str(getattr(getattr(item, "callspec", None), "params", {}).get("path", "")))
    else:
        return False
    return path.is_absolute() and path.parent == ROOT / "exercises"


def xdist_group_of(item, phase: str) -> str:
    """The unit ``pytest -n 2 --dist loadgroup`` keeps on one worker: the exercise notebooks and their
    checks, the lane, or else the group a test names itself (``pytest.mark.xdist_group``), or else its
    module (its fixtures are built once)."""
    if runs_an_exercise_notebook(item):
        return EXERCISE_RUNS
    if phase in LANE_PHASES:
        return LANE
    own = item.get_closest_marker("xdist_group")
    if own:
        return own.args[0] if own.args else own.kwargs["name"]
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    config._phase_of = {}
    groups = {}
    for item in items:
        phase = phase_of(item)
        config._phase_of[item.nodeid] = phase
        item.user_properties.append(("phase", phase))  # for the controller's table (it does not collect)
        names = set(PHASES[phase][1])
        if "built_book" in getattr(item, "fixturenames", ()):
            names.add("book")  # the browser tests need the built book too
        for name in sorted(names):
            item.add_marker(name)
        group = groups[item] = xdist_group_of(item, phase)
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    # Stable: keeps each notebook's cells, and each module's tests, in order.
    items.sort(key=lambda it: PHASES[phase_of(it)][0])
    if getattr(config.option, "loadgroup", False):  # an xdist worker of `--dist loadgroup`
        # xdist hands the units out in the order they first appear (pytest_configure turns off its
        # reordering by size): the lane first, to the first worker; then the units that build an environment;
        # then the units with the most slow tests (each starts processes, grades or builds something), and among equals those of
        # the smallest modules (a module with one slow test builds an environment for it), so that
        # no long unit is left to run alone at the end.
        # The units that build an environment (a venv, JupyterLab, nbgrader) go right after the lane: each is one
        # long unit of a minute or so, and left to the end one ran alone while the other worker sat idle.
        slow, size, env = {}, {}, set()
        for it in items:
            slow[groups[it]] = slow.get(groups[it], 0) + bool(it.get_closest_marker("slow"))
            module = it.nodeid.split("::", 1)[0]
            size[module] = size.get(module, 0) + 1
            if config._phase_of[it.nodeid] == "environments":
                env.add(groups[it])
        first = {}
        for i, it in enumerate(items):
            first.setdefault(groups[it], (groups[it] != LANE, groups[it] not in env, -slow[groups[it]],
                                          size[it.nodeid.split("::", 1)[0]], i))
        items.sort(key=lambda it: first[groups[it]])


def pytest_collection_finish(session):
    """Fail loudly if xdist dropped the groups (pytest-xdist#1386: with pytest 9.2 it silently does)."""
    if getattr(session.config.option, "loadgroup", False) and not all("@" in it.nodeid for it in session.items):
        raise pytest.UsageError("pytest-xdist ignored the xdist_group marks (pytest-xdist#1386, pytest 9.2): "
                                "install the versions constraints.txt pins (bash scripts/setup.sh)")


def pytest_runtest_logreport(report):
    """Add each test's setup, call and teardown seconds to its phase's total."""
    config = _CONFIG.get("config")
    if config is None:
        return
    phase = dict(report.user_properties).get("phase", "unit")
    config._phase_seconds[phase] = config._phase_seconds.get(phase, 0.0) + report.duration
    if report.when == "call":
        config._phase_counts[phase] = config._phase_counts.get(phase, 0) + 1


def pytest_terminal_summary(terminalreporter, config):
    """A table of seconds by phase (a fixture's cost counts in the phase of the first test that needs it)."""
    seconds = getattr(config, "_phase_seconds", {})
    if not seconds:
        return
    tr = terminalreporter
    tr.section("time by phase")
    for phase in sorted(seconds, key=lambda p: PHASES[p][0]):
        tr.write_line(f"{phase:10s} {config._phase_counts.get(phase, 0):5d} tests {seconds[phase]:8.1f} s")
    tr.write_line(f"{'total':10s} {sum(config._phase_counts.values()):5d} tests {sum(seconds.values()):8.1f} s")


# ---------------------------------------------------------------------------
# the notebooks nbval executed, kept for the book build
# ---------------------------------------------------------------------------

_CONFIG: dict = {}


def pytest_configure(config):
    _CONFIG["config"] = config
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False  # the units go out in the order collected (above)
    config._phase_seconds, config._phase_counts = {}, {}
    config._executed_notebooks = {}  # repository-relative path -> executed .ipynb path
    config._nb_runs = {}             # notebook path -> {"outputs": {cell_num: outputs}, "ok": bool}
    config._nb_files = {}            # notebook path -> (its kernel's TMPDIR, its folder, the folder's listing)
    config._executed_dir = Path(tempfile.mkdtemp(prefix="lessonlib-executed-"))
    if hasattr(config.option, "nbval_kernel_name"):  # nbval runs the notebooks in the Colab-like runtime's kernel
        config.option.nbval_kernel_name, config.option.nbval_current_env = _colab_env().KERNEL, False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Start nbval's kernel (in the first cell's setup) in the Colab-like runtime, with the book build's environment.

    The kernel is the Colab-like runtime's (``tests/colab_env.py``: a venv with only torch,
    ipykernel, matplotlib and the ipywidgets Colab ships), started as Colab would start it: that
    venv first on PATH, no PYTHONPATH. So every notebook runs once, there, and its outputs serve
    nbval, the book build and the checks of how plain Jupyter shows it (tests/test_colab_like.py).
    The kernel also gets a temp folder of its own (``TMPDIR``, which Python's
    ``tempfile`` and the processes a page starts inherit), and the notebook's
    folder is listed: after the last cell, both must be as they were
    (:func:`_files_left_behind`). Other programs on the machine use the
    system's temp folder at the same time; the kernel's own folder sees only
    what the notebook wrote.
    """
    if not _is_nbval(item):
        yield
        return
    saved = {k: os.environ.get(k) for k in ("LESSONLIB_STATIC_BUILD", "TMPDIR", "PATH", "JUPYTER_PATH",
                                            "PYTHONPATH", "VIRTUAL_ENV")}
    os.environ["LESSONLIB_STATIC_BUILD"] = "1"
    if item.cell_num == 0:
        colab_env = _colab_env()
        set_, unset = colab_env.kernel_environment(colab_env.runtime()[0])
        os.environ.update(set_)
        for name in unset:
            os.environ.pop(name, None)
        folder = Path(str(item.parent.fspath)).parent
        tmp = Path(tempfile.mkdtemp(prefix="nbtmp-", dir=item.config._executed_dir))  # removed with it
        item.config._nb_files[Path(str(item.parent.fspath))] = (tmp, folder, _listing(folder))
        os.environ["TMPDIR"] = str(tmp)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _colab_env():
    """``tests/colab_env.py`` (this file is loaded before tests/ is on the import path)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    import colab_env

    return colab_env


#: Left in a notebook's folder by Python or Jupyter themselves, not by the page.
_NOT_THE_PAGES = {"__pycache__", ".ipynb_checkpoints"}


def _listing(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if not _NOT_THE_PAGES & set(p.relative_to(folder).parts)}


#: How long the processes a killed kernel started (``launch``'s fork server) may take to clean up after it, s.
#: The fork server notices its caller's death through a pipe and removes the caller's ``pymp-*`` folder as it
#: exits; that takes well under a second here, so 10 s bounds a slow, loaded machine without hiding a leak.
CLEANUP_GRACE_S = 10.0


def _files_left_behind(config, path: Path) -> list[str]:
    """What the notebook at ``path`` left in its temp folder and its own folder (``[]``: nothing)."""
    import time

    tmp, folder, before = config._nb_files.pop(path)
    deadline = time.monotonic() + CLEANUP_GRACE_S
    while True:
        left = [f"in the temp folder: {p.relative_to(tmp)}" for p in sorted(tmp.iterdir())
                if not _NOT_LEFT.match(p.name)]
        left += [f"in {folder.name}/: {name}" for name in sorted(_listing(folder) - before)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


#: Not counted as left behind:
#: - ``torchinductor_<user>``: torch's compile cache, one folder a user, reused by every run (it does not pile up);
_NOT_LEFT = re.compile(r"torchinductor_[\w.-]+$")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not _is_nbval(item):
        return
    report = outcome.get_result()
    path = Path(str(item.parent.fspath))
    run = item.config._nb_runs.setdefault(path, {"outputs": {}, "ok": True})
    if report.when == "call":
        run["outputs"][item.cell_num] = copy.deepcopy(item.test_outputs or [])
    if not report.passed or (report.when == "setup" and report.skipped):
        run["ok"] = False
    nb = item.parent.nb
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    if report.when != "teardown":
        return
    if item.cell_num == n_code - 1:  # the notebook's last code cell is done, and its kernel shut down
        if path in item.config._nb_files:
            # Running a notebook leaves no files behind: its last cell's teardown fails if it did.
            left = _files_left_behind(item.config, path)
            if left and report.passed:
                report.outcome = "failed"
                report.longrepr = (f"{path.name} left files behind once its kernel had shut down (a page removes "
                                   "what it writes, explicitly):\n" + "\n".join(left))
                run["ok"] = False
        _keep_executed(item.config, path, nb, run)


def _keep_executed(config, path: Path, nb, run) -> None:
    if not run["ok"] or len(run["outputs"]) != sum(c.cell_type == "code" for c in nb.cells):
        return  # the book build executes it itself
    import nbformat

    done = copy.deepcopy(nb)
    num = 0
    for cell in done.cells:
        if cell.cell_type == "code":
            cell.outputs = run["outputs"][num]
            num += 1
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return
    out = config._executed_dir / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(done, out)
    config._executed_notebooks[rel.as_posix()] = out


@pytest.fixture(scope="session")
def executed_notebooks(pytestconfig) -> dict:
    """``{repository-relative path: executed copy}`` of the notebooks nbval ran fully and
    passed in this run so far (the run orders nbval before the tests that use this)."""
    return pytestconfig._executed_notebooks


def pytest_unconfigure(config):
    import shutil

    shutil.rmtree(getattr(config, "_executed_dir", ""), ignore_errors=True)
