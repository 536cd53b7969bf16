"""No private name crosses a module: a ``_name`` of lessonlib is used only in the module that defines it.

A name another module or a page needs is public (documented, validated) or lives where it is used.
Checked from the source (no import): in lessonlib, ``from .other import _x`` and ``other._x`` where
``other`` is a lessonlib module; on a page (chapters and exercises), any ``_x`` imported from lessonlib
or read off a lessonlib module or object imported from it. Tests may still reach the private names
of the module they test.
"""

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _absolute(module: str | None, level: int, here: str, is_package: bool) -> str:
    if not level:
        return module or ""
    parts = here.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def crossings(source: str, here: str = "", is_package: bool = False) -> list:
    """``(line, text)`` for each private name of another lessonlib module that ``source`` uses.

    ``here`` is the module's dotted name ("" for a page: every lessonlib module is another's).
    """
    tree = ast.parse(source)
    bound = {}  # local name -> the lessonlib module (or object of one) it stands for
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = _absolute(node.module, node.level, here, is_package)
            if not src.startswith("lessonlib"):
                continue
            for alias in node.names:
                full = f"{src}.{alias.name}"
                if _private(alias.name) and src != here:
                    out.append((node.lineno, f"from {src} import {alias.name}"))
                bound[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lessonlib"):
                    bound[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or "lessonlib"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in bound and bound[node.value.id] != here):
            out.append((node.lineno, f"{node.value.id}.{node.attr} ({bound[node.value.id]})"))
    return out


def _module_name(path: Path) -> tuple:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _page_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            # IPython magics and shell lines go; a continued line that begins with "!=" is Python and stays
            lines += [ln for ln in src.splitlines() if not re.match(r"\s*(%|!(?!=))", ln)]
    return "\n".join(lines)


def test_the_check_finds_a_crossing():
    src = ("from .models import _check_tensor, public\n"
           "def f():\n    return _local()\n")
    found = [t for _, t in crossings(src, "lessonlib.measure.precision")]
    assert found == ["from lessonlib.measure.models import _check_tensor"]
    found = [t for _, t in crossings("from . import handout\nhandout._meta(1)\n", "lessonlib.grading.cli")]
    assert found == ["handout._meta (lessonlib.grading.handout)"]
    page = "from lessonlib.measure import recovery as r\nr._batch(8)\nfrom lessonlib.measure.toy_job import _build\n"
    assert len(crossings(page)) == 2
    assert crossings("from .worker import _run_rank\n", "lessonlib.measure.distributed.worker") == []


def test_no_lessonlib_module_uses_another_modules_private_name():
    bad = []
    for path in sorted((ROOT / "lessonlib").rglob("*.py")):
        here, is_package = _module_name(path)
        bad += [f"{path.relative_to(ROOT)}:{line}: {text}" for line, text in crossings(path.read_text(), here, is_package)]
    assert not bad, "private names used across modules (make them public, or move them where they are used):\n" + "\n".join(bad)


def test_no_page_uses_a_private_name_of_lessonlib():
    pages = sorted((ROOT / "chapters").rglob("*.ipynb")) + sorted((ROOT / "exercises").glob("*.ipynb"))
    pages = [p for p in pages if ".ipynb_checkpoints" not in p.parts and "_build" not in p.parts]
    assert pages
    bad = [f"{p.relative_to(ROOT)}: {text}" for p in pages for _, text in crossings(_page_code(p))]
    assert not bad, "private lessonlib names on pages:\n" + "\n".join(bad)
