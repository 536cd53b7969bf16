"""One word per idea: no parameter or dataclass field of lessonlib uses a word that CONTRIBUTING's table refuses.

The table ("One word per idea") gives, per idea, the word and the words it replaces (the "not" column).
Every function of lessonlib (public or private: a worker's ``world`` is the same idea as a formula's
``world_size``) and every class-level field is checked from the source, so no import (and no torch) is needed.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDENTIFIER = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def refused_words() -> dict:
    """``{refused word: the word to use}`` from the "not" column of CONTRIBUTING's table of words."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("### One word per idea", 1)[1].split("\n#", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or set(cells[1]) <= set("-: "):
            continue
        words = IDENTIFIER.findall(cells[1])
        for bad in IDENTIFIER.findall(cells[2]):
            out[bad] = words[0] if words else cells[1]
    return out


def misnamed(source: str, refused: dict) -> list:
    """``(line, what, name)`` for each parameter or class-level field in ``source`` whose name is refused."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
            out += [(node.lineno, f"parameter of {getattr(node, 'name', 'lambda')}", p.arg)
                    for p in params if p.arg in refused]
        elif isinstance(node, ast.ClassDef):
            out += [(st.lineno, f"field of {node.name}", st.target.id) for st in node.body
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id in refused]
    return out


def test_the_table_refuses_the_old_names_of_a_count_of_processes():
    refused = refused_words()
    for old in ("devices", "world", "n_devices", "n_dev", "gpus"):
        assert refused.get(old) == "world_size", (old, refused.get(old))
    assert refused.get("seq") == "seq_len" and refused.get("depth") == "layers" and refused.get("width") == "hidden"


def test_the_check_finds_a_refused_parameter_and_field():
    refused = refused_words()
    src = ("def f(n_bytes, devices):\n    pass\n"
           "class C:\n    world: int\n    world_size: int\n"
           "g = lambda gpus: gpus\n")
    assert {name for _, _, name in misnamed(src, refused)} == {"devices", "world", "gpus"}


def test_no_parameter_or_field_of_lessonlib_uses_a_refused_word():
    refused = refused_words()
    bad = [f"{path.relative_to(ROOT)}:{line}: {what} is `{name}`; the word is `{refused[name]}`"
           for path in sorted((ROOT / "lessonlib").rglob("*.py"))
           for line, what, name in misnamed(path.read_text(), refused)]
    assert not bad, "\n".join(bad)
