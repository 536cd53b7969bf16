"""lessonlib's layers, read from the source's own imports.

Imports run one way: book -> measure -> calc -> ground (checks, progress).
grading stands apart: nothing imports it, and it imports no other layer at
module level. A module may import its own layer and any layer below it.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lessonlib"
RANK = {"ground": 0, "calc": 1, "measure": 2, "book": 3}
GROUND = {"checks", "progress", "__init__"}
#: Lines of one module above which it should be split (about 400).
MAX_LINES = 420


def layer_of(module: str) -> str:
    """'lessonlib.calc.memory' -> 'calc'; 'lessonlib.checks' -> 'ground'."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in GROUND:
        return "ground"
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path):
    """(imported lessonlib module, line, top-level?) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    me = module_name(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "lessonlib" and name != "lessonlib":
                yield name, node.lineno, id(node) in top


def sources():
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_layers_exist():
    assert {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()} >= {
        "calc", "measure", "book"}


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_run_downwards(path):
    mine = layer_of(module_name(path))
    bad = []
    for name, line, top in imports(path):
        theirs = layer_of(name)
        if theirs == "grading" and mine != "grading":
            bad.append(f"line {line}: {name} (nothing may import grading)")
        elif mine == "grading" and theirs != "grading" and theirs != "ground" and top:
            bad.append(f"line {line}: {name} (grading imports other layers only inside functions)")
        elif mine != "grading" and theirs != "grading" and RANK[theirs] > RANK[mine]:
            bad.append(f"line {line}: {name} ({mine} may not import {theirs})")
    assert not bad, f"{path.relative_to(PKG)} imports upwards:\n" + "\n".join(bad)


def test_the_checker_sees_an_upward_import(tmp_path):
    """The rule is not vacuous: a calc module importing measure is caught."""
    assert layer_of("lessonlib.measure.memory") == "measure"
    assert layer_of("lessonlib.checks") == "ground"
    assert RANK[layer_of("lessonlib.measure.memory")] > RANK[layer_of("lessonlib.calc.memory")]
    found = list(imports(PKG / "calc" / "planner.py"))
    assert ("lessonlib.calc.memory", ) == tuple({n for n, _, _ in found if n.endswith("calc.memory")})


@pytest.mark.parametrize("path", sources(),
                         ids=lambda p: str(p.relative_to(PKG)))
def test_modules_stay_small(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(PKG)} has {n} lines: split it by concept"
