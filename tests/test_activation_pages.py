"""The pages of chapters 1.3, 1.4 and 2.2: their claims agree with what is computed.

Each test reads a page's text source (the file an author edits) and checks one contradiction found in review
stays fixed; the numbers themselves are asserted in the pages' hidden cells, which nbval runs.
"""
import inspect
import re
from pathlib import Path

from lessonlib.measure import recompute

ROOT = Path(__file__).resolve().parents[1]
CH1 = ROOT / "chapters" / "01-forward-vs-training"
CH2 = ROOT / "chapters" / "02-two-checkpoints"


def _say_blocks(path):
    """The rf-strings of the page's say(...) cells."""
    return re.findall(r'say\(rf?"""(.*?)"""\)', path.read_text(), flags=re.S)


def test_the_time_ratio_is_paired_with_the_flops_of_the_configuration_timed():
    """2.2 timed the early-stop step (PyTorch's default) but paired its time with the early-stop-off FLOPs."""
    assert inspect.signature(recompute.time_ratios).parameters.get("early_stop") is None  # times the default...
    assert inspect.signature(recompute.train_step).parameters["early_stop"].default is True  # ...early stop on
    blocks = [b for b in _say_blocks(CH2 / "02-memory-against-compute.md") if "{time_ratio" in b]
    assert blocks
    for b in blocks:
        assert "{early_ratio" in b, b


def test_memory_bound_operations_are_not_called_cheap_per_flop():
    text = (CH2 / "02-memory-against-compute.md").read_text()
    assert "cheap-per-FLOP" not in text
    assert "cheap in FLOPs but expensive per FLOP" in text


def test_a_larger_vocabulary_increases_activation_memory_in_the_quiz():
    text = (CH1 / "03-activations.md").read_text()
    choice = re.search(r'Choice\("a larger vocabulary[^"]*",(.*?)\)\]', text, flags=re.S)
    assert choice and "correct=True" in choice.group(1)


def test_the_7_5b_model_is_stated_at_its_computed_size():
    """The preset named "7.5B" has 7.46 billion parameters: prose prints the computed count to two decimals."""
    for page in (CH1 / "03-activations.md", CH1 / "07-planning.md"):
        text = page.read_text()
        assert "{big_nb:.1f}" not in text and "{big_nb:.2f}" in text, page.name


def test_the_planning_page_counts_its_runs_and_models():
    text = (CH1 / "07-planning.md").read_text()
    assert "Three runs, three failures" not in text and "Three models" not in text
    assert "{n_runs} runs of {n_models} models" in text


def test_both_attention_cases_are_on_the_pages():
    """24.1: the 7.5B example (1.3) and the 1.3B example (1.4) are computed with fused attention and stored scores."""
    act = (CH1 / "03-activations.md").read_text()
    assert 'for att in ("fused", "stored")' in act and 'big_cross["fused"]' in act and 'big_cross["stored"]' in act
    plan = (CH1 / "07-planning.md").read_text()
    assert 'attention="stored"' in plan and "fused attention" in plan


def test_the_planning_page_prints_its_activation_formulas_from_the_calculator():
    """r19: 1.7's text said sbh(32 + 4as/h) + sbh(2 + as/h) while its lines printed sbh(32 + 2as/h) + sbh(2 + 3as/h):
    the constants are now read off memory.activation_bytes_per_layer, and each printed line is checked against them."""
    plan = (CH1 / "07-planning.md").read_text()
    assert "4as/h" not in plan and "2 + as/h" not in plan
    assert "$sbh({c_fused} + {c_score}as/h)$" in plan and "$sbh({d_fused} + {d_score}as/h)$" in plan
    assert "layers == sbh_all * (c_fused + c_score * scores) and drop == sbh_all * (d_fused + d_score * scores)" in plan
    from lessonlib.calc.memory import activation_bytes_per_layer as per_layer
    one = lambda **kw: per_layer(1, 1, 1, 1, **kw)
    assert (one(dropout=False), one() - one(dropout=False)) == (32, 2)
    assert one(attention="stored", dropout=False) - 32 == 2 and one(attention="stored") - one() - 2 == 3
    assert "it is\n  conservative" not in plan and "this page's own\nmeasurement" in plan
