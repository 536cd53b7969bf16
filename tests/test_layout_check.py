"""The worker that times one tiny model in four layouts on 2 processes (page 3.11).

The two-process run is marked ``slow`` (it starts 2 processes that import torch)."""
import dataclasses

import pytest

from lessonlib.measure.distributed import layout_check
from lessonlib.measure.distributed.launch import WORKER_MODULES


def test_the_worker_module_is_preloaded_by_the_fork_server():
    assert "layout_check" in WORKER_MODULES


@pytest.mark.parametrize("kwargs, name", [(dict(rounds=0), "rounds"), (dict(sweep=(4096,)), "sweep"),
                                          (dict(sweep=(4100, 8192)), "sweep"), (dict(sweep="4096"), "sweep")])
def test_arguments_are_checked_before_any_process_starts(monkeypatch, kwargs, name):
    def no_launch(*a, **k):
        raise AssertionError("launched")

    monkeypatch.setattr(layout_check, "launch", no_launch)
    with pytest.raises((ValueError, TypeError), match=name):
        layout_check.run_layout_check(**kwargs)


@pytest.mark.slow
def test_two_processes_return_every_layouts_rounds():
    r = layout_check.run_layout_check(rounds=1, sweep=(2 ** 12, 2 ** 15), timeout=120)
    assert dataclasses.is_dataclass(r) and r.world_size == 2 and r.rounds == 1
    assert r.model == layout_check.MODEL and r.n_params > 0
    assert set(r.steps) == set(layout_check.LAYOUTS)
    for times in [r.one_process, r.half, *r.steps.values(), *(t for _, t in r.all_reduce)]:
        assert len(times) == 1 and all(t > 0 for t in times)
    assert [n for n, _ in r.all_reduce] == [2 ** 12, 2 ** 15]
