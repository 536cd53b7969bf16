"""Rewrite chapter notebooks so one page reads the same in the book, Jupyter and Colab.

    python scripts/pages.py chapters/*/*.ipynb     # rewrite in place (idempotent)
    python scripts/pages.py --check chapters/*/*.ipynb

What it does to each notebook:

- every myst-nb ``{glue}`` role in a Markdown cell goes: the paragraph (or list,
  or table) that carries it becomes a hidden code cell whose *output* is that
  Markdown, written as ``say(rf"...")`` (``lessonlib.book.say``). The
  ``glue("name", expr)`` calls become plain assignments ``name = expr`` at the top
  of the first prose cell that reads them (or in a hidden cell right after, when
  code in between could change what they read). A number the introduction states
  before any code runs is computed in its prose cell from ``lessonlib.calc`` (EARLY);
- in a visible cell, trailing lines that only feed the prose (arithmetic on results,
  no calls) move with the glue; trailing ``print``/``display`` lines move to a hidden
  "Show the results" cell (their output stays); trailing drawing (``show``,
  ``plot_*``, ``*_figure``) to a hidden "Draw the figure" cell; ``assert`` statements
  (and loops of them) to a hidden "Check what the text claims" cell. Calls that
  measure stay in sight;
- quiz and prediction cells, prose cells, check cells, the imports cell, figure cells
  and calculators are hidden in all three places (:func:`hide`): the book's
  ``remove-input``/``hide-input`` tag, ``metadata.jupyter.source_hidden``
  (JupyterLab, Notebook 7) and a first line ``# @title ...`` with
  ``metadata.cellView = "form"`` (Colab).

Running it again changes nothing (``--check`` says so).
``tests/test_pages.py`` checks the result on every chapter notebook.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import nbformat

ROLE = re.compile(r"\{glue(?::text|:)?\}`([A-Za-z_][A-Za-z0-9_]*)(?::([^`]*))?`")
QUIZ_CALLS = ("Prediction", "SingleChoice", "MultipleSelect", "Numeric")
SAY_IMPORT = "from lessonlib.book import say"
BOOK_TAGS = ("remove-input", "hide-input", "remove-cell")
#: Numbers a page states (in its introduction) before any of its code has run: the prose cell
#: computes them itself, from the same lessonlib formula the page later measures against.
EARLY = {
    "six": ("from lessonlib.calc.planner import training_flops", "training_flops(1, 1)"),
    "bpp": ("from lessonlib.calc.memory import bytes_per_param", 'bytes_per_param("adam", "mixed")'),
    "b_total": ("from lessonlib.calc.memory import training_state_bytes", "training_state_bytes(1).total"),
    "b_w": ("from lessonlib.calc.memory import training_state_bytes", "training_state_bytes(1).weights"),
    "b_g": ("from lessonlib.calc.memory import training_state_bytes", "training_state_bytes(1).gradients"),
    "b_m": ("from lessonlib.calc.memory import training_state_bytes", "training_state_bytes(1).master_weights"),
    "b_o": ("from lessonlib.calc.memory import training_state_bytes", "training_state_bytes(1).optimizer_state"),
}


# --- hiding -----------------------------------------------------------------

def hidden(cell) -> bool:
    """True if the cell is hidden by any of the three mechanisms."""
    tags = cell.metadata.get("tags", [])
    return (any(t in tags for t in BOOK_TAGS) or cell.metadata.get("jupyter", {}).get("source_hidden")
            or cell.metadata.get("cellView") == "form" or cell.source.startswith("# @title"))


def hide(cell, title: str, tag: str = "remove-input") -> None:
    """Hide a code cell's input in the book (``tag``), JupyterLab/Notebook 7 and Colab."""
    if not cell.source.startswith("# @title"):
        cell.source = f"# @title {title}\n{cell.source}"
    tags = [t for t in cell.metadata.get("tags", []) if t not in BOOK_TAGS]
    cell.metadata["tags"] = tags + [tag]
    cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    cell.metadata["cellView"] = "form"


def code(source: str, title: str, tag: str = "remove-input"):
    cell = nbformat.v4.new_code_cell(source)
    hide(cell, title, tag)
    return cell


# --- Markdown -> say(...) -------------------------------------------------

def blocks(md: str) -> list[str]:
    """Split Markdown into blank-line separated blocks, keeping fenced blocks whole."""
    out, cur, fence = [], [], None
    for line in md.split("\n"):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
            cur.append(line)
            continue
        if fence is None and not line.strip():
            if cur:
                out.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur:
        out.append("\n".join(cur))
    return out


def to_fstring(md: str) -> tuple[str, list[str]]:
    """The Markdown as the body of an rf-string, and the names its roles read."""
    names, parts, pos = [], [], 0
    for m in ROLE.finditer(md):
        parts.append(md[pos:m.start()].replace("{", "{{").replace("}", "}}"))
        name, spec = m.group(1), m.group(2)
        names.append(name)
        parts.append("{" + name + (f":{spec}" if spec else "") + "}")
        pos = m.end()
    parts.append(md[pos:].replace("{", "{{").replace("}", "}}"))
    body = "".join(parts)
    if '"""' in body or body.endswith('"'):
        raise ValueError(f"prose block ends in or holds a triple quote: {md[:80]!r}")
    return body, names


def split_markdown(cell) -> list[tuple[str, str]]:
    """[("md", text) | ("say", text)] pieces: headings and plain blocks stay Markdown."""
    pieces: list[tuple[str, str]] = []
    for block in blocks(cell.source):
        kind = "say" if ROLE.search(block) else "md"
        if kind == "say":
            lines = block.split("\n")
            head = []
            while lines and lines[0].startswith("#"):
                head.append(lines.pop(0))
            if head:
                pieces.append(("md", "\n".join(head)))
            block = "\n".join(lines)
        if pieces and pieces[-1][0] == kind:
            pieces[-1] = (kind, pieces[-1][1] + "\n\n" + block)
        else:
            pieces.append((kind, block))
    return pieces


# --- code cells ---------------------------------------------------------------

def _is_call(stmt, names) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in names)


def loads(src: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def stores(src: str) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
    return out


def _is_check(stmt) -> bool:
    """An ``assert``, or a loop that only asserts."""
    if isinstance(stmt, ast.Assert):
        return True
    return (isinstance(stmt, ast.For) and not stmt.orelse and any(_is_check(b) for b in stmt.body)
            and all(_is_check(b) or isinstance(b, ast.Assign) for b in stmt.body))


def extract(src: str):
    """Split a code cell into (kept source, [(glue name, expr, comment)], [assert sources])."""
    tree = ast.parse(src)
    lines = src.split("\n")
    drop = set()
    glues, asserts = [], []
    by_line: dict[int, list] = {}
    for stmt in tree.body:
        by_line.setdefault(stmt.lineno, []).append(stmt)
    for lineno, stmts in by_line.items():
        kinds = ["glue" if _is_call(s, {"glue"}) else "assert" if _is_check(s) else "other" for s in stmts]
        if "other" in kinds or len(set(kinds)) > 1:
            if "glue" in kinds or "assert" in kinds:
                raise ValueError(f"line {lineno} mixes glue/assert with other code: {lines[lineno - 1]!r}")
            continue
        last = stmts[-1]
        tail = lines[last.end_lineno - 1][last.end_col_offset:]
        comment = tail[tail.index("#"):] if "#" in tail else ""
        span = range(stmts[0].lineno, last.end_lineno + 1)
        # Comment lines right above a moved statement move with it.
        above = []
        k = stmts[0].lineno - 1
        while k >= 1 and lines[k - 1].strip().startswith("#") and k not in drop:
            above.insert(0, lines[k - 1].strip())
            k -= 1
        if kinds[0] == "glue":
            for s in stmts:
                name = s.value.args[0].value
                expr = ast.get_source_segment(src, s.value.args[1])
                if "\n" in expr:
                    expr = f"({expr})"
                glues.append((name, expr, comment if s is last else ""))
        else:
            text = "\n".join(lines[i - 1] for i in span).rstrip().rstrip(";")
            text = text[len(text) - len(text.lstrip()):] if "\n" not in text else text
            asserts.append("\n".join(above + [text]))
            drop.update(range(k + 1, stmts[0].lineno))
        drop.update(span)
    kept = "\n".join(l for i, l in enumerate(lines, start=1) if i not in drop)
    kept = re.sub(r"\n{3,}", "\n\n", kept).strip("\n")
    return kept, glues, asserts


_PLOT_CALL = re.compile(r"(^|\.)(show|plot_\w+|\w+_figure)$")


def _call_name(node) -> str:
    f = node.func if isinstance(node, ast.Call) else None
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f"{getattr(f.value, 'id', '')}.{f.attr}"
    return ""


def _is_plot(stmt) -> bool:
    """A statement that only draws: ``show(...)``, ``plots.plot_x(...)``, ``x_figure(...)``, ``fig = plot_x(...)``."""
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    return isinstance(value, ast.Call) and bool(_PLOT_CALL.search(_call_name(value)))


def split_figure(src: str) -> tuple[str, str]:
    """(measuring code, trailing drawing code): a cell that measures and then draws becomes two cells."""
    tree = ast.parse(src)
    body = tree.body
    k = len(body)
    while k > 0 and _is_plot(body[k - 1]):
        k -= 1
    if k == len(body) or k == 0:
        return src, ""
    lines = src.split("\n")
    cut = body[k].lineno - 1
    # Comment lines right above the first drawing statement go with it.
    while cut > 0 and lines[cut - 1].strip().startswith("#"):
        cut -= 1
    return "\n".join(lines[:cut]).rstrip(), "\n".join(lines[cut:]).strip("\n")


def _is_report(stmt) -> bool:
    """A statement that only shows results: ``print(...)``, ``HTML(...)``/``display(...)``, or a loop of prints."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return _call_name(stmt.value).split(".")[-1] in ("print", "HTML", "display", "Markdown")
    if isinstance(stmt, ast.For):
        return (not stmt.orelse and any(_is_report(b) for b in stmt.body)
                and all(_is_report(b) or isinstance(b, ast.Assign) for b in stmt.body))
    return False


def split_report(src: str) -> tuple[str, str]:
    """(measuring code, trailing code that only prints or displays its results)."""
    body = ast.parse(src).body
    k = len(body)
    while k > 0 and _is_report(body[k - 1]):
        k -= 1
    if k == len(body):
        return src, ""
    if k == 0:
        return "", src
    lines = src.split("\n")
    cut = body[k].lineno - 1
    while cut > 0 and lines[cut - 1].strip().startswith("#"):
        cut -= 1
    return "\n".join(lines[:cut]).rstrip(), "\n".join(lines[cut:]).strip("\n")


_CHEAP = {"len", "max", "min", "sum", "abs", "round", "sorted", "next", "float", "int", "str", "list", "dict",
          "set", "tuple", "any", "all", "range", "enumerate", "zip"}


_CHEAP_METHODS = {"finfo", "iinfo", "item", "values", "keys", "items"}


def split_tail_assignments(src: str, needed_later: set) -> tuple[str, list]:
    """Trailing ``name = expr`` lines that no later visible code reads: they only feed the prose.

    Returns (the rest of the cell, [(name, expr, comment)]); the caller moves them into the
    hidden prose cell that reads them.
    """
    body = ast.parse(src).body
    lines = src.split("\n")
    k = len(body)
    while k > 0:
        b = body[k - 1]
        if not (isinstance(b, ast.Assign) and len(b.targets) == 1 and b.lineno == b.end_lineno
                and sum(1 for x in body if x.lineno == b.lineno) == 1):
            break
        # Only arithmetic on results already measured moves: a call (a measurement, a model) stays in sight.
        if any(isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in _CHEAP)
               and not (isinstance(n.func, ast.Attribute) and n.func.attr in _CHEAP_METHODS)
               for n in ast.walk(b.value)):
            break
        t = b.targets[0]
        names = [t] if isinstance(t, ast.Name) else list(t.elts) if isinstance(t, ast.Tuple) else [None]
        if not all(isinstance(x, ast.Name) and x.id not in needed_later for x in names):
            break
        k -= 1
    if k == len(body):
        return src, []
    moved = []
    for b in body[k:]:
        tail = lines[b.end_lineno - 1][b.end_col_offset:]
        comment = tail[tail.index("#"):] if "#" in tail else ""
        moved.append((ast.get_source_segment(src, b.targets[0]), ast.get_source_segment(src, b.value), comment))
    cut = body[k].lineno - 1
    return "\n".join(lines[:cut]).rstrip(), moved


def _closure(pending: list, names: set) -> list:
    """The pending assignments that ``names`` need, with what those need in turn, in order."""
    want = set(names)
    changed = True
    while changed:
        changed = False
        for v, _, _, reads in pending:
            if _names(v) & want and not reads <= want:
                want |= reads
                changed = True
    return [p for p in pending if _names(p[0]) & want]


def _names(target: str) -> set:
    """The names an assignment target defines: "x" -> {"x"}; "a, b" -> {"a", "b"}."""
    return {t.strip() for t in target.split(",")}


def figure_only(src: str) -> bool:
    try:
        body = ast.parse(src).body
    except SyntaxError:
        return False
    return bool(body) and all(_is_plot(s) for s in body)


def quiz_kind(src: str) -> str | None:
    """"prediction" or "quiz" when the cell's last statement builds one (its value is displayed)."""
    try:
        body = ast.parse(src).body
    except SyntaxError:
        return None
    if body and isinstance(body[-1], ast.Expr) and isinstance(body[-1].value, ast.Call):
        name = _call_name(body[-1].value).split(".")[-1]
        if name in QUIZ_CALLS:
            return "prediction" if name == "Prediction" else "quiz"
    return None


def drop_glue_import(src: str) -> str:
    src = re.sub(r"^from lessonlib\.book import glue\n?", "", src, flags=re.M)
    src = re.sub(r"^(from lessonlib\.book import [^\n]*?),\s*glue\b", r"\1", src, flags=re.M)
    return src


# --- the whole notebook -------------------------------------------------------

def rewrite(nb) -> list[str]:
    """Rewrite ``nb`` in place; return notes (a note starting "ERROR" needs a hand edit)."""
    notes = []
    used_anywhere = {m.group(1) for c in nb.cells if c.cell_type == "markdown" for m in ROLE.finditer(c.source)}
    all_code = "\n".join(c.source for c in nb.cells[1:] if c.cell_type == "code")
    bound = stores(all_code) if all_code else set()
    rename: dict[str, str] = {}
    cells = []
    pending: list[tuple[str, str, str, set]] = []  # (variable, expression, comment, names it reads)
    defined: set[str] = set()
    seen_code = False

    def flush(which, before_title="Numbers for the text below"):
        if which:
            cells.append(code("\n".join(f"{v} = {e}{'  ' + c if c else ''}" for v, e, c, _ in which), before_title))
            for item in which:
                pending.remove(item)
                defined.update(_names(item[0]))

    def hidden_cell(src, title, tag="remove-input"):
        """A hidden cell; pending assignments it reads open it."""
        need = _closure(pending, loads(src))
        for item in need:
            pending.remove(item)
            defined.update(_names(item[0]))
        pre = "\n".join(f"{v} = {e}{'  ' + c if c else ''}" for v, e, c, _ in need)
        cells.append(code((pre + "\n" if pre else "") + src, title, tag))

    def later_visible_loads(start):
        out = set()
        for c in nb.cells[start:]:
            if c.cell_type == "code" and not hidden(c) and not _will_hide(c.source):
                try:
                    rest, _, _ = extract(drop_glue_import(c.source))
                    out |= loads(rest) if rest else set()
                except (SyntaxError, ValueError):
                    out |= loads(c.source)
        return out

    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and i > 0 and not hidden(cell):
            kept, glues, asserts = extract(drop_glue_import(cell.source))
            seen_code = True
            kept, drawing = split_figure(kept) if kept else (kept, "")
            tail, report = [], ""
            feeds_prose = glues or any(ROLE.search(c.source) for c in nb.cells[i + 1:])
            while kept and quiz_kind(kept) is None:
                more_tail = []
                if feeds_prose:
                    kept, more_tail = split_tail_assignments(kept, later_visible_loads(i + 1))
                kept, more_report = split_report(kept) if kept else (kept, "")
                tail = more_tail + tail
                report = "\n".join(x for x in (more_report, report) if x)
                if not more_tail and not more_report:
                    break
            if kept:
                st = stores(kept)
                flush(_closure(pending, set().union(*[_names(p[0]) for p in pending if p[3] & st or _names(p[0]) & st]) | loads(kept)))
                cell.source = kept
                cells.append(cell)
                defined |= st
            for var, expr, comment in tail:
                pending.append((var, expr, comment, loads(expr)))
            for name, expr, comment in glues:
                if name not in used_anywhere:
                    notes.append(f"glue {name!r} is read by no prose of this page; dropped")
                    continue
                var = name
                if name in bound and expr != name:
                    var = rename[name] = f"{name}_shown"
                if var != expr:
                    pending.append((var, expr, comment, loads(expr)))
            if report:
                hidden_cell(report, "Show the results", "hide-input")
            if asserts:
                hidden_cell("\n".join(asserts), "Check what the text claims")
            if drawing:
                hidden_cell(drawing, "Draw the figure", "hide-input")
        elif cell.cell_type == "code":
            if i > 0:
                defined |= stores(cell.source)
            cells.append(cell)
        elif cell.cell_type == "markdown" and ROLE.search(cell.source):
            for kind, text in split_markdown(cell):
                if kind == "md":
                    cells.append(nbformat.v4.new_markdown_cell(text))
                    continue
                for name, new in rename.items():
                    text = re.sub(r"(\{glue(?::text|:)?\}`)" + name + r"\b", r"\g<1>" + new, text)
                body, names = to_fstring(text)
                mine = _closure(pending, set(names))
                early = []
                for n in dict.fromkeys(names):
                    if n not in defined and not any(n in _names(p[0]) for p in mine):
                        if n in EARLY:
                            early.append(n)
                        else:
                            notes.append(f"ERROR cell {i}: prose reads {n!r} before any code computes it")
                lines = []
                if not seen_code:
                    lines.append(SAY_IMPORT)
                lines += list(dict.fromkeys(EARLY[n][0] for n in early))
                lines += [f"{n} = {EARLY[n][1]}" for n in early]
                defined.update(early)
                lines += [f"{v} = {e}{'  ' + c if c else ''}" for v, e, c, _ in mine]
                for item in mine:
                    pending.remove(item)
                    defined.update(_names(item[0]))
                src = "\n".join(lines + [f'say(rf"""\n{body}\n""")'])
                c = code(src, "Text with this run's numbers")
                cells.append(c)
        else:
            cells.append(cell)
    for v, e, _, _ in pending:
        notes.append(f"ERROR: {v} = {e} is computed after the only prose that reads it")
    if any(c.cell_type == "code" and 'say(rf"""' in c.source for c in cells):
        first = next(c for c in cells[1:] if c.cell_type == "code" and 'say(rf"""' not in c.source)
        if SAY_IMPORT not in first.source:
            first.source = first.source.rstrip("\n") + "\n" + SAY_IMPORT
    nb.cells = _fold_into_checks(cells)
    _hide_rest(nb)
    return notes


CHECK_TITLE = "# @title Check what the text claims"


def _fold_into_checks(cells):
    """A visible cell that only computes what the hidden check after it reads is plumbing: fold it in."""
    out = list(cells)
    i = 0
    while i < len(out) - 1:
        cell, nxt = out[i], out[i + 1]
        if (cell.cell_type == "code" and not hidden(cell) and nxt.cell_type == "code"
                and nxt.source.startswith(CHECK_TITLE)):
            try:
                body = ast.parse(cell.source).body
            except SyntaxError:
                body = []
            assigns_only = body and all(isinstance(b, ast.Assign) for b in body)
            names = stores(cell.source) if assigns_only else set()
            later = "\n".join(c.source for c in out[i + 2:] if c.cell_type == "code")
            if assigns_only and not (names & loads(later)):
                nxt.source = CHECK_TITLE + "\n" + cell.source + "\n" + nxt.source[len(CHECK_TITLE) + 1:]
                del out[i]
                continue
        i += 1
    return out


_DRAWS = re.compile(r"\b(plt\.subplots|plots\.stacked_bars|ax\d?\.set\(|ax\d?\.set_\w+\()")
_MEASURES = re.compile(r"\b(measure\w*|time_\w+|count_flops|run_\w+|train\w*)\(")


def _will_hide(src: str) -> bool:
    """Cells that _hide_rest hides whole: quizzes, figures, calculators."""
    return bool(quiz_kind(src) or figure_only(re.sub(r"^(import|from) .*$", "", src, flags=re.M).strip())
                or (_DRAWS.search(src) and not _MEASURES.search(src)) or re.search(r"^Explorer\(", src, re.M))


def _hide_rest(nb) -> None:
    first = next((i for i, c in enumerate(nb.cells) if i > 0 and c.cell_type == "code" and 'say(rf"""' not in c.source),
                 None)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or i == 0 or hidden(cell):
            continue
        if i == first and re.match(r"(import|from) ", cell.source):
            hide(cell, "Imports", "hide-input")
            continue
        kind = quiz_kind(cell.source)
        if kind == "prediction":
            hide(cell, "Prediction prompt")
        elif kind == "quiz":
            hide(cell, "Quiz")
        elif figure_only(re.sub(r"^(import|from) .*$", "", cell.source, flags=re.M).strip()):
            hide(cell, "Draw the figure", "hide-input")
        elif _DRAWS.search(cell.source) and not _MEASURES.search(cell.source):
            hide(cell, "Draw the figure", "hide-input")
        elif re.search(r"^Explorer\(", cell.source, re.M):
            hide(cell, "Calculator", "hide-input")


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if not a.startswith("--")]
    bad = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        before = nbformat.writes(nb)
        notes = rewrite(nb)
        after = nbformat.writes(nb)
        for n in notes:
            print(f"{path}: {n}")
        if before != after:
            if check:
                print(f"{path}: would change")
                bad += 1
            else:
                nbformat.validate(nb)
                nbformat.write(nb, path)
                print(f"{path}: rewritten ({len(nb.cells)} cells)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
