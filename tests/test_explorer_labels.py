"""Numbers a reader sees in a calculator's controls and a figure's legend are formatted, not Python's repr."""
import matplotlib

matplotlib.use("Agg")

from lessonlib.book.interactive import Explorer


def _labels(explorer, name):
    return [explorer._fmt(v) for v in explorer.controls[name]]


def test_explorer_formats_floats_to_significant_figures():
    e = Explorer(lambda share, n: "output", {"share": [0.0, 9.897494944029668e-06, 0.001, 0.01],
                                                    "n": [1, 16384, 500_000.0]})
    assert _labels(e, "share") == ["0", "9.897e-06", "0.001", "0.01"]
    assert _labels(e, "n") == ["1", "16,384", "500,000"]
    html = e.static_html()
    assert "9.897494944029668e-06" not in html and "500,000.0" not in html


def test_goodput_figure_legend_has_no_trailing_zero(monkeypatch):
    from lessonlib.book import speedup_plots

    seen = []
    real = speedup_plots.plot_goodput_failures
    monkeypatch.setattr(speedup_plots, "plot_goodput_failures",
                        lambda ns, rows, *a, **k: (seen.extend(rows), real(ns, rows, *a, **k))[1])
    speedup_plots.goodput_figure([1, 64, 16384], 1e-5, 60.0, 600.0)
    assert "device MTBF 500,000 h" in seen, seen
    assert not any(".0 h" in label for label in seen), seen


def test_tp_activation_figure_marks_the_degrees_that_cross_nodes():
    from lessonlib.book.split_plots import plot_tp_activations

    fig = plot_tp_activations(2048, 1, 4096, 32, node_size=8)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any(label.startswith("t > 8") and "cross nodes" in label for label in labels), labels
    plain = plot_tp_activations(2048, 1, 4096, 32)
    assert not any("cross nodes" in label for label in plain.axes[0].get_legend_handles_labels()[1])
