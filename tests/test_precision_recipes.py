"""Precision recipes and the one precision vocabulary: calc's bytes per role
against a measured Adam step on the course's GPT, and every public signature speaks the same words."""
import importlib
import inspect
import pkgutil

import pytest
import torch

import lessonlib.book
import lessonlib.calc
import lessonlib.measure
from lessonlib.calc import memory, planner, sharding
from lessonlib.calc.precision import FORMER_NAMES, PRECISIONS, RECIPES, precision_name, recipe
from lessonlib.measure import data, models, precision
from lessonlib.measure.formats import format_range, rounding, use_fp8


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    return models.TinyGPT(seq_len=16, hidden=32, heads=2, layers=1), data.make_tokens(2, 16)


def test_bytes_per_param_of_each_recipe():
    assert {p: recipe(p).bytes_per_param("adam") for p in PRECISIONS} == {
        "fp32": 16, "bf16_master": 16, "bf16_master_fp32_grads": 18, "bf16": 8, "fp16_master": 16, "fp8": 16}
    assert recipe("fp8").activation == 1 and recipe("fp32").activation == 4


@pytest.mark.parametrize("name", PRECISIONS)
def test_measured_ledger_matches_the_recipe_role_by_role(gpt, name):
    model, (tok, tgt) = gpt
    led = precision.measure_recipe(model, tok, tgt, models.lm_loss, name)
    r = recipe(name)
    got = [led.per_param(role) for role in ("weights", "gradients", "master_weights", "optimizer_state")]
    assert got == [r.weights, r.gradients, r.master_weights, r.state_bytes("adam")]
    assert led.state_per_param == r.bytes_per_param("adam")
    assert led.activation_bytes_per_value == r.activation
    assert (led.weights_in_flight > 0) == (name == "fp8")


def test_fp8_products_train_close_to_bf16():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(64, 32, requires_grad=True)
    ref = lin(x)
    ref.square().sum().backward()
    gx, gw = x.grad.clone(), lin.weight.grad.clone()
    x.grad = None
    lin.weight.grad = None
    out = use_fp8(lin)(x)
    out.square().sum().backward()
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()
    # e4m3 keeps 3 mantissa bits (eps 1/8), e5m2 2: products of 32 such values land within ~10 %
    assert rel(out, ref) < 0.1 and rel(x.grad, gx) < 0.2 and rel(lin.weight.grad, gw) < 0.2


def test_range_against_precision():
    f16, b16 = format_range("fp16"), format_range("bf16")
    assert f16.max == 65504 and b16.max > 1e38 and b16.eps > f16.eps  # bf16: range; fp16: precision
    g = torch.full((100,), 2.0 ** -26)  # below half of fp16's smallest subnormal (2^-24)
    assert rounding(g, "fp16").underflow == 1.0 and rounding(g, "bf16").underflow == 0.0
    assert rounding(g * 2.0 ** 12, "fp16").underflow == 0.0  # what a loss scale of 4096 does
    assert rounding(torch.tensor([1e6]), "e4m3", scaled=True).overflow == 0.0
    assert rounding(torch.tensor([1e6]), "e4m3").overflow == 1.0


def test_vocabulary_former_name_and_adamw():
    assert precision_name("mixed") == "bf16_master" and FORMER_NAMES == {"mixed": "bf16_master"}
    assert memory.training_state_bytes(10, "adamw", "bf16").total == 80  # adamw, pure bf16
    assert memory.bytes_per_param("adamw", "bf16_master") == 16
    assert sharding.zero_state_bytes(8, 2, 3, "adam", "bf16").total == 32
    assert planner.plan(1_000_000, "adamw", "bf16", 1, 128, 2, 64, 4).state_bytes == 8_000_000
    with pytest.raises(ValueError, match="precision"):
        planner.plan(1_000_000, "adam", "fp8", 1, 128, 2, 64, 4)  # no one bytes_per_value for FP8 activations
    with pytest.raises(ValueError, match="precision"):
        memory.bytes_per_param("adam", "pure bf16")


def _public_functions():
    for pkg in (lessonlib.calc, lessonlib.measure, lessonlib.book):
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for name, obj in vars(mod).items():
                if not name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                    yield f"{mod.__name__}.{name}", obj


def test_public_signatures_use_the_precision_vocabulary():
    """A parameter that names a precision is called ``precision`` and defaults to one of PRECISIONS."""
    seen = 0
    for where, fn in _public_functions():
        for p in inspect.signature(fn).parameters.values():
            assert p.name not in ("mode", "dtype_mode", "recipe"), f"{where}({p.name}): call it precision"
            if p.name == "precision":
                seen += 1
                assert p.default is inspect.Parameter.empty or p.default in PRECISIONS, where
    assert seen >= 8
    assert tuple(RECIPES) == PRECISIONS



def test_magnitude_histogram_marks_each_formats_smallest_numbers_and_its_zeros():
    """1.4 had no figure on range against precision: a log-axis histogram of the gradients now marks each format's
    smallest normal (solid) and subnormal (dashed) number, names the share each cast turns into 0, and names a format
    whose lines lie far off the axis (bf16) rather than stretching the axis to it."""
    import matplotlib
    matplotlib.use("Agg")
    from lessonlib.book.plots import plot_magnitudes

    g = torch.logspace(-9, -3, 1000) * torch.tensor([1.0, -1.0]).repeat(500)
    names = ("fp16", "bf16", "e4m3")
    zeros = {n: rounding(g, n).underflow for n in names}
    fig = plot_magnitudes(g, {n: format_range(n) for n in names}, zeros)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_title() and "|gradient|" in ax.get_xlabel() and "count" in ax.get_ylabel()
    xs = sorted(line.get_xdata()[0] for line in ax.lines if len(line.get_xdata()))
    assert xs == sorted([format_range("fp16").sub_min, format_range("fp16").normal_min,
                         format_range("e4m3").sub_min, format_range("e4m3").normal_min])  # bf16's: off the axis
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith(f"fp16: {100 * zeros['fp16']:.2f} %") for t in labels)
    assert any(t.startswith("bf16: 0.00 %") and "off the axis" in t for t in labels)
    with pytest.raises(ValueError, match="zeros"):
        plot_magnitudes(g, {"fp16": format_range("fp16")}, {"fp16": 2.0})
    matplotlib.pyplot.close(fig)
