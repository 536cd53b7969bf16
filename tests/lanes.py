"""Two lanes on two cores: how ``pytest -n N`` shares the suite between its workers.

The suite is mostly single-threaded waiting on one process at a time: a
notebook kernel, Chromium, a spawned training job. On a 2-core machine that
leaves a core idle, so ``scripts/test.sh`` runs pytest with two workers
(pytest-xdist), scheduled here rather than by xdist's own ``load``:

* **the lane** goes to the first worker, whole and in order: every notebook
  under nbval, then the book build (which renders the outputs nbval kept, in
  that same process: see the repository's conftest.py), then the browser
  tests on that book;
* **the pool** is everything else, in units that keep a shared fixture on one
  worker (a test module; one Colab-like runtime of test_colab_like.py). Every
  other worker takes units as it frees up, and the first worker joins in once
  its lane is done. The units likely to be long go out first, those with the
  most tests marked ``slow`` (each starts processes, grades or builds
  something) first of all, so that no long one is left to run alone at the end.

The controller never collects, so the workers write each test's phase to a
file it reads (``phases_file``). Without xdist nothing here is used.
"""
from __future__ import annotations

import json
import os
import re
from collections import deque
from pathlib import Path

from xdist.scheduler import LoadScheduling

LANE_PHASES = ("notebooks", "book", "browser")


def unit_of(nodeid: str) -> str:
    """The pool unit of a test: its module, or its module and Colab-like runtime."""
    module = nodeid.split("::", 1)[0]
    runtime = re.search(r"\[(ipywidgets\d+)", nodeid)
    if module.endswith("test_colab_like.py"):
        # every test that builds on the ipywidgets 8 runtime without naming it joins that unit
        return f"{module}::{runtime.group(1) if runtime else 'ipywidgets8'}"
    return module


def write_phases(path: str, phases: dict[str, str], long_units: dict[str, int]) -> None:
    """``long_units``: the units likely to be long, each with its number of slow tests."""
    tmp = f"{path}.{os.getpid()}"
    Path(tmp).write_text(json.dumps({"phases": phases, "long": long_units}))
    os.replace(tmp, path)


class LaneScheduling(LoadScheduling):
    """xdist scheduler: the lane to the first worker, the pool by units to whoever is free."""

    def __init__(self, config, log=None, phases_file: str = ""):
        super().__init__(config, log)
        self.phases_file = phases_file
        self.units: deque[list[int]] = deque()

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self.check_schedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = next(iter(self.node2collection.values()))
        if not self.collection:
            return
        found = json.loads(Path(self.phases_file).read_text())
        phases, long_units = found["phases"], found["long"]
        self.config._phase_of = phases  # the controller's table of seconds by phase
        lane, grouped = [], {}
        for i, nodeid in enumerate(self.collection):
            if phases.get(nodeid) in LANE_PHASES:
                lane.append(i)
            else:
                grouped.setdefault(unit_of(nodeid), []).append(i)
        # the most slow tests first (stable), then the rest in collection order
        order = sorted(grouped, key=lambda u: -long_units.get(u, 0))
        self.units = deque(grouped[u] for u in order)
        self.pending[:] = [i for unit in self.units for i in unit]
        first, *others = self.nodes
        if lane:
            self._send(first, lane)
        for node in (others if lane else self.nodes):  # a lone worker takes the pool after its lane
            self.check_schedule(node)

    def check_schedule(self, node, duration: float = 0) -> None:
        # A worker holds back its last item until it knows the next one (or is told to stop),
        # so a worker with one item left gets the next unit or shuts down.
        if node.shutting_down or len(self.node2pending[node]) > 1:
            return
        if self.units:
            self._send(node, self.units.popleft())
        else:
            node.shutdown()

    def remove_node(self, node):
        """A worker crashed: what it had not finished goes back to the front of the pool."""
        pending = self.node2pending.pop(node)
        if not pending:
            return None
        crashitem = self.collection[pending.pop(0)]
        if pending:
            self.units.appendleft(pending)
            self.pending[:0] = pending
        for other in self.nodes:
            self.check_schedule(other)
        return crashitem

    def _send(self, node, indices: list[int]) -> None:
        taken = set(indices)
        self.pending[:] = [i for i in self.pending if i not in taken]
        self.node2pending[node].extend(indices)
        node.send_runtest_some(indices)
