"""lessonlib.calc.memory: the formulas exactly, and the measured ledger against them."""
import pytest
import torch

from lessonlib.calc import memory
from lessonlib.book.reports import ledger_table
from lessonlib.measure.memory import MemoryLedger, measure_activations, measure_training_memory
from lessonlib.measure import models
from lessonlib.measure import memory as memory_measure
from lessonlib.calc.memory import activation_bytes_per_layer, training_state_bytes


# ---- calculations: exact integer arithmetic, so exact equality -------------

def test_adam_mixed_is_16_bytes_per_param():
    r = training_state_bytes(7_500_000_000)
    assert r.total == 120_000_000_000
    assert (r.weights, r.gradients, r.master_weights, r.optimizer_state) == (
        15_000_000_000, 15_000_000_000, 30_000_000_000, 60_000_000_000)
    assert memory.bytes_per_param("adam", "bf16_master") == 16


@pytest.mark.parametrize("optimizer,precision,per_param", [
    ("sgd", "fp32", 8), ("momentum", "fp32", 12), ("adam", "fp32", 16),
    ("sgd", "bf16_master", 8), ("momentum", "bf16_master", 12), ("adam", "bf16_master", 16),
])
def test_state_combinations(optimizer, precision, per_param):
    r = training_state_bytes(1000, optimizer, precision)
    assert r.total == per_param * 1000
    assert r.total == r.weights + r.gradients + r.master_weights + r.optimizer_state
    assert r.gradients == r.weights
    assert r.master_weights == (4000 if precision == "bf16_master" else 0)


def test_serving_is_16bit_weights():
    assert memory.serving_bytes(7_500_000_000) == 15_000_000_000


def test_activation_formula():
    s, b, h, a = 2048, 4, 4096, 32
    stored = dict(attention="stored")
    assert activation_bytes_per_layer(s, b, h, a, **stored) == s * b * h * 34 + 5 * a * s * s * b
    assert activation_bytes_per_layer(s, b, h, a, "attention", **stored) == 34 * s * b * h
    assert activation_bytes_per_layer(s, b, h, a, "full", **stored) == 2 * s * b * h
    assert memory.activation_bytes(s, b, h, a, 24, **stored) == 24 * activation_bytes_per_layer(s, b, h, a, **stored)


def test_fused_attention_is_the_default_and_has_no_score_term():
    """Attention is run fused today (SDPA's flash kernel): the 5as/h term is gone by default,
    and the stored-scores case is the explicit historical one."""
    s, b, h, a = 2048, 4, 4096, 32
    for rc in ("none", "attention"):
        assert activation_bytes_per_layer(s, b, h, a, rc) == 34 * s * b * h
        assert activation_bytes_per_layer(s, b, h, a, rc, attention="fused") == 34 * s * b * h
    assert activation_bytes_per_layer(s, b, h, a, "full") == 2 * s * b * h
    # the default does not grow with the square of the sequence length
    assert activation_bytes_per_layer(2 * s, b, h, a) == 2 * activation_bytes_per_layer(s, b, h, a)
    with pytest.raises(ValueError, match="attention"):
        activation_bytes_per_layer(s, b, h, a, attention="flash")


def test_the_7_5b_example_both_ways():
    """The 7.5B preset at 2,048 tokens: 34.4 GB a sequence with stored scores, 10.3 GB fused;
    the batch at which activations pass the 16-bytes-a-parameter state moves from 4 to 12."""
    from lessonlib.calc.planner import PRESETS
    p = PRESETS["7.5B"]
    state = training_state_bytes(p["n_params"]).total
    per_seq = {att: memory.activation_bytes(2048, 1, p["hidden"], p["heads"], p["layers"], attention=att)
               for att in ("stored", "fused")}
    assert round(per_seq["stored"] / 1e9, 1) == 34.4 and round(per_seq["fused"] / 1e9, 1) == 10.3
    cross = {att: next(b for b in range(1, 100) if b * v > state) for att, v in per_seq.items()}
    assert cross == {"stored": 4, "fused": 12}


def test_logits_bytes_and_the_vocabulary():
    """The loss keeps b*s*V logits; Llama 3's s = 8,192, V = 128,256 is 2.1 GB per sequence in bf16."""
    assert memory.logits_bytes(8192, 1, 128_256) == 2 * 8192 * 128_256
    assert round(memory.logits_bytes(8192, 1, 128_256) / 1e9, 1) == 2.1
    assert memory.logits_bytes(8192, 2, 2 * 128_256) == 4 * memory.logits_bytes(8192, 1, 128_256)
    layers = memory.activation_bytes(8192, 1, 4096, 32, 2)
    assert memory.activation_bytes(8192, 1, 4096, 32, 2, vocab=128_256) == layers + 2 * 8192 * 128_256
    for bad in (dict(vocab=0), dict(bytes_per_value=3)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            memory.logits_bytes(**{**dict(seq_len=8, batch=1, vocab=10), **bad})


def test_sequence_parallel_is_an_explicit_convention():
    """Without sequence parallelism (the default) 10sbh stays whole on every device; with it every
    term is divided by t. Pricing uses sequence parallelism, and says so by passing it."""
    from lessonlib.calc import pricing
    s, b, h, a, L = 2048, 1, 4096, 32, 32
    for t in (1, 2, 4, 8):
        sp = activation_bytes_per_layer(s, b, h, a, tensor_parallel=t, attention="stored", sequence_parallel=True)
        assert sp * t == 34 * s * b * h + 5 * a * s * s * b
        assert activation_bytes_per_layer(s, b, h, a, "full", tensor_parallel=t, sequence_parallel=True) * t == \
            2 * s * b * h
    no_sp = activation_bytes_per_layer(s, b, h, a, tensor_parallel=8, attention="stored")
    assert no_sp * 8 == s * b * h * (10 * 8 + 24) + 5 * a * s * s * b
    # pricing's per-device number is the sequence-parallel, stored-scores one (one pipeline stage = all layers)
    assert pricing.activation_bytes_per_device(s, b, h, a, L, tensor=8) == memory.activation_bytes(
        s, b, h, a, L, tensor_parallel=8, attention="stored", sequence_parallel=True)
    with pytest.raises(TypeError, match="sequence_parallel"):
        activation_bytes_per_layer(s, b, h, a, sequence_parallel="yes")


def test_whole_floats_are_counts():
    assert training_state_bytes(7.5e9).total == 120_000_000_000


# ---- bad input: ValueError naming the argument -----------------------------

@pytest.mark.parametrize("kwargs,word", [
    (dict(n_params=0), "n_params"), (dict(n_params=-5), "n_params"), (dict(n_params=2.5), "n_params"),
    (dict(n_params="10"), "n_params"), (dict(n_params=True), "n_params"),
    (dict(n_params=10, optimizer="adamx"), "optimizer"), (dict(n_params=10, precision="fp4"), "precision"),
])
def test_training_state_bad_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        training_state_bytes(**kwargs)


@pytest.mark.parametrize("args,word", [
    ((0, 1, 8, 2), "seq_len"), ((8, -1, 8, 2), "batch"), ((8, 1, 8.5, 2), "hidden"),
    ((8, 1, 8, 0), "heads"), ((8, 1, 8, None), "heads"),
])
def test_activation_bad_input(args, word):
    with pytest.raises(ValueError, match=word):
        activation_bytes_per_layer(*args)


def test_activation_bad_recompute():
    with pytest.raises(ValueError, match="recompute"):
        activation_bytes_per_layer(8, 1, 8, 2, recompute="some")
    with pytest.raises(ValueError, match="layers"):
        memory.activation_bytes(8, 1, 8, 2, layers=0)


def test_bytes_per_param_bad_input():
    with pytest.raises(ValueError, match="optimizer"):
        memory.bytes_per_param("rmsprop")
    with pytest.raises(ValueError, match="precision"):
        memory.bytes_per_param("adam", "int8")


def test_serving_bad_input():
    with pytest.raises(ValueError, match="n_params"):
        memory.serving_bytes(-1)
    with pytest.raises(ValueError, match="bytes_per_weight"):
        memory.serving_bytes(10, bytes_per_weight=0)


# ---- measurement against the formulas --------------------------------------

S, H, A = 64, 128, 4


def _measure(batch=2, layers=2, dtype=torch.bfloat16, dropout_impl="native", opt="adam", track_peak=False):
    torch.manual_seed(0)
    gpt = models.TinyGPT(seq_len=S, hidden=H, heads=A, layers=layers, dropout_impl=dropout_impl).to(dtype)
    x = torch.randn(batch, S, H, dtype=dtype)
    params = gpt.blocks.parameters()
    optimizer = {"adam": lambda: torch.optim.Adam(params), "sgd": lambda: torch.optim.SGD(params, lr=0.1),
                 "momentum": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9)}[opt]()
    # the layers alone (embeddings and loss left out, as in the paper); sum() saves nothing
    return measure_training_memory(gpt.blocks, x, None, lambda out, _: out.float().sum(), optimizer,
                                          track_peak=track_peak)


def test_gradients_equal_weights_exactly():
    led = _measure()
    assert led.gradients == led.weights  # one gradient per weight, same dtype: exact


def test_adam_state_is_twice_weights():
    led = _measure(dtype=torch.float32)
    n_tensors = len(list(models.TinyGPT(seq_len=S, hidden=H, heads=A, layers=2).blocks.parameters()))
    # Adam keeps exp_avg and exp_avg_sq (2 x weights) plus one scalar fp32 `step` tensor per parameter tensor
    assert led.optimizer_state == 2 * led.weights + 4 * n_tensors


def test_optimizer_state_by_method():
    assert _measure(opt="sgd", layers=1).optimizer_state == 0
    led = _measure(opt="momentum", layers=1, dtype=torch.float32)
    assert led.optimizer_state == led.weights  # one fp32 velocity per fp32 weight


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_activations_match_korthikanti(dtype):
    led = _measure(dtype=dtype)
    formula = memory.activation_bytes(S, 2, H, A, layers=2, attention="stored")  # TinyGPT default: math attention
    # 1% tolerance: the paper ignores small tensors that autograd does keep -
    # LayerNorm's mean and rstd, 2 LayerNorms x 2 tensors x s*b 16-bit values per
    # layer: 1024 / (34*s*b*h + 5*a*s^2*b) = 0.15 % of a layer here.
    assert abs(led.activations / formula - 1) < 0.01
    extra = 2 * (4 * S * 2 * 2)  # the same small tensors, byte for byte, for 2 layers
    assert led.activations == formula + extra


def test_nn_dropout_keeps_2_byte_mask():
    native, module = _measure(), _measure(dropout_impl="module")
    # per layer 2 dropouts of s*b*h and one of a*s*s*b elements move from 1 to 2 bytes
    assert module.activations - native.activations == 2 * (2 * S * 2 * H + A * S * S * 2)


def test_activations_linear_in_batch_and_depth():
    base = _measure(batch=1, layers=1).activations
    assert _measure(batch=3, layers=1).activations == 3 * base
    assert _measure(batch=1, layers=3).activations == 3 * base
    assert _measure(batch=2, layers=2).activations == 4 * base


def test_peak_is_reported_and_bounds_state():
    # The CPU peak comes from a private PyTorch tool; on a torch build without
    # it the test says so (skipped) instead of passing with nothing measured.
    pytest.importorskip("torch.distributed._tools.mem_tracker")
    led = _measure(layers=1, track_peak=True)
    assert led.peak is not None
    assert led.peak >= led.weights + led.gradients + led.optimizer_state
    assert _measure(layers=1, track_peak=False).peak is None


def test_peak_memory_sees_a_temporary_of_known_size():
    pytest.importorskip("torch.distributed._tools.mem_tracker")
    from lessonlib.measure.memory import peak_memory

    n = 250_000  # float32: 1,000,000 bytes, freed before fn returns
    result, peak = peak_memory(lambda: float(torch.ones(n).sum()), device="cpu")
    assert result == n
    assert peak.start == 0  # nothing tracked
    # at least the temporary; at most twice it (the sum's tiny result, rounding)
    assert n * 4 <= peak.added <= 2 * n * 4
    held = torch.zeros(n)
    _, peak = peak_memory(lambda: None, device="cpu", track=(held,))
    assert peak.start == peak.peak == n * 4


def test_measure_activations_matches_ledger_and_names_modules():
    torch.manual_seed(0)
    gpt = models.TinyGPT(seq_len=S, hidden=H, heads=A, layers=1).to(torch.bfloat16)
    x = torch.randn(2, S, H, dtype=torch.bfloat16)
    counted = measure_activations(gpt.blocks, x)
    assert counted.bytes == _measure(layers=1).activations  # same counting rule, same model shape
    assert {w for w, *_ in counted.items} >= {"0.ln1", "0.attn", "0.fc1", "0.fc2", "0.drop2"}


def test_sliced_batch_counts_only_its_rows():
    m = models.ForecastMLP(window=4, hidden=8, layers=1)
    data = torch.randn(1000, 4)
    counted = measure_activations(m, data[:10])
    full = measure_activations(m, data[:10].clone())
    assert counted.bytes == full.bytes  # a view of a big dataset tensor costs only its rows


def test_ledger_table_mentions_every_row():
    text = ledger_table(_measure(layers=1))
    for row in ("weights", "gradients", "optimizer_state", "activations", "peak"):
        assert row in text
    # a second step's peak: one more row; the names must match
    one, two = _measure(layers=1), _measure(layers=1)
    text = ledger_table({"a": one}, second={"a": two})
    assert "peak, first step" in text and "peak, second step" in text
    assert text.index("peak, second step") < text.index("peak, first step")  # the typical step leads
    with pytest.raises(ValueError, match="second"):
        ledger_table({"a": one}, second={"b": two})


def test_plot_ledger_has_title_and_units():
    from lessonlib.book import plots

    fig = plots.plot_ledger({"one layer": _measure(layers=1)}, unit="KiB")
    ax = fig.axes[0]
    assert ax.get_title() and "KiB" in ax.get_ylabel() and ax.get_xlabel()
    shown = plots.show(fig, alt="a stacked bar")
    bundle = shown._repr_mimebundle_()
    assert 'alt="a stacked bar"' in bundle["text/html"] and "image/png" in bundle


# ---- saved views of intermediate buffers count whole --------

def _graph_saved_bytes(out, params):
    """An independent count: walk the autograd graph from ``out`` and read each node's
    ``_saved_*`` tensors; sum each storage once, whole, parameters excluded.

    0-dim tensors are skipped: they are Python numbers autograd wrapped (8 bytes
    each), which it keeps without passing through saved_tensors_hooks.
    """
    pkeys = {p.untyped_storage().data_ptr() for p in params}
    storages, stack, visited = {}, [out.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in visited:
            continue
        visited.add(fn)
        for name in dir(fn):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(fn, name)
            except RuntimeError:
                continue
            for t in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(t, torch.Tensor) and t.dim() > 0 and t.numel() > 0:
                    st = t.untyped_storage()
                    if st.data_ptr() not in pkeys:
                        storages[st.data_ptr()] = st.nbytes()
        stack.extend(f for f, _ in fn.next_functions)
    return sum(storages.values())


def _counted_and_graph(module, *args):
    counter = memory_measure.SavedTensorCounter(exclude=list(module.parameters()))
    with counter:
        out = module(*args)
    out = out[0] if isinstance(out, tuple) else out
    return counter.bytes, _graph_saved_bytes(out, module.parameters())


def test_multihead_attention_counts_the_packed_qkv_buffer():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, dropout=0.1, batch_first=True)
    x = torch.randn(4, 16, 64)
    counted, independent = _counted_and_graph(mha, x, x, x)
    assert counted == independent
    # q, k and v are views of one packed projection: the whole buffer (3 x b*s*h floats) is kept
    assert counted >= 3 * 4 * 16 * 64 * 4


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_matches_graph_count(norm_first):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True, norm_first=norm_first)
    x = torch.randn(4, 16, 64)
    counted, independent = _counted_and_graph(layer, x)
    assert counted == independent


def test_float64_lstm_matches_graph_count():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, num_layers=2).double()
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    counted, independent = _counted_and_graph(lstm, x)
    assert counted == independent


# ---- the CPU peak counts tensors only: a lower bound --------

def _allocator_peak(step, live_before):
    """The CPU allocator's peak during ``step()``: bytes live before it plus the largest net
    allocation the profiler's memory events record (they include kernels' scratch buffers)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return live_before + peak


def test_cpu_peak_is_a_lower_bound_of_the_allocator_peak():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3),
                            torch.nn.Flatten(), torch.nn.Linear(16 * 28 * 28, 10))
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    opt = torch.optim.Adam(m.parameters())
    loss_fn = torch.nn.functional.cross_entropy
    measure_training_memory(m, x, y, loss_fn, opt, track_peak=False)  # create Adam's state first
    led = measure_training_memory(m, x, y, loss_fn, opt)
    if led.peak is None:
        pytest.skip("MemTracker is not available in this torch build")
    opt.zero_grad(set_to_none=True)

    def step():
        loss_fn(m(x), y).backward()
        opt.step()

    live = led.weights + led.optimizer_state + x.numel() * x.element_size() + y.numel() * y.element_size()
    allocator = _allocator_peak(step, live)
    # the ledger's CPU peak misses the convolutions' scratch buffers: strictly below the allocator's
    assert led.peak < allocator
    # ...but it is a real measurement of the tensors, not far off (0.70-0.87 measured on such models)
    assert led.peak > 0.5 * allocator
    assert "lower bound" in (measure_training_memory.__doc__ + MemoryLedger.__doc__)
# ---- tensor parallelism (Korthikanti et al.: s*b*h*(10 + 24/t + 5*a*s/(h*t))) ---

def test_tensor_parallel_activation_formula():
    s, b, h, a = 2048, 4, 4096, 32
    st = dict(attention="stored")
    for t in (1, 2, 4, 8, 16, 32):
        assert activation_bytes_per_layer(s, b, h, a, tensor_parallel=t, **st) * t == \
            s * b * h * (10 * t + 24) + 5 * a * s * s * b
        assert activation_bytes_per_layer(s, b, h, a, "attention", tensor_parallel=t, **st) * t == \
            s * b * h * (10 * t + 24)
        assert activation_bytes_per_layer(s, b, h, a, tensor_parallel=t) * t == s * b * h * (10 * t + 24)  # fused
        assert activation_bytes_per_layer(s, b, h, a, "full", tensor_parallel=t, **st) == 2 * s * b * h
        # fp32 activations (4 bytes a value): (4e + 2) = 18 kept whole, 12e = 48 split, (2e + 1) = 9 for the scores
        assert activation_bytes_per_layer(s, b, h, a, bytes_per_value=4, tensor_parallel=t, **st) * t == \
            s * b * h * (18 * t + 48) + 9 * a * s * s * b
    assert activation_bytes_per_layer(s, b, h, a, tensor_parallel=1) == activation_bytes_per_layer(s, b, h, a)
    assert memory.activation_bytes(s, b, h, a, 24, tensor_parallel=8) == 24 * activation_bytes_per_layer(
        s, b, h, a, tensor_parallel=8)


@pytest.mark.parametrize("t", [0, 3, 2.5, True])
def test_tensor_parallel_bad_input(t):
    with pytest.raises(ValueError, match="tensor_parallel"):
        activation_bytes_per_layer(2048, 1, 4096, 32, tensor_parallel=t)


def test_on_a_gpu_cublas_is_warmed_up_before_the_peak_is_read(monkeypatch):
    """The first matmul's cuBLAS workspace (tens of MiB) must not land inside the first step measured:
    with a fake torch.cuda, peak_memory warms the device up before it reads where the step starts."""
    from lessonlib.measure import memory

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: calls.append("allocated") or 40_000_000)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: calls.append("max") or 40_000_500)
    monkeypatch.setattr(memory, "warm_up", lambda d: calls.append(f"warm_up {d}"))
    result, peak = memory.peak_memory(lambda: calls.append("fn") or 7, device="cuda")
    assert result == 7
    order = [calls.index(c) for c in ("warm_up cuda:0", "allocated", "reset", "fn", "max")]
    assert order == sorted(order), calls
    # Nothing tracked: start 0; the 40 MB already on the device (another model, the workspace) is in neither part.
    assert (peak.start, peak.peak) == (0, 500)


def test_warm_up_makes_the_first_matmuls_once_per_device(monkeypatch):
    from lessonlib.measure import memory

    made, real_ones = [], torch.ones

    def ones(*shape, device=None, dtype=None, requires_grad=False):  # a CPU tensor standing in for the GPU's
        made.append((str(device), dtype))
        return real_ones(*shape, requires_grad=requires_grad)

    monkeypatch.setattr(torch, "ones", ones)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(memory, "_WARM", set())
    memory.warm_up("cuda:1")
    memory.warm_up("cuda:1")
    memory.warm_up("cpu")  # nothing to warm up
    assert made == [("cuda:1", torch.float32), ("cuda:1", torch.float16), ("cuda:1", torch.bfloat16)]


def test_tracked_bytes_count_what_the_cpu_tracker_counts():
    """The GPU peak's start: the tracked modules' weights, buffers and gradients, the optimizer's state
    and the inputs, each storage once, on the measured device only."""
    from lessonlib.measure.memory import _tracked_bytes

    model = models.ForecastMLP(window=8, hidden=16, layers=2)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(4, 8)
    w = sum(p.numel() * 4 for p in model.parameters())
    assert _tracked_bytes((model, opt, x, x), torch.device("cpu")) == w + x.numel() * 4
    model(x).sum().backward()
    opt.step()
    state = memory_measure.optimizer_state_bytes(opt)
    assert _tracked_bytes((model, opt, x), torch.device("cpu")) == 2 * w + state + x.numel() * 4
    assert _tracked_bytes((model, opt, x), torch.device("meta")) == 0


# ---- fused attention and the logits, measured ----------

def test_fused_attention_measured_keeps_no_score_term():
    """SDPA (no dropout: on a CPU SDPA with dropout falls back to stored scores) keeps 32 sbh a layer (the paper's
    34 sbh less the two dropout masks), plus LayerNorm statistics and the kernel's fp32 log-sum-exp: linear in seq_len."""
    from lessonlib.measure import activations as acts

    base = dict(batch=2, seq_len=32, layers=2, hidden=64, heads=4)
    got = acts.sweep(base, {"seq_len": [32, 128]}, device="cpu", attention="fused")
    for (_, s), (measured, formula) in got.items():
        b, h, a, layers = 2, 64, 4, 2
        assert formula == layers * 32 * s * b * h  # no dropout masks: the formula of the run measured
        assert measured == formula + layers * (2 * 2 * s * b * 2 + 4 * a * s * b)
    stored = acts.sweep(base, {"seq_len": [128]}, device="cpu", attention="stored")[("seq_len", 128)]
    # the 5as²b term and the two 1-byte dropout masks, 2 layers
    assert stored[1] - got[("seq_len", 128)][1] == 2 * (5 * 4 * 128 * 128 * 2 + 2 * 128 * 2 * 64)
    with pytest.raises(ValueError, match="attention"):
        acts.sweep(base, {"seq_len": [32]}, attention="flash")


@pytest.mark.parametrize("dtype,e", [("bf16", 2), ("fp32", 4)])
def test_the_loss_keeps_its_logits(dtype, e):
    from lessonlib.measure import activations as acts

    kept = acts.loss_activations(batch=2, seq_len=16, vocab=300, dtype=dtype, device="cpu").bytes
    assert kept == memory.logits_bytes(16, 2, 300, bytes_per_value=e) + e  # + the loss's one weight total
    with pytest.raises(ValueError, match="vocab"):
        acts.loss_activations(vocab=2**30)


def test_batch_norm_running_statistics_are_state_not_activations():
    # Batch norm in training mode saves its running mean and variance for backward;
    # they are buffers, held whether or not the model trains, so the activation count leaves them out.
    torch.manual_seed(0)
    channels = 64
    model = torch.nn.Sequential(torch.nn.Linear(8, channels), torch.nn.BatchNorm1d(channels))
    x = torch.randn(4, 8)
    counter = measure_activations(model, x)
    # counted: the Linear's input (4 x 8), its output that batch norm normalises (4 x 64) and the
    # batch's own mean and inverse std (2 x 64); not the running mean and variance
    assert counter.bytes == 4 * (4 * 8 + 4 * channels + 2 * channels)
    y = torch.zeros(4, channels)
    with_loss = measure_activations(model, x, y, torch.nn.functional.mse_loss)
    led = measure_training_memory(model, x, y, torch.nn.functional.mse_loss,
                                  torch.optim.SGD(model.parameters(), lr=0.1), track_peak=False)
    assert led.activations == with_loss.bytes
    # the same model with the buffers counted (the old behaviour) would have counted 2 x 64 x 4 bytes more
    with_buffers = memory_measure.SavedTensorCounter(exclude=list(model.parameters()))
    with with_buffers:
        model(x)
    assert with_buffers.bytes - counter.bytes == 2 * channels * 4


def test_checkpoint_bytes_is_the_state_without_gradients():
    from lessonlib.calc.memory import checkpoint_bytes, training_state_bytes
    s = training_state_bytes(7_500_000_000)
    assert checkpoint_bytes(7_500_000_000) == s.weights + s.master_weights + s.optimizer_state == 105 * 10**9
    assert checkpoint_bytes(10, precision="fp32") == 10 * (4 + 8)  # fp32 weights and Adam's two averages
    assert checkpoint_bytes(10, optimizer="sgd") == 10 * (2 + 4)
    with pytest.raises(ValueError, match="n_params"):
        checkpoint_bytes(0)


def test_llama_layer_constant():
    """The Llama-style constant, term by term against the paper's count of the same tensors."""
    from lessonlib.calc.memory import llama_layer_constant
    s, b, h, a = 2048, 1, 4096, 32
    sbh = s * b * h
    # multi-head attention and SwiGLU at 8h/3 keep exactly what the paper's fused GELU layer keeps without
    # its two 1-byte dropout masks: 3 * 8/3 = 8 = the GELU input plus the second product's input, both 4h wide
    assert llama_layer_constant(a, a) * sbh == activation_bytes_per_layer(s, b, h, a) - 2 * sbh
    # grouped-query attention: K and V shrink by kv_heads / heads, nothing else changes
    assert llama_layer_constant(a, 8) == llama_layer_constant(a, a) - 2 * 2 * (1 - 8 / a)
    assert llama_layer_constant(a, 8, bytes_per_value=4) == 2 * llama_layer_constant(a, 8)
    for kwargs, word in (({"heads": 32, "kv_heads": 5}, "kv_heads"), ({"heads": 32, "kv_heads": 8, "ffn_ratio": 0},
                                                                      "ffn_ratio"),
                         ({"heads": 32, "kv_heads": 8, "bytes_per_value": 1}, "bytes_per_value")):
        with pytest.raises(ValueError, match=word):
            llama_layer_constant(**kwargs)


def test_no_dropout_drops_the_mask_bytes():
    """dropout=False: 32 sbh fused (34 less two 1-byte masks); stored scores keep only the softmax output,
    2as²b (5 less the 1-byte mask and the 2-byte dropped-out scores)."""
    s, b, h, a = 256, 2, 512, 8
    assert activation_bytes_per_layer(s, b, h, a, dropout=False) == 32 * s * b * h
    assert (activation_bytes_per_layer(s, b, h, a, attention="stored")
            - activation_bytes_per_layer(s, b, h, a, attention="stored", dropout=False)) == 2 * s * b * h + 3 * a * s * s * b
    assert activation_bytes_per_layer(s, b, h, a, attention="stored", dropout=False) == 32 * s * b * h + 2 * a * s * s * b
    assert memory.activation_bytes(s, b, h, a, 3, dropout=False) == 3 * 32 * s * b * h
