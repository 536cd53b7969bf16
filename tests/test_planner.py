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
    assert r.activation_bytes == activation_bytes(2048, 8, 4096, 32, 32, dropout=False)
    assert r.failure == "activations" and "smaller batch" in r.answer
    # the default reserve keeps 10 % of the device back: the batch must fit in the rest
    assert r.usable_bytes == 141_000_000_000 - 14_100_000_000
    assert r.max_batch_that_fits == (r.usable_bytes - r.state_bytes) // activation_bytes(2048, 1, 4096, 32, 32, dropout=False)
    ideal = planner.plan(**P7, batch_per_device=8, seq_len=2048, device_bytes=141e9, reserve=0)
    assert ideal.max_batch_that_fits == (141_000_000_000 - r.state_bytes) // activation_bytes(2048, 1, 4096, 32, 32, dropout=False)


def test_the_reserve_can_turn_a_fit_into_a_failure():
    # a state of 120 GB: it fits a 125 GB device with no reserve, not with the default 10 % kept back
    kw = dict(**P7, batch_per_device=1, seq_len=8, device_bytes=125e9)
    assert planner.plan(**kw, reserve=0).failure == "none"
    assert planner.plan(**kw).failure == "state"
    assert planner.plan(**kw).reserve_bytes == 12_500_000_000
    assert planner.propose(**kw)[0].fits_memory is False and planner.propose(**kw, reserve=0)[0].fits_memory


@pytest.mark.parametrize("reserve", [-0.1, 1, 1.5, float("nan"), "10%", True])
def test_the_reserve_is_checked(reserve):
    with pytest.raises((ValueError, TypeError), match="reserve"):
        planner.plan(**P7, reserve=reserve)


def test_time_failure():
    r = planner.plan(**P7, batch_per_device=1, seq_len=1024, recompute="full", device_bytes=141e9,
                     train_tokens=150_000_000_000, device_flops_per_s=4e14)
    assert r.failure == "time" and "different data" in r.answer
    # full recomputation: 8 x parameters x tokens (one more forward pass than 6 N T)
    assert r.days == pytest.approx(8 * 7.5e9 * 150e9 / 4e14 / 86400)


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
        html = plan_html(name, "adam", "bf16_master", 1, 1024, "none", 80)
        assert "<table>" in html
    with pytest.raises(ValueError, match="model"):
        plan_html("nope", "adam", "bf16_master", 1, 1024, "none", 80)


# --- precision, recomputation's time, presets' shapes ---

def test_precision_changes_the_activations_and_the_state_breakdown():
    kw = dict(batch_per_device=2, seq_len=2048, device_bytes=400e9, attention="stored", dropout=True)
    mixed = planner.plan(**P7, precision="bf16_master", **kw)
    fp32 = planner.plan(**P7, precision="fp32", **kw)
    # Adam: 2+2+4+8 = 4+4+0+8 = 16 bytes/param either way, so the state total is the same...
    assert mixed.state_bytes == fp32.state_bytes
    # ...but fp32 activations take 4 bytes a value (dropout masks stay 1 byte): 66 sbh + 9 as^2b per layer
    s, b, h, a, L = 2048, 2, 4096, 32, 32
    assert mixed.activation_bytes == L * (34 * s * b * h + 5 * a * s * s * b)
    assert fp32.activation_bytes == L * (66 * s * b * h + 9 * a * s * s * b)
    assert fp32.max_batch_that_fits < mixed.max_batch_that_fits
    # fused attention (the default) keeps no scores: 34 sbh and 66 sbh
    kw["attention"] = "fused"
    assert planner.plan(**P7, precision="bf16_master", **kw).activation_bytes == L * 34 * s * b * h
    assert planner.plan(**P7, precision="fp32", **kw).activation_bytes == L * 66 * s * b * h
    # without dropout (the default, today's pretraining, page 1.3's count): the two 1-byte masks go, 32 sbh
    kw.pop("dropout")
    assert planner.plan(**P7, precision="bf16_master", **kw).activation_bytes == L * 32 * s * b * h
    # SGD: mixed keeps 2 + 2 + 4 master = 8, fp32 4 + 4 = 8: the same total; the breakdown differs
    html_m = plan_html("1.3B", "adam", "bf16_master", 8, 1024, "none", 80)
    html_f = plan_html("1.3B", "adam", "fp32", 8, 1024, "none", 80)
    assert "master copy 4" in html_m and "no master copy" in html_f
    assert "2 bytes per value" in html_m and "4 bytes per value" in html_f


def test_every_explorer_combination_differs_between_mixed_and_fp32():
    """The planner page's 432 combinations: mixed and fp32 never give the same report."""
    import itertools

    for model, opt, batch, seq, rec, dev in itertools.product(
            planner.PRESETS, ["adam", "sgd"], [1, 8, 64], [1024, 4096], ["none", "attention", "full"], [24, 80, 141]):
        assert plan_html(model, opt, "bf16_master", batch, seq, rec, dev) != plan_html(model, opt, "fp32", batch, seq, rec, dev)


def test_fp32_can_fail_where_mixed_fits():
    # 1.3B, batch 4 of 2048 tokens on 80 GB: fits in mixed precision, not in fp32
    pr = planner.PRESETS["1.3B"]
    args = dict(batch_per_device=4, seq_len=2048, layers=pr["layers"], hidden=pr["hidden"], heads=pr["heads"],
                device_bytes=80e9, attention="stored")
    assert planner.plan(pr["n_params"], precision="bf16_master", **args).failure == "none"
    assert planner.plan(pr["n_params"], precision="fp32", **args).failure == "activations"


def test_recomputation_adds_its_forward_to_the_time():
    kw = dict(**P7, batch_per_device=1, seq_len=2048, device_bytes=141e9, train_tokens=150_000_000_000,
              device_flops_per_s=4e14)
    none = planner.plan(**kw, recompute="none")
    full = planner.plan(**kw, recompute="full")
    sel = planner.plan(**kw, recompute="attention", attention="stored")
    # full recomputation: forward 2 + recomputed forward 2 + backward 4 = 8 N T instead of 6 N T
    assert full.days / none.days == pytest.approx(8 / 6)
    assert full.flops == 8 * 7.5e9 * 150e9
    # selective: only the attention scores, 4 s h FLOPs per token and layer (about 2.7 % here)
    assert sel.flops - none.flops == pytest.approx(4 * 2048 * 4096 * 32 * 150e9)
    assert 1.02 < sel.days / none.days < 1.04
    # under a fused attention kernel (the default) the scores are recomputed already: selective changes nothing
    fused_sel = planner.plan(**kw, recompute="attention")
    assert (fused_sel.flops, fused_sel.activation_bytes) == (none.flops, none.activation_bytes)
    html_none = plan_html("7.5B", "adam", "bf16_master", 1, 1024, "none", 141)
    html_full = plan_html("7.5B", "adam", "bf16_master", 1, 1024, "full", 141)
    assert "one forward pass recomputed" in html_full and html_none != html_full


def test_presets_count_matches_shape():
    for name, pr in planner.PRESETS.items():
        n = planner.transformer_params(pr["layers"], pr["hidden"], positions=1024 if "GPT-2" in name else 2048)
        assert pr["n_params"] == n
        # the name is the count, rounded to its leading two digits
        stated = float(name.split()[0].rstrip("MB")) * (1e6 if name.split()[0].endswith("M") else 1e9)
        assert abs(n / stated - 1) < 0.05, (name, n)
        assert pr["hidden"] % pr["heads"] == 0
    # GPT-2 small's published count
    assert planner.PRESETS["124M (GPT-2 small)"]["n_params"] == 124_439_808


def test_training_flops_selective_needs_the_shape():
    with pytest.raises(ValueError, match="seq_len"):
        planner.training_flops(10, 100, recompute="attention")
    with pytest.raises(ValueError, match="recompute"):
        planner.training_flops(10, 100, recompute="some")


# ---- the smallest change that fits (propose) --------------------------------

from itertools import product

from lessonlib.calc.memory import activation_bytes
from lessonlib.calc.planner import DEVICE_COUNTS, TP_DEGREES, layout, propose
from lessonlib.calc.sharding import zero_state_bytes


def _shape(name):
    p = planner.PRESETS[name]
    return dict(n_params=p["n_params"], layers=p["layers"], hidden=p["hidden"], heads=p["heads"])


def test_a_plan_that_fits_needs_no_change():
    out = propose(**_shape("124M (GPT-2 small)"), batch_per_device=8, seq_len=1024, device_bytes=24e9)
    assert len(out) == 1 and out[0].fits and out[0].change == ""


def test_activations_that_do_not_fit_get_a_smaller_micro_batch_first():
    shape = _shape("1.3B")
    kw = dict(batch_per_device=8, seq_len=4096, device_bytes=80e9, attention="stored", dropout=True)  # 2022's case
    plan_, fix = propose(**shape, **kw)
    assert not plan_.fits_memory and fix.fits_memory and fix.world_size == 1 and fix.recompute == "none"
    assert (fix.accumulation, fix.change) == (8, "micro-batch 1, gradient accumulation × 8")
    assert fix.activation_bytes == activation_bytes(4096, 1, shape["hidden"], shape["heads"], shape["layers"],
                                                    attention="stored")
    assert fix.days == plan_.days  # the same FLOPs
    # the largest micro-batch that divides the batch and fits: 7 of 14 (8 would fit, but does not divide 14)
    pr = _shape("124M (GPT-2 small)")
    big = dict(batch_per_device=14, seq_len=4096, device_bytes=24e9, precision="fp32", reserve=0, dropout=True)  # whole device
    assert planner.plan(**pr, **big).max_batch_that_fits == 8
    assert propose(**pr, **big)[1].accumulation == 2


def test_activations_that_do_not_fit_at_any_micro_batch_get_recomputation():
    shape = _shape("1.3B")
    out = propose(**shape, batch_per_device=2, seq_len=8192, device_bytes=80e9, attention="stored")
    plan_, fix = out
    assert not plan_.fits_memory and fix.fits_memory
    assert (fix.world_size, fix.recompute, fix.change) == (1, "attention", "attention-core recomputation (Korthikanti's selective)")
    assert fix.activation_bytes == activation_bytes(8192, 2, shape["hidden"], shape["heads"], shape["layers"],
                                                    "attention", dropout=False)  # the attention core rebuilt: no score term either way
    assert fix.state_bytes == plan_.state_bytes  # recomputation leaves the state alone


def _brute_force_fewest_devices(shape, **kw):
    """The fewest devices of any layout in the search space that fits in memory (None if none)."""
    for d in (1,) + DEVICE_COUNTS:
        for t, z, rc in product((1,) + TP_DEGREES, range(4), ("none", "attention", "full")):
            if d % t or (z and d // t < 2) or shape["heads"] % t or shape["hidden"] % t:
                continue
            if layout(**shape, **kw, recompute=rc, world_size=d, zero_stage=z, tensor_parallel=t).fits_memory:
                return d
    return None


@pytest.mark.parametrize("name,batch,seq,gb", [("7.5B", 1, 2048, 80), ("70B", 1, 4096, 80), ("70B", 8, 2048, 141),
                                               ("1.3B", 16, 4096, 24), ("7.5B", 8, 4096, 24)])
def test_the_proposal_uses_the_fewest_devices_that_can_fit(name, batch, seq, gb):
    shape = _shape(name)
    kw = dict(batch_per_device=batch, seq_len=seq, device_bytes=gb * 1e9)
    out = propose(**shape, **kw)
    fewest = _brute_force_fewest_devices(shape, **kw)
    assert fewest is not None and out[1].fits_memory and out[1].world_size == fewest
    # its numbers are the formulas' for that layout
    fix = out[1]
    assert fix.state_bytes == zero_state_bytes(-(-shape["n_params"] // fix.tensor_parallel),
                                               fix.world_size // fix.tensor_parallel, fix.zero_stage).total
    assert fix.activation_bytes == activation_bytes(seq, batch, shape["hidden"], shape["heads"], shape["layers"],
                                                    fix.recompute, tensor_parallel=fix.tensor_parallel,
                                                    dropout=False)


def test_nothing_tried_fits_is_said():
    shape = _shape("1.3B")
    kw = dict(batch_per_device=64, seq_len=4096, device_bytes=24e9)  # even t = 8 with full recomputation: too big
    out = propose(**shape, **kw)
    assert _brute_force_fewest_devices(shape, **kw) is None
    assert out[-1].change == "nothing tried fits" and not out[-1].fits_memory


def test_a_state_that_fits_nowhere_alone_is_sharded():
    out = propose(**_shape("7.5B"), batch_per_device=1, seq_len=2048, device_bytes=80e9, world_size=4)
    assert out[1].world_size == 4 and out[1].zero_stage in (1, 2, 3)  # no new devices needed: shard over the four


def test_too_slow_gets_the_smallest_device_count():
    shape = _shape("7.5B")
    kw = dict(batch_per_device=1, seq_len=2048, device_bytes=141e9, recompute="full",
              train_tokens=20 * shape["n_params"], device_flops_per_s=4e14, max_days=30)
    out = propose(**shape, **kw)
    assert out[0].fits_memory and not out[0].fits_time
    last = out[-1]
    assert last.fits and last.days <= 30 and last.world_size / 2 * last.days > 30  # half as many would be too slow
    assert last.days == pytest.approx(out[0].days / last.world_size)


def test_layout_bad_input():
    shape = _shape("1.3B")
    with pytest.raises(ValueError, match="tensor_parallel"):
        layout(**shape, world_size=6, tensor_parallel=4)
    with pytest.raises(ValueError, match="world_size"):
        layout(**shape, world_size=0)
    with pytest.raises(ValueError, match="stage"):
        layout(**shape, world_size=2, zero_stage=4)
    with pytest.raises(ValueError, match="recompute"):
        propose(**shape, recompute="some")
    with pytest.raises(ValueError, match="recompute"):  # unhashable: once a raw TypeError (the deep fuzz)
        propose(**shape, recompute=[])


# --- attention as it is run, the logits, the tensor-parallel convention ---

def test_the_planner_takes_the_conventions_explicitly():
    """Fused attention is the default; stored scores, sequence parallelism and the loss's logits are arguments."""
    shape = _shape("7.5B")
    kw = dict(batch_per_device=2, seq_len=2048, device_bytes=400e9)
    fused = planner.plan(**shape, **kw)
    stored = planner.plan(**shape, **kw, attention="stored")
    assert fused.activation_bytes == activation_bytes(2048, 2, shape["hidden"], shape["heads"], shape["layers"],
                                                      dropout=False)  # no dropout by default
    # stored scores without dropout keep the softmax output: 2 bytes a score
    assert stored.activation_bytes - fused.activation_bytes == shape["layers"] * 2 * shape["heads"] * 2048 ** 2 * 2
    masked = planner.plan(**shape, **kw, attention="stored", dropout=True)  # dropout: its masks and copy too
    assert masked.activation_bytes == activation_bytes(2048, 2, shape["hidden"], shape["heads"], shape["layers"],
                                                       attention="stored")
    with_logits = planner.plan(**shape, **kw, vocab=planner.GPT2_VOCAB)
    assert with_logits.activation_bytes - fused.activation_bytes == 2 * 2048 * 2 * planner.GPT2_VOCAB
    # sequence parallelism: the same layout gives every activation byte / t
    no_sp = layout(**shape, **kw, world_size=8, tensor_parallel=8, attention="stored")
    sp = layout(**shape, **kw, world_size=8, tensor_parallel=8, attention="stored", sequence_parallel=True)
    assert sp.activation_bytes * 8 == stored.activation_bytes < no_sp.activation_bytes * 8
    with pytest.raises(TypeError, match="sequence_parallel"):
        planner.plan(**shape, **kw, sequence_parallel=1)
    with pytest.raises(ValueError, match="attention"):
        planner.plan(**shape, **kw, attention="flash")


def test_pricing_and_the_planner_agree_once_the_convention_is_the_same():
    """1.43 GB against 2.32 GB came from two conventions; passed explicitly they agree."""
    from lessonlib.calc import pricing

    shape = _shape("7.5B")
    kw = dict(batch_per_device=1, seq_len=2048, device_bytes=80e9, world_size=8, tensor_parallel=8)
    per_device = pricing.activation_bytes_per_device(2048, 1, shape["hidden"], shape["heads"], shape["layers"], 8)
    lay = layout(**shape, **kw, attention="stored", sequence_parallel=True, dropout=True)
    assert lay.activation_bytes == per_device
    assert layout(**shape, **kw, attention="stored", dropout=True).activation_bytes > per_device  # the default: no SP  # the default: no SP


@pytest.mark.parametrize("t", [3, 5, 64])
def test_the_tensor_parallel_degree_divides_the_heads_everywhere(t):
    shape = dict(n_params=10**9, layers=4, hidden=960, heads=12)  # 3 divides both; 5 and 64 do not divide 12
    if shape["heads"] % t == 0 and shape["hidden"] % t == 0:
        assert layout(**shape, world_size=t, tensor_parallel=t).tensor_parallel == t
        return
    with pytest.raises(ValueError, match="tensor_parallel"):
        layout(**shape, world_size=t, tensor_parallel=t)
    from lessonlib.calc import pricing
    with pytest.raises(ValueError, match="tensor"):
        pricing.activation_bytes_per_device(128, 1, 960, 12, 4, tensor=t)


def test_propose_checks_its_arguments_once_however_many_layouts_it_tries(monkeypatch):
    """Validate once, at the entry point: the planner's own checks of n_params (and of every argument)
    do not repeat along the search; internal calls (_plan, _layout, _training_flops) trust their caller."""
    calls = []
    for name in ("check_count", "check_positive", "check_choice", "check_flag"):
        real = getattr(planner, name)
        monkeypatch.setattr(planner, name, lambda arg, *a, _real=real, **k: calls.append(arg) or _real(arg, *a, **k))
    kw = dict(batch_per_device=1, seq_len=2048, device_bytes=80e9, train_tokens=10**9, device_flops_per_s=1e14)
    small = planner.propose(**_shape("124M (GPT-2 small)"), **kw)
    n_small, calls[:] = list(calls), []
    big = planner.propose(**_shape("70B"), **kw)  # does not fit: the search tries many layouts
    assert len(small) == 1 and len(big) >= 2 and big[1].fits_memory
    assert calls.count("n_params") == 1 and calls == n_small  # the same checks, once each, whatever the search
