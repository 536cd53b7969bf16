"""CONTRIBUTING's list of registration places stays true: each place exists, every registry of pages or
functions in the code is on the list, and every page of the book has a row in its index."""
import ast
import re
from pathlib import Path

import pytest

from conftest import toc_files

ROOT = Path(__file__).resolve().parents[1]
SECTION = "### Where a new page, worker or function is registered"


def listed() -> set:
    """``(file, NAME)`` pairs named in CONTRIBUTING's registration table."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    table = text.split(SECTION, 1)[1].split("\n\n", 2)[1]
    pairs = set()
    for row in table.splitlines()[2:]:
        cell = row.split("|")[2]
        for m in re.finditer(r"`([\w./-]+\.(?:py|yml|md))`((?:,? `[A-Za-z_]+`)*)", cell):
            names = re.findall(r"`([A-Za-z_]+)`", m.group(2)) or [None]
            pairs.update((m.group(1), n) for n in names)
    return pairs


def module_constants(path: Path) -> dict:
    """Module-level ``NAME = literal`` assignments of a Python file, as ``{NAME: [every string inside]}``."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name) and t.id.isupper() and node.value is not None:
                out[t.id] = [n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return out


def test_the_table_is_found_and_every_place_on_it_exists():
    pairs = listed()
    assert len(pairs) >= 10, pairs
    for file, name in pairs:
        path = ROOT / file
        assert path.exists(), f"CONTRIBUTING lists {file}, which does not exist"
        if name is None or file.endswith(".md"):
            continue
        if file.endswith(".yml"):
            assert re.search(rf"^{name}:", path.read_text(), re.M), f"{file} has no {name}"
        else:
            assert name in module_constants(path), f"CONTRIBUTING lists {file} {name}, which is not defined there"


PAGE = re.compile(r"(chapters/|exercises/)?\d\d-[\w-]+\.ipynb|chapters/\d\d-")
FUNCTION = re.compile(r"^lessonlib(\.\w+){3,}$")  # lessonlib.<package>.<module>.<function>


def test_every_registry_of_pages_or_functions_is_on_the_list():
    pairs = {(f, n) for f, n in listed()}
    found = []
    for path in sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "lessonlib").rglob("*.py")]):
        for name, strings in module_constants(path).items():
            # a registry lists several pages or functions (a constant naming one page is a test's subject)
            if sum(bool(PAGE.search(s)) or bool(FUNCTION.match(s)) for s in strings) >= 2:
                found.append((str(path.relative_to(ROOT)), name))
    assert {("tests/test_fuzz_api.py", "DENY"), ("tests/test_compat.py", "HIDDEN_PAGES")} <= set(found)
    missing = [f"{f} {n}" for f, n in found if (f, n) not in pairs]
    assert not missing, f"registries not listed in CONTRIBUTING ({SECTION[4:]}): {missing}"


def test_the_check_finds_a_registry_that_is_not_listed(tmp_path):
    planted = tmp_path / "test_x.py"
    planted.write_text('PAGES_TO_SKIP = ["chapters/03-x/05-y.ipynb", "chapters/03-x/06-z.ipynb"]\n'
                       'DENIED = {"lessonlib.calc.x.run": "why", "lessonlib.measure.y.go": "why"}\n')
    consts = module_constants(planted)
    assert sum(bool(PAGE.search(s)) for s in consts["PAGES_TO_SKIP"]) == 2
    assert sum(bool(FUNCTION.match(s)) for s in consts["DENIED"]) == 2


@pytest.mark.parametrize("page", [f for f in toc_files() if re.match(r"\d\w-", f.rsplit("/", 1)[1])])
def test_every_page_has_a_row_in_its_index(page):
    folder, name = page.rsplit("/", 1)
    index = (ROOT / folder / "index.md").read_text()
    assert re.search(rf"[(<]{re.escape(name)}(\.ipynb)?[)>]", index), f"{folder}/index.md has no row for {name}"


def test_the_map_of_lessonlib_names_every_module():
    """CONTRIBUTING's table of layers names every module of lessonlib, so a newcomer finds where a concept lives."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    table = [line for line in text.splitlines() if re.match(r"\| (ground|calc|measure|book|grading) \|", line)]
    assert len(table) == 5
    named = set(re.findall(r"`(\w+)(?:\.py)?`", " ".join(table)))
    modules = {p.stem for p in (ROOT / "lessonlib").rglob("*.py") if not p.name.startswith("__")}
    assert not modules - named, f"modules missing from CONTRIBUTING's map of lessonlib: {sorted(modules - named)}"
