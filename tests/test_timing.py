"""lessonlib.measure.timing: FLOP ratios (deterministic) and the shape of the timing result (never absolute times)."""
import pytest
import torch
import torch.nn.functional as F

from lessonlib.measure import data
from lessonlib.measure import models
from lessonlib.measure import timing
from lessonlib.book.reports import timing_table


def test_gpt_backward_is_twice_forward():
    g = models.TinyGPT(vocab=64, seq_len=32, hidden=64, heads=4, layers=2)
    x, y = data.make_tokens(2, 32, vocab=64)
    fc = timing.count_flops(g, x, y, models.lm_loss)
    # every matrix product in a GPT needs both its weight and its input gradient:
    # exact, FlopCounterMode counts integers
    assert fc.backward == 2 * fc.forward
    assert fc.ratio == 3.0


def test_gpt_forward_flops_formula():
    s, b, h, L, V = 32, 2, 64, 2, 64
    g = models.TinyGPT(vocab=V, seq_len=s, hidden=h, heads=4, layers=L)
    x, y = data.make_tokens(b, s, vocab=V)
    fc = timing.count_flops(g, x, y, models.lm_loss)
    # per layer: 24 b s h^2 (qkv, proj, MLP) + 4 b s^2 h (scores, weighted sum); output layer 2 b s h V
    assert fc.forward == L * (24 * b * s * h * h + 4 * b * s * s * h) + 2 * b * s * h * V


def test_mlp_ratio_first_layer_needs_no_input_grad():
    m = models.ForecastMLP(window=28, hidden=64, layers=2)
    X, y = data.make_forecast_dataset(window=28, n_stores=2, n_days=100)
    fc = timing.count_flops(m, X, y, F.mse_loss)
    linears = [l for l in m.modules() if isinstance(l, torch.nn.Linear)]
    per_layer = [2 * X.shape[0] * l.in_features * l.out_features for l in linears]
    # backward = weight grads (= forward) + input grads for every layer but the first,
    # whose input is data: ratio = 3 - first/forward, exactly
    assert fc.forward == sum(per_layer)
    assert fc.backward == 2 * fc.forward - per_layer[0]
    assert fc.ratio == pytest.approx(3 - per_layer[0] / fc.forward, rel=1e-12)  # float division only
    assert fc.ratio < 3


def test_time_training_step_structure():
    m = models.ForecastMLP(window=8, hidden=16)
    X, y = data.make_forecast_dataset(window=8, n_stores=1, n_days=80)
    opt = torch.optim.Adam(m.parameters())
    t = timing.time_training_step(m, X, y, F.mse_loss, opt, rounds=5, warmup=1)
    assert set(t.seconds) == {"prediction", "forward", "loss", "backward", "optimizer", "step"}
    assert all(len(v) == 5 for v in t.rounds.values())
    assert all(v > 0 for v in t.seconds.values())
    assert t.ratios["prediction"] == 1.0
    # shares are medians of per-round fractions, each in (0, 1); no claim on absolute time
    assert all(0 < s < 1 for s in t.shares.values())
    assert "step" in timing_table(t)


def test_time_training_step_alternates_the_prediction_before_and_after_the_step():
    """Page 1.1 compares the training forward with a prediction: neither may always come first."""
    m = models.ForecastMLP(window=8, hidden=16)
    modes = []
    m.register_forward_pre_hook(lambda mod, args: modes.append("train" if mod.training else "eval"))
    X, y = data.make_forecast_dataset(window=8, n_stores=1, n_days=40)
    timing.time_training_step(m, X, y, F.mse_loss, torch.optim.SGD(m.parameters(), lr=0.01), rounds=4, warmup=0)
    assert modes == ["eval", "train", "train", "eval"] * 2


def test_time_training_step_bad_input():
    m = models.ForecastMLP(window=8, hidden=16)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="rounds"):
        timing.time_training_step(m, torch.zeros(2, 8), torch.zeros(2, 1), F.mse_loss, opt, rounds=0)
    with pytest.raises(ValueError, match="warmup"):
        timing.time_training_step(m, torch.zeros(2, 8), torch.zeros(2, 1), F.mse_loss, opt, warmup=-1)


def test_plot_timing_draws_the_measured_medians():
    from lessonlib.book import plots

    m = models.ForecastMLP(window=8, hidden=16)
    X, y = data.make_forecast_dataset(window=8, n_stores=1, n_days=40)
    t = timing.time_training_step(m, X, y, F.mse_loss, torch.optim.SGD(m.parameters(), lr=0.01), rounds=3, warmup=1)
    fig = plots.plot_timing({"mlp": t})
    ax = fig.axes[0]
    assert ax.get_title() and "ms" in ax.get_ylabel() and ax.get_xlabel()
    # two bars: prediction alone, then the four phases stacked; their tops are the page's one account of the
    # step (each phase's median per-round ratio x the median prediction), in milliseconds
    tops = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    assert tops[0] == pytest.approx(1e3 * t.account["prediction"], rel=1e-9)
    assert tops[1] == pytest.approx(1e3 * t.account["step"], rel=1e-9)
    assert t.account["step"] == pytest.approx(sum(t.account[p] for p in timing.PHASES), rel=1e-12)
    plots.show(fig, alt="timing bars")
    # in units of the prediction: the bars are the ratios the table prints (prediction 1, the step its ratio)
    ax = plots.plot_timing({"mlp": t}, unit="x prediction").axes[0]
    tops = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    assert "prediction" in ax.get_ylabel()
    assert tops[0] == pytest.approx(t.ratios["prediction"], rel=1e-9)
    assert tops[1] == pytest.approx(t.ratios["step"], rel=1e-9)


def test_time_rounds_interleaves_and_takes_ratios_within_a_round():
    from lessonlib.measure.rounds import Rounds, time_rounds

    calls = []

    def one_round(clock):
        calls.append("round")
        clock.time("short", sum, range(10))
        with clock("long"):
            sum(range(100_000))
        clock.add("fixed", 2.0)

    ticks = []
    r = time_rounds(one_round, rounds=4, warmup=2, device="cpu", after_round=lambda: ticks.append(1))
    assert len(calls) == 6 and len(ticks) == 6          # warm-up rounds run, then are dropped
    assert {k: len(v) for k, v in r.seconds.items()} == {"short": 4, "long": 4, "fixed": 4}
    assert r.median("fixed") == 2.0
    assert r.ratio("long", "long") == 1.0
    # a ratio is the median of per-round ratios, not a ratio of medians
    made = Rounds({"a": [1.0, 2.0, 10.0], "b": [1.0, 4.0, 1.0]})
    assert made.ratio("a", "b") == 1.0 and made.median("a") / made.median("b") == 2.0
    # several processes: per round, the slowest
    merged = Rounds.slowest([{"a": [1.0, 5.0]}, Rounds({"a": [3.0, 2.0]})])
    assert merged.seconds == {"a": [3.0, 5.0]}
    with pytest.raises(ValueError, match="rounds"):
        time_rounds(one_round, rounds=0)
    with pytest.raises(ValueError, match="warmup"):
        time_rounds(one_round, rounds=1, warmup=-1)


# ---- count_flops names what it cannot count -----------------

def test_count_flops_counts_linear_models_without_warning():
    import warnings

    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = timing.count_flops(m, torch.randn(3, 4))
    assert c.uncounted == () and c.forward == 2 * 3 * (4 * 8 + 8 * 1)


def test_count_flops_names_the_mkldnn_lstm_and_ratio_is_a_clear_error():
    lstm = torch.nn.LSTM(8, 16)

    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = lstm

        def forward(self, x):
            return self.lstm(x)[0]

    x = torch.randn(5, 3, 8)
    with pytest.warns(timing.UncountedFlopsWarning, match="rnn"):
        c = timing.count_flops(Out(), x)
    assert any("rnn" in name for name in c.uncounted)
    if c.forward == 0:  # the mkldnn kernel: nothing counted, and no ZeroDivisionError
        with pytest.raises(ValueError, match="no forward FLOPs"):
            c.ratio
    with pytest.raises(ValueError, match="no FLOP formula"):
        timing.count_flops(Out(), x, strict=True)


def test_count_flops_names_cpu_flash_attention():
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, q):
            q = self.proj(q)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    q = torch.randn(2, 4, 16, 8)
    with pytest.warns(timing.UncountedFlopsWarning, match="attention"):
        c = timing.count_flops(Attn(), q)
    assert any("attention" in name for name in c.uncounted)
    assert c.forward > 0  # the projection is still counted


def test_count_flops_names_transformer_encoder_fast_path():
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2,
                                      enable_nested_tensor=False).eval()
    for p in enc.parameters():
        p.requires_grad_(False)  # eval + nothing needs a gradient: PyTorch takes the fused fast path
    x = torch.randn(2, 5, 32)
    with pytest.warns(timing.UncountedFlopsWarning, match="transformer_encoder_layer"):
        c = timing.count_flops(enc, x)  # inference: counted (and named), no backward
    assert c.inference and c.backward == 0


# ---- uncounted ops found without keywords; inference counted ------------------------

@pytest.mark.parametrize("n", [5, 40])  # torch.cdist takes _cdist_forward for small inputs, _euclidean_dist above
def test_count_flops_names_cdist_whatever_its_kernel(n):
    class Dist(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(3, 3)

        def forward(self, x):
            y = self.proj(x)
            return torch.cdist(y, y)

    with pytest.warns(timing.UncountedFlopsWarning, match="dist"):
        c = timing.count_flops(Dist(), torch.randn(n, 3))
    assert any("dist" in name for name in c.uncounted) and c.forward == 2 * n * 3 * 3


def test_flop_free_ops_are_not_reported_and_an_unknown_op_is():
    from lessonlib.measure import data, models

    torch.manual_seed(0)
    tok, tgt = data.make_tokens(2, 16)
    import warnings
    for kw in (dict(attention="math"), dict(dropout_impl="module")):  # the course's GPT: nothing uncounted
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            c = timing.count_flops(models.TinyGPT(seq_len=16, hidden=32, heads=2, layers=1, **kw), tok, tgt,
                                   models.lm_loss)
        assert c.uncounted == ()
    # an op the registry lacks and FLOP_FREE_OPS does not list is reported, whatever its name
    assert "pdist" not in timing.FLOP_FREE_OPS
    with pytest.warns(timing.UncountedFlopsWarning, match="pdist"):
        t = timing.tally_flops(torch.nn.functional.pdist, torch.randn(6, 4))
    assert t.flops == 0 and t.uncounted


def test_count_flops_counts_inference_in_eval_under_no_grad():
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).eval()
    with torch.no_grad():
        c = timing.count_flops(m, torch.randn(3, 4))
    assert c.inference and c.forward == 2 * 3 * (4 * 8 + 8 * 1) and c.backward == 0 and c.ratio == 1.0


def test_moe_dispatch_is_flop_free_and_the_count_is_the_matrix_products():
    # 3.4 counts a top-2 mixture-of-experts layer: its dispatch (indexing, index_add back into place) is
    # data movement and additions, listed as FLOP-free, so no warning leaks onto the page, and the count is
    # exactly the matrix products' 6 x active parameters x tokens
    import warnings
    from lessonlib.calc.experts import active_parameters
    from lessonlib.calc.planner import training_flops
    from lessonlib.measure.routing import MoELayer
    torch.manual_seed(0)
    hidden, experts, k, tokens = 16, 4, 2, 64
    moe = MoELayer(hidden, experts=experts, top_k=k)
    x = torch.randn(tokens, hidden, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", timing.UncountedFlopsWarning)
        flops = timing.count_flops(moe, (x,))
    assert flops.uncounted == ()
    per_expert = sum(p.numel() for p in moe.experts[0].parameters())
    router = sum(p.numel() for p in moe.router.parameters())
    n_active = active_parameters(shared=router, per_expert=per_expert, top_k=k, experts=experts)
    assert flops.total == training_flops(n_active, tokens)
    for op in ("index_add", "index_put"):
        assert op in timing.FLOP_FREE_OPS


def test_the_step_is_the_sum_of_its_phases_in_every_column():
    """Medians do not add up: a table whose step was the median of per-round sums disagreed with its phases
    (5.14 ms of phases against an 8.71 ms step). The account adds up in seconds, predictions and shares."""
    from lessonlib.measure.rounds import Rounds

    m = models.ForecastMLP(window=8, hidden=16)
    X, y = data.make_forecast_dataset(window=8, n_stores=1, n_days=80)
    t = timing.time_training_step(m, X, y, F.mse_loss, torch.optim.Adam(m.parameters()), rounds=5, warmup=1)
    phases = ("forward", "loss", "backward", "optimizer")
    assert t.ratios["step"] == pytest.approx(sum(t.ratios[k] for k in phases), rel=1e-12)
    assert sum(t.shares.values()) == pytest.approx(1, rel=1e-12)
    a = t.account
    assert a["step"] == pytest.approx(sum(a[k] for k in phases), rel=1e-12)
    assert a["step"] / a["prediction"] == pytest.approx(t.step_over_prediction, rel=1e-12)
    for k in phases:  # each phase: the median of its per-round ratios, the course's one statistic
        assert t.ratios[k] == Rounds(t.rounds).ratio(k, "prediction")


def test_round_median_is_the_statistic_its_quartiles_bracket():
    # 1.1 printed the step as the sum of its phases' medians (4.40) beside the quartiles of each round's
    # step ratio (4.49 to 12.85): a median below its own lower quartile. round_median is the median they bracket.
    from lessonlib.measure.timing import StepTiming

    rounds = {"prediction": [1.0] * 4, "forward": [1.0, 1.0, 5.0, 5.0], "loss": [0.0] * 4,
              "backward": [5.0, 5.0, 1.0, 1.0], "optimizer": [0.0] * 4, "step": [6.0, 6.0, 6.0, 6.0]}
    t = StepTiming(seconds={}, ratios={"step": 6.0}, shares={}, rounds=rounds)
    lo, hi = t.quartiles("step")
    assert lo <= t.round_median("step") <= hi
    assert t.round_median("forward") == 3.0
