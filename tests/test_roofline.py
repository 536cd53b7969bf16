"""Rooflines: the two roofs measured, ops placed by intensity from their shapes, the figure."""
import pytest
import torch

from lessonlib.measure import roofline as R


@pytest.fixture(scope="module")
def roof():
    return R.measure_roofline("cpu", sizes=(16, 64), copy_mib=4, rounds=2)


def test_roofline_measures_two_roofs_and_predicts_their_minimum(roof):
    assert roof.sizes == (16, 64) and roof.peak_flops_per_s == max(roof.matmul_flops_per_s) > 0
    assert roof.bandwidth > 0 and roof.copy_bytes == 4 * 2**20
    ridge = roof.ridge
    assert roof.attainable(ridge / 10) == pytest.approx(roof.bandwidth * ridge / 10)
    assert roof.attainable(ridge * 10) == roof.peak_flops_per_s


def test_block_ops_count_flops_and_bytes_from_shapes(roof):
    ops = {o.name: o for o in R.block_ops(tokens=64, hidden=32, heads=2, seq_len=32)}
    qkv = ops["QKV product"]
    assert qkv.flops == 2 * 64 * 32 * 96 and qkv.bytes_moved == (64 * 32 + 32 * 96 + 64 * 96) * 4
    ln = ops["LayerNorm"]
    assert ln.flops == R.ELEMENTWISE_FLOPS["layer_norm"] * 64 * 32 and ln.bytes_moved == (2 * 64 * 32 + 64) * 4
    # elementwise ops stay below 1 FLOP per byte whatever their size; products grow with their sides
    for name in ("LayerNorm", "GELU", "softmax"):
        assert ops[name].flops / ops[name].bytes_moved < 1
    points = R.measure_ops(list(ops.values()), roof, rounds=2)
    for p in points:  # measured against predicted: the ratio is what the page reports
        assert p.predicted == roof.attainable(p.intensity) and p.ratio == p.measured / p.predicted
        assert p.seconds > 0 and p.intensity == ops[p.name].flops / ops[p.name].bytes_moved


def test_bad_input():
    with pytest.raises(ValueError, match="sizes"):
        R.measure_roofline("cpu", sizes=(4096,))
    with pytest.raises(ValueError, match="heads"):
        R.block_ops(tokens=64, hidden=30, heads=4, seq_len=32)
    with pytest.raises(TypeError, match="roofline"):
        R.measure_ops(R.block_ops(tokens=64, hidden=32, heads=2, seq_len=32), roofline=None)


def test_roofline_figure_is_log_log_with_labelled_axes(roof):
    from lessonlib.book.roofline_plots import plot_roofline

    points = R.measure_ops(R.block_ops(tokens=64, hidden=32, heads=2, seq_len=32), roof, rounds=1)
    fig = plot_roofline(roof, points)
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "FLOPs per byte" in ax.get_xlabel() and "GFLOP/s" in ax.get_ylabel() and ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(p.name in labels for p in points)
    # every point is also named beside itself, so overlapping points (QKV and MLP products) can be told apart
    assert sorted(t.get_text() for t in ax.texts) == sorted(p.name for p in points)
    # beside another device: a second panel with its (bf16) roof as a share of its peak, every op under it; the
    # roof measured here in fp32 stays in the first panel, not drawn beside the ops' bf16 intensities
    from lessonlib.calc import hardware
    h100 = hardware.device("H100 SXM 80GB")
    other = plot_roofline(roof, points, compare=h100).axes[1]
    assert other.get_xscale() == other.get_yscale() == "log" and "peak" in other.get_ylabel()
    assert len(other.collections) == len(points) and len(other.lines) == 1
    assert "bf16" in other.lines[0].get_label() and "bf16" in other.get_xlabel()
    assert "attainable, not measured" in other.get_title()  # the points lie on the roof by construction
    shares = [c.get_offsets()[0][1] for c in other.collections]
    # the other device's peak is for bf16: each op sits at its bf16 intensity, twice the fp32 one measured here
    assert shares == [min(1.0, h100.memory_bandwidth * 2 * p.intensity / h100.peak_flops_per_s) for p in points]
    assert [c.get_offsets()[0][0] for c in other.collections] == [2 * p.intensity for p in points]
    with pytest.raises(TypeError, match="compare"):
        plot_roofline(roof, points, compare="H100")


def test_the_flat_roof_is_the_fastest_square_and_the_blocks_products_are_timed_beside_it():
    """The roof was the fastest of the squares and the block's products, so the block's fastest product reached
    1.00 of it by definition. The roof is now the fastest square, measured apart from the products placed under
    it, which are still timed in the same rounds (the same load)."""
    ops = R.block_ops(tokens=64, hidden=32, heads=2, seq_len=32)
    products = [o for o in ops if o.name.endswith("product")]
    roof = R.measure_roofline("cpu", sizes=(16,), copy_mib=4, rounds=2, products=products)
    assert set(roof.products) == {o.name for o in products}
    assert roof.peak_flops_per_s == max(roof.matmul_flops_per_s)
    with pytest.raises(TypeError, match="products"):
        R.measure_roofline("cpu", sizes=(16,), copy_mib=4, rounds=1, products=[1])


def test_measure_ops_reuses_the_roofs_timing_of_a_product_rather_than_timing_it_again():
    """1.5 timed each block product twice (in the roof's rounds and again in measure_ops) and showed two speeds."""
    ops = R.block_ops(tokens=64, hidden=32, heads=2, seq_len=32)
    products = [o for o in ops if o.name.endswith("product")]
    roof = R.measure_roofline("cpu", sizes=(16,), copy_mib=4, rounds=2, products=products)
    points = {p.name: p for p in R.measure_ops(ops, roof, rounds=1)}
    for o in products:  # the same time, hence the same FLOP/s, as the roof's table shows
        assert points[o.name].seconds == roof.product_times[o.name][1]
        assert points[o.name].measured == pytest.approx(roof.products[o.name], rel=1e-12)
    # an op of the same name but another size is not the one the roof timed: it is timed afresh
    other = R.block_ops(tokens=128, hidden=32, heads=2, seq_len=32)
    qkv = next(p for p in R.measure_ops(other[:1], roof, rounds=1))
    assert qkv.seconds != roof.product_times["QKV product"][1] and qkv.flops == 2 * 128 * 32 * 96


def test_rooflines_page_leaves_the_checkpointed_step_to_chapter_2_and_states_the_partial_block():
    """1.5 timed a checkpointed step with chapter 2's model and early stop before either was taught, and 2.2
    timed the same again: 1.5 now keeps the roofline's side (the memory-bound ops' time share against their FLOP
    share) and links to 2.2 for the step."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "chapters/01-forward-vs-training/05-rooflines.md").read_text()
    assert "a little less than a whole forward" not in text and "early_recomputed" not in text
    assert "recompute.time_ratios" not in text and "use_reentrant" not in text and "re-timed here" not in text
    assert "(../02-two-checkpoints/02-memory-against-compute.ipynb)" in text and "assert time_share > flops_share" in text
    assert "part of a transformer block (no weighted sum of values" in text and "A 8,192" not in text
    assert "FlashAttention later moved" not in text  # both date from 2022: Megatron adopted it later


def test_a_cpu_copy_has_a_bound_that_names_copy_mib():
    """A copy of gigabytes on a CPU took seconds a round and measured the same bandwidth: refused at once."""
    import pytest

    with pytest.raises(ValueError, match="copy_mib: at most 256 on a CPU"):
        R.measure_roofline("cpu", sizes=(16,), copy_mib=257, rounds=1)


def test_bf16_intensity_is_twice_the_fp32_one_and_checks_its_point():
    from types import SimpleNamespace

    from lessonlib.book.roofline_plots import bf16_intensity

    assert bf16_intensity(SimpleNamespace(intensity=36.5)) == 73.0
    for bad in (SimpleNamespace(intensity=0), SimpleNamespace(intensity=float("nan")), None):
        with pytest.raises((ValueError, TypeError), match="point.intensity"):
            bf16_intensity(bad)


def test_no_two_point_names_overlap_in_the_roofline_figure():
    """Last build's figure drew "GELU" over "LayerNorm": two points of the same speed a little apart in intensity.
    These points repeat that layout (and the QKV and MLP products on one spot); every name's box, as the renderer
    draws it, must stay clear of every other name and of every point, in the wide figure and in the phone one."""
    import itertools

    import matplotlib
    matplotlib.use("Agg")
    from lessonlib.book.figures import for_phone
    from lessonlib.book.roofline_plots import plot_roofline
    from lessonlib.calc import hardware

    roof = R.Roofline((16, 64), (5e9, 9e10), 9e10, 3.2e10, 2**22)
    spots = {"QKV product": (70, 9.0e10), "MLP product": (74, 8.9e10), "64 × 64 product": (11, 7e10),
             "attention scores": (16, 6.3e10), "16 × 16 product": (2.7, 6.5e9), "LayerNorm": (0.85, 1.75e10),
             "GELU": (0.62, 1.75e10), "softmax": (0.62, 9.2e9)}
    points = [R.OpPoint(name, 1, 1, 1e-9, x, y, roof.attainable(x)) for name, (x, y) in spots.items()]
    for phone in (False, True):
        fig = plot_roofline(roof, points, compare=hardware.device("H100 SXM 80GB"))
        if phone:
            assert for_phone(fig)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
        assert sorted(boxes) == sorted(spots)
        for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
            assert not box_a.overlaps(box_b), (phone, a, b)
        marks = [ax.transData.transform((x / 1, y / 1e9)) for x, y in spots.values()]
        for name, box in boxes.items():
            assert not any(box.x0 < mx < box.x1 and box.y0 < my < box.y1 for mx, my in marks), (phone, name)
        matplotlib.pyplot.close(fig)


def test_each_point_name_lies_beside_its_own_point():
    """A reader saw "GELU" above LayerNorm's point and "LayerNorm" below GELU's, and "64 × 64 product" nearer the
    attention scores than its own triangle: each name's box must lie beside its own point (within 10 pt) and
    clearly nearer it than any other point, but one on (nearly) the same spot (the QKV and MLP products)."""
    import matplotlib
    import numpy as np
    matplotlib.use("Agg")
    from lessonlib.book.roofline_plots import plot_roofline
    from lessonlib.calc import hardware

    roof = R.Roofline((16, 64), (5e9, 9e10), 9e10, 3.2e10, 2**22)
    layouts = [  # the layout of the test above, and one close to the page's CPU run the reader saw
        {"QKV product": (70, 9.0e10), "MLP product": (74, 8.9e10), "64 × 64 product": (11, 7e10),
         "attention scores": (16, 6.3e10), "16 × 16 product": (2.7, 6.5e9), "LayerNorm": (0.85, 1.75e10),
         "GELU": (0.62, 1.75e10), "softmax": (0.62, 9.2e9)},
        {"QKV product": (72, 8.8e10), "MLP product": (75, 8.9e10), "64 × 64 product": (10.5, 6.5e10),
         "attention scores": (16, 5.5e10), "16 × 16 product": (2.7, 4.6e9), "LayerNorm": (0.87, 1.85e10),
         "GELU": (0.62, 2.0e10), "softmax": (0.62, 9.8e9)}]

    def gap(box, x, y):
        return np.hypot(max(box.x0 - x, 0, x - box.x1), max(box.y0 - y, 0, y - box.y1))

    for spots in layouts:
        points = [R.OpPoint(name, 1, 1, 1e-9, x, y, roof.attainable(x)) for name, (x, y) in spots.items()]
        fig = plot_roofline(roof, points, compare=hardware.device("H100 SXM 80GB"))
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax, px = fig.axes[0], renderer.points_to_pixels(1.0)
        marks = {name: ax.transData.transform((x, y / 1e9)) for name, (x, y) in spots.items()}
        one_spot = 1.5 * 40 ** 0.5 * px  # the markers are 40 pt² (a side of 6.3 pt)
        for t in ax.texts:
            name, box = t.get_text(), t.get_window_extent(renderer)
            own = gap(box, *marks[name])
            assert own <= 10 * px, (name, own / px)
            for other, mark in marks.items():
                if other != name and np.hypot(*(mark - marks[name])) > one_spot:
                    assert gap(box, *mark) >= own + 3 * px, (name, other)
        matplotlib.pyplot.close(fig)


def test_streaming_ops_run_beyond_the_cache_into_outputs_allocated_once(monkeypatch):
    """1.5 said LayerNorm, GELU and softmax are memory-bound but timed them on tensors that fit in a cache.
    measure_streaming times them on twice the last-level cache (256 MiB where unknown) beside a copy."""
    monkeypatch.setattr(R, "last_level_cache_bytes", lambda device=None: 2**20)  # a 1 MiB cache: a 2 MiB tensor
    run = R.measure_streaming("cpu", hidden=64, rounds=1)
    assert run.tensor_bytes == 2 * 2**20 and run.cache_bytes == 2**20 and run.bandwidth > 0
    assert set(run.rates) == set(run.flops_per_s) == {"LayerNorm", "GELU", "softmax"}
    for name, rate in run.rates.items():  # bytes and FLOPs of one pass, so FLOP/s = bytes/s x intensity
        flops = R.ELEMENTWISE_FLOPS[{"LayerNorm": "layer_norm", "GELU": "gelu", "softmax": "softmax"}[name]]
        assert run.flops_per_s[name] == pytest.approx(rate * flops / 8) and run.share(name) == rate / run.bandwidth
    with pytest.raises(ValueError, match="hidden"):
        R.measure_streaming("cpu", hidden=0)


def test_the_64_by_64_name_stays_beside_its_marker_on_its_side_of_the_ridge():
    """Readers found "64 × 64 product" hung left of its point, reaching to the ridge line, far from its marker
    (the attention scores' point below-right ruled out its right side). A name that reaches across the ridge from
    its point now ranks before one placed further off: this one sits over its marker."""
    import matplotlib
    matplotlib.use("Agg")
    from lessonlib.book.roofline_plots import plot_roofline
    from lessonlib.calc import hardware

    roof = R.Roofline((16, 512), (6.6e9, 9.5e10), 9.5e10, 3.98e10, 2**26)  # this page's CPU run, as the readers saw it
    spots = {"QKV product": (69.8, 9.7e10), "MLP product": (73.1, 9.8e10), "attention scores": (16, 6.5e10),
             "64 × 64 product": (10.7, 7.9e10), "16 × 16 product": (2.7, 6.8e9), "LayerNorm": (0.87, 1.86e10),
             "GELU": (0.62, 1.97e10), "softmax": (0.62, 9.85e9)}
    points = [R.OpPoint(n, 1, 1, 1e-9, x, y, roof.attainable(x)) for n, (x, y) in spots.items()]
    fig = plot_roofline(roof, points, compare=hardware.device("H100 SXM 80GB"))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    ridge = ax.transData.transform((roof.ridge, 1))[0]
    name = next(t for t in ax.texts if t.get_text() == "64 × 64 product")
    box = name.get_window_extent(renderer)
    x, y = ax.transData.transform((spots["64 × 64 product"][0], spots["64 × 64 product"][1] / 1e9))
    assert ridge < box.x0 and box.x0 <= x <= box.x1 or abs(box.x0 - x) < 12  # beside or over its marker
    assert min(abs(box.y0 - y), abs(box.y1 - y)) < 12 or box.y0 <= y <= box.y1
    matplotlib.pyplot.close(fig)
