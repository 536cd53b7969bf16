"""One name per recomputation policy: every ``recompute`` argument of lessonlib takes names from
:data:`lessonlib.calc.recompute.RECOMPUTE_POLICIES` and nothing else, and the pages, exercises and
CONTRIBUTING's word table use the same names.

"Selective recomputation" is the family of policies between "none" and "full" (Korthikanti et al.'s
"attention" and the course's "save_matmuls" are two of them, with different memory); as a value it would
name two policies at once, so every function refuses it.
"""

import ast
import re
from pathlib import Path

import pytest
import torch

from lessonlib.calc import layout as layout_mod, layout_search, memory, mfu, planner, pricing, stage_memory
from lessonlib.calc.recompute import RECOMPUTE_POLICIES
from lessonlib.book import reports
from lessonlib.measure import selective

ROOT = Path(__file__).resolve().parents[1]
VOCABULARY = set(RECOMPUTE_POLICIES)

_SMALL = layout_mod.ModelShape("small", 8e9, 32, 4096, 32, 4096, 512, dropout=True)
_BLOCKS = {}


def _gpt():
    if not _BLOCKS:
        _BLOCKS["gpt"] = selective.gpt_blocks(batch=1, seq_len=8, hidden=8, heads=2, layers=1)
    return _BLOCKS["gpt"]


_P = dict(n_params=1e9, layers=16, hidden=2048, heads=16, seq_len=1024)

#: Every public function (or dataclass) of lessonlib with a ``recompute`` argument, called with one name.
CALLS = {
    "calc.memory.activation_bytes_per_layer": lambda rc: memory.activation_bytes_per_layer(64, 1, 64, 4, rc),
    "calc.memory.activation_bytes": lambda rc: memory.activation_bytes(64, 1, 64, 4, 2, rc),
    "calc.mfu.model_hardware_flops": lambda rc: mfu.model_hardware_flops(1e9, 1, 2, 64, 64, recompute=rc),
    "calc.planner.training_flops": lambda rc: planner.training_flops(1e9, 1e3, rc, 64, 64, 2),
    "calc.planner.plan": lambda rc: planner.plan(**_P, recompute=rc),
    "calc.planner.layout": lambda rc: planner.layout(**_P, recompute=rc),
    "calc.planner.propose": lambda rc: planner.propose(**_P, recompute=rc),
    "calc.pricing.activation_bytes_per_device": lambda rc: pricing.activation_bytes_per_device(
        64, 1, 64, 4, 2, recompute=rc),
    "calc.stage_memory.first_stage_activation_bytes": lambda rc: stage_memory.first_stage_activation_bytes(
        64, 64, 4, 2, recompute=rc),
    "calc.layout.Layout": lambda rc: layout_mod.layout_cost(_SMALL, layout_mod.Cluster(64),
                                                            layout_mod.Layout(4, 1, 2, 8, recompute=rc)),
    "calc.layout_search.candidate_layouts": lambda rc: layout_search.candidate_layouts(
        _SMALL, layout_mod.Cluster(64), recompute=(rc,)),
    "calc.layout_search.published_activation_bytes": lambda rc: layout_search.published_activation_bytes(
        recompute=rc),
    "book.reports.plan_html": lambda rc: reports.plan_html("1.3B", "adam", "bf16_master", 1, 1024, rc, 80),
    "measure.selective.forward": lambda rc: selective.forward(*_gpt(), rc),
    "measure.selective.step_flops": lambda rc: selective.step_flops(*_gpt(), rc),
    "measure.selective.kept_after_forward": lambda rc: selective.kept_after_forward(*_gpt(), rc),
    "measure.selective.peak_step_bytes": lambda rc: selective.peak_step_bytes(*_gpt(), rc),
    "measure.selective.compare": lambda rc: selective.compare(*_gpt(), [rc]),
}


def _functions_with_a_recompute_argument() -> set:
    """``"calc.memory.activation_bytes"``-style names of every public def (or class with a ``recompute`` field)."""
    found = set()
    for path in sorted((ROOT / "lessonlib").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT / "lessonlib").with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                names = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if names & {"recompute", "settings"} and "recompute" in ast.unparse(node):
                    found.add(f"{module}.{node.name}")
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                if any(isinstance(st, ast.AnnAssign) and getattr(st.target, "id", None) == "recompute"
                       for st in node.body):
                    found.add(f"{module}.{node.name}")
    return found


def test_every_module_list_of_names_is_part_of_the_one_vocabulary():
    lists = {"memory.RECOMPUTE_CHOICES": memory.RECOMPUTE_CHOICES, "mfu.RECOMPUTE": mfu.RECOMPUTE,
             "layout.RECOMPUTE": layout_mod.RECOMPUTE, "stage_memory.RECOMPUTE": stage_memory.RECOMPUTE,
             "selective.RECOMPUTE": selective.RECOMPUTE, "selective.SETTINGS": selective.SETTINGS,
             "selective.POLICIES": tuple(selective.POLICIES)}
    for name, names in lists.items():
        assert set(names) <= VOCABULARY, (name, set(names) - VOCABULARY)
    assert "selective" not in VOCABULARY
    # the names the layout tools and the measurement share mean one policy: the page's save_matmuls
    assert selective.POLICIES["save_matmuls"] is selective.save_matmuls


def test_the_list_of_calls_covers_every_function_with_a_recompute_argument():
    found = _functions_with_a_recompute_argument()
    missing = found - set(CALLS) - {"calc.planner.Layout", "measure.selective.SelectiveRow",  # results, not inputs
                                    "calc.layout_search.published_layout_cost",  # **settings: Layout's check
                                    "measure.selective.time_ratios", "measure.selective.time_ratio_rounds"}
    assert not missing, f"add these to CALLS: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_recompute_argument_refuses_a_name_outside_the_vocabulary(name):
    for bad in ("selective", "Selective", "attention_core", "some"):
        with pytest.raises(ValueError, match="recompute|settings"):
            CALLS[name](bad)
    taken = []
    for good in RECOMPUTE_POLICIES:
        try:
            CALLS[name](good)
            taken.append(good)
        except ValueError as e:  # a name this function cannot price: refused, and by its name
            assert re.search(r"recompute|settings", str(e)), (name, good, e)
    assert {"none", "full"} <= set(taken), (name, taken)
    torch.manual_seed(0)


def _literal_recompute_values(text: str) -> set:
    """Strings written as a ``recompute`` value in Python source or a page's code: ``recompute="x"``,
    ``recompute == "x"``, ``"recompute": "x"``, ``recompute=("x", "y")``."""
    out = set(re.findall(r"""recompute\s*(?:==|!=|=)\s*["'](\w+)["']""", text))
    out |= set(re.findall(r"""["']recompute["']\s*:\s*["'](\w+)["']""", text))
    for group in re.findall(r"recompute\s*=\s*\(([^()]*)\)", text):
        out |= set(re.findall(r"""["'](\w+)["']""", group))
    return out


def test_the_finder_sees_a_wrong_name():
    assert _literal_recompute_values('f(recompute="selective")\nif layout.recompute == "full":') == \
        {"selective", "full"}
    assert _literal_recompute_values("{'recompute': 'selective'}; g(recompute=('none', 'attention'))") == \
        {"selective", "none", "attention"}


def test_library_pages_and_exercises_write_only_names_of_the_vocabulary():
    files = [*(ROOT / "lessonlib").rglob("*.py"), *(ROOT / "chapters").rglob("*.md"), *(ROOT / "exercises").glob("*.md")]
    bad = {f"{p.relative_to(ROOT)}: {v}" for p in files for v in _literal_recompute_values(p.read_text())
           if v not in VOCABULARY}
    assert not bad, sorted(bad)


def test_the_word_table_names_each_policy_once_and_refuses_selective():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("### One word per idea", 1)[1].split("\n#", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and "recomput" in line.lower()]
    words = [w for row in rows for w in re.findall(r'`"(\w+)"`', row[1])]
    assert sorted(words) == sorted(RECOMPUTE_POLICIES), words
    assert any('`"selective"`' in row[2] for row in rows)
