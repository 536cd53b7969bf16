"""The repository reads on its own: no file points to numbered issues or to design notes that a reader of
the repository does not have (they live outside it, with the people who filed them)."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".sh", ".yml", ".yaml", ".toml", ".cfg", ".js", ".css", ".txt", ""}
#: the word for a filed ticket followed by its number (one or several, with or without "#"), and the design
#: notes' file name; both are built from pieces, so this file passes its own check
WORD = "iss" + "ue"
POINTERS = re.compile(rf"\b{WORD}s? #?\d+|" + "DESIGN" + r"\.md", re.IGNORECASE)


def _tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if Path(n).suffix in SUFFIXES and (ROOT / n).is_file()]


def test_pointer_pattern_finds_what_it_must():
    assert POINTERS.search(f"see {WORD} 26") and POINTERS.search(f"({WORD}s 26 and 27)")
    assert POINTERS.search("see " + "DESIGN" + ".md") and not POINTERS.search(f"an {WORD} of memory")


def test_no_file_points_outside_the_repository():
    found = []
    for path in _tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if POINTERS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "say what the check is for instead of which issue asked for it:\n" + "\n".join(found)


def test_every_public_function_and_class_of_lessonlib_has_a_docstring_first():
    """A docstring is the first statement of every public module-level function and class (a string placed after
    the argument checks is not one: ``help`` shows nothing)."""
    import ast

    missing = []
    for path in sorted((ROOT / "lessonlib").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_") \
                    and ast.get_docstring(node) is None:
                missing.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not missing, "public names without a docstring:\n" + "\n".join(missing)
