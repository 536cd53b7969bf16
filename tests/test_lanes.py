"""The scheduler that shares the suite between two pytest workers (tests/lanes.py), driven with
stand-in workers: the lane goes whole and in order to one worker, pool units are never split,
likely-long units go first, and every worker is told to stop once nothing is left."""
from __future__ import annotations

import pytest

pytest.importorskip("xdist")
from lanes import LaneScheduling, unit_of, write_phases  # noqa: E402


class Worker:
    def __init__(self, name):
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent, self.shutting_down = [], False

    def send_runtest_some(self, indices):
        self.sent.append(list(indices))

    def shutdown(self):
        self.shutting_down = True


class Config:
    def __init__(self, workers):
        self.values = {"tx": [f"{workers}*popen"], "maxschedchunk": None}

    def getvalue(self, name):
        return self.values[name]

    getoption = getvalue


COLLECTION = [
    "tests/test_a.py::test_1", "tests/test_a.py::test_2",
    "chapters/x.ipynb::Cell 0", "chapters/x.ipynb::Cell 1",
    "tests/test_slow.py::test_1",
    "tests/test_colab_like.py::test_nb[ipywidgets7-x]", "tests/test_colab_like.py::test_nb[ipywidgets8-x]",
    "tests/test_colab_like.py::test_setup_cell",
    "tests/test_book.py::test_build", "tests/test_browser.py::test_pages",
]
PHASES = {n: "unit" for n in COLLECTION} | {
    "chapters/x.ipynb::Cell 0": "notebooks", "chapters/x.ipynb::Cell 1": "notebooks",
    "tests/test_book.py::test_build": "book", "tests/test_browser.py::test_pages": "browser",
}


def _start(tmp_path, workers=2, long_units=None):
    write_phases(str(tmp_path / "phases.json"), PHASES, long_units or {"tests/test_slow.py": 1})
    sched = LaneScheduling(Config(workers), phases_file=str(tmp_path / "phases.json"))
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, COLLECTION)
    sched.schedule()
    return sched, nodes


def _finish(sched, node):
    """The worker runs everything it holds (the last item only once it is told more or to stop)."""
    while sched.node2pending[node]:
        sched.mark_test_complete(node, sched.node2pending[node][0])


def test_the_lane_goes_whole_and_in_order_to_one_worker_and_the_pool_by_units(tmp_path):
    sched, (first, second) = _start(tmp_path)
    assert first.sent == [[2, 3, 8, 9]]  # notebooks, then the book, then the browser
    assert second.sent == [[4]]  # the unit marked long goes out first
    _finish(sched, second)
    assert second.sent[1:] == [[0, 1], [5], [6, 7]]  # whole units: a module; one Colab-like runtime each
    assert second.shutting_down and not first.shutting_down  # the pool is empty; the lane still runs
    _finish(sched, first)
    assert first.shutting_down and sched.tests_finished
    assert sorted(i for n in (first, second) for chunk in n.sent for i in chunk) == list(range(len(COLLECTION)))


def test_the_unit_with_the_most_slow_tests_goes_first(tmp_path):
    sched, (first, second) = _start(tmp_path, long_units={"tests/test_slow.py": 1, "tests/test_a.py": 2})
    assert second.sent == [[0, 1]]  # two slow tests before one, though collected after
    _finish(sched, second)
    assert second.sent[1:] == [[4], [5], [6, 7]]  # then the other long one, then the rest in order


def test_the_lane_worker_joins_the_pool_when_its_lane_is_done(tmp_path):
    sched, (first, second) = _start(tmp_path)
    for index in (2, 3, 8):  # the lane is down to its last test; the other worker still on its unit
        sched.mark_test_complete(first, index)
    assert first.sent[1] == [0, 1] and not first.shutting_down
    assert second.sent == [[4]]


def test_a_worker_that_dies_gives_its_unfinished_tests_back(tmp_path):
    sched, (first, second) = _start(tmp_path)
    crashed = sched.remove_node(first)  # it was on the first notebook cell
    assert crashed == COLLECTION[2]
    _finish(sched, second)
    assert [3, 8, 9] in second.sent and second.shutting_down


def test_units():
    assert unit_of("tests/test_a.py::test_1[x]") == "tests/test_a.py"
    assert unit_of("tests/test_colab_like.py::test_nb[ipywidgets7-x]") == "tests/test_colab_like.py::ipywidgets7"
    assert unit_of("tests/test_colab_like.py::test_setup_cell") == "tests/test_colab_like.py::ipywidgets8"
