"""lessonlib.calc.planner: the two numbers and which of the three failures applies."""
import pytest

from lessonlib.calc import planner
from lessonlib.book.reports import plan_html
from lessonlib.calc.memory import activation_bytes

P7 = dict(n_params=7_500_000_000, layers=32, hidden=4096, heads=32)


def test_state_failure():
    r = planner.plan(**P7, device_bytes=80e9)
    assert r.state_bytes == 120_000_000_000 and r.failure == "state"
    assert "full copy" in r.answer


def test_activation_failure_and_batch():
    r = planner.plan(**P7, batch_per_device=8, seq_len=2048, device_bytes=141e9)
    assert r.activation_bytes == activation_bytes(2048, 8, 4096, 32, 32)
    assert r.failure == "activations" and "smaller batch" in r.answer
    assert r.max_batch_that_fits == (141_000_000_000 - r.state_bytes) // activation_bytes(2048, 1, 4096, 32, 32)


def test_time_failure():
    r = planner.plan(**P7, batch_per_device=1, seq_len=1024, recompute="full", device_bytes=141e9,
                     train_tokens=150_000_000_000, device_flops_per_s=4e14)
    assert r.failure == "time" and "different data" in r.answer
    assert r.days == pytest.approx(6 * 7.5e9 * 150e9 / 4e14 / 86400)


def test_fits():
    r = planner.plan(1000, layers=1, hidden=8, heads=2, seq_len=8, device_bytes=10**9)
    assert r.failure == "none"


def test_training_flops():
    assert planner.training_flops(10, 100) == 6000


@pytest.mark.parametrize("kwargs,word", [
    (dict(n_params=0), "n_params"), (dict(n_params=10, device_bytes=-1), "device_bytes"),
    (dict(n_params=10, optimizer="lion"), "optimizer"), (dict(n_params=10, max_days=0), "max_days"),
    (dict(n_params=10, batch_per_device=0.5), "batch"),
])
def test_bad_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        planner.plan(**kwargs)


def test_training_flops_bad_input():
    with pytest.raises(ValueError, match="tokens"):
        planner.training_flops(10, 0)
    with pytest.raises(ValueError, match="n_params"):
        planner.training_flops(1.5, 10)


def test_bad_rate():
    with pytest.raises(ValueError, match="device_flops_per_s"):
        planner.single_device_seconds(1e20, 0)


def test_plan_html_every_preset():
    for name in planner.PRESETS:
        html = plan_html(name, "adam", "mixed", 1, 1024, "none", 80)
        assert "<table>" in html
    with pytest.raises(ValueError, match="model"):
        plan_html("nope", "adam", "mixed", 1, 1024, "none", 80)
