"""One-time migration: every page gets a MyST Markdown text source, and its prose becomes Markdown.

    python scripts/migrate_to_text.py            # all chapter and exercise notebooks
    python scripts/migrate_to_text.py --check    # say what it would change; exit 1 if anything
    python scripts/migrate_to_text.py --verify[=REV]  # after a run: every notebook against git's copy (HEAD)

For each notebook of ``chapters/`` and ``exercises/`` it

1. splits every hidden ``say(...)`` prose cell (tags ``remove-input`` only; the
   exercises' instructor-only summaries are left alone): a paragraph without a
   ``{...}`` placeholder becomes Markdown (the string's own value: doubled
   braces undone, backslashes as the rf-string kept them, so the text shown is
   the same), and a paragraph with one stays in a hidden ``say`` cell. The
   statements before the ``say`` go into the first resulting code cell (into a
   hidden cell of their own when no paragraph needs them, since later cells may
   read what they assign). Paragraphs are blank-line separated, except that an
   indented continuation and the items of one list stay together. New
   Markdown joins a neighbouring Markdown cell. A cell it cannot split
   (a string it cannot cut at a paragraph) stays as it was and is reported.
2. writes the page's text source, ``NAME.md`` (jupytext MyST Markdown, paired
   ``ipynb,md:myst``), from the notebook;
3. writes ``NAME.ipynb`` again from that ``.md`` (``scripts/sync_pages.py``:
   no outputs, cell ids from the cell's content).

It is idempotent: on migrated pages it changes nothing. It reads the
``.ipynb`` (not the ``.md``): run it once on the merged tree, then delete it.
"""
from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

import jupytext
import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sync_pages  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REV = "HEAD"  # --verify compares with this revision (--verify=REV)
HIDDEN = {"cellView": "form", "jupyter": {"source_hidden": True}, "tags": ["remove-input"]}
LITERAL = re.compile(r'^(?P<prefix>[rRfFbBuU]{0,2})(?P<quote>"""|\'\'\')(?P<body>.*)(?P=quote)$', re.S)
LIST_ITEM = re.compile(r"^(?:[-*+]|\d+[.)])\s")


def notebooks() -> list[Path]:
    return sorted(p for d in ("chapters", "exercises") for p in (ROOT / d).rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts)


# ---------------------------------------------------------------------------
# splitting a say cell
# ---------------------------------------------------------------------------

def paragraphs(body: str) -> list[str]:
    """Blank-line separated blocks of ``body``; a block that is indented (a continuation) or
    that continues a list (both it and the block before start with a list marker) joins the
    block before it. Math (``$$``) and fenced blocks are never cut: a block with an odd count
    of ``$$`` or of fence lines takes the next blocks until it is closed."""
    raw, cur = [], []
    for line in body.split("\n"):
        if line.strip() == "":
            if cur:
                raw.append(cur)
                cur = []
        else:
            cur.append(line)
    if cur:
        raw.append(cur)
    out: list[list[str]] = []
    for block in raw:
        if out:
            prev = out[-1]
            text = "\n".join(prev)
            still_open = text.count("$$") % 2 == 1 or sum(
                1 for l in prev if l.lstrip().startswith(("```", ":::"))) % 2 == 1
            continues = block[0][:1] in (" ", "\t") or (LIST_ITEM.match(prev[0]) and LIST_ITEM.match(block[0]))
            if still_open or continues:
                prev.extend([""] + block)
                continue
        out.append(list(block))
    return ["\n".join(b) for b in out]


def _literal_value(prefix: str, quote: str, text: str):
    """(value, has a placeholder) of the string literal ``prefix quote text quote``, or None when
    ``text`` is not a whole literal on its own (e.g. it would cut an expression)."""
    try:
        node = ast.parse(f"{prefix}{quote}\n{text}\n{quote}", mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, False
    if isinstance(node, ast.JoinedStr):
        if any(isinstance(v, ast.FormattedValue) for v in node.values):
            return None, True
        return "".join(v.value for v in node.values), False
    return None


def split_say(source: str):
    """The parts of a prose cell: a list of ("code", preamble, say-literal-or-None) and
    ("markdown", text), or None when the cell is not a prose cell this script can split."""
    lines = source.split("\n")
    title = lines[0] if lines[0].startswith("# @title") else None
    code = "\n".join(lines[1:]) if title else source
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    if not tree.body:
        return None
    last = tree.body[-1]
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
            and isinstance(last.value.func, ast.Name) and last.value.func.id == "say"
            and len(last.value.args) == 1 and not last.value.keywords):
        return None
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "say"
           for s in tree.body[:-1] for n in ast.walk(s)):
        return None
    arg = last.value.args[0]
    if not isinstance(arg, (ast.Constant, ast.JoinedStr)):
        return None  # a table or another computed string: it stays as it is
    segment = ast.get_source_segment(code, arg)
    code_lines = code.split("\n")
    preamble = "\n".join(code_lines[:last.lineno - 1]).rstrip("\n")
    m = LITERAL.match(segment or "")
    if m is None:  # a one-line or concatenated literal: one paragraph
        if isinstance(arg, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in arg.values):
            return None
        value = arg.value if isinstance(arg, ast.Constant) else "".join(v.value for v in arg.values)
        return title, preamble, [("markdown", textwrap.dedent(value).strip("\n"))]
    prefix, quote = m.group("prefix"), m.group("quote")
    body = textwrap.dedent(m.group("body")).strip("\n")
    parts = []
    for para in paragraphs(body):
        got = _literal_value(prefix, quote, para)
        if got is None:
            return None  # a paragraph that is no literal on its own: leave the cell whole
        value, placeholder = got
        if placeholder:
            if parts and parts[-1][0] == "say":
                parts[-1] = ("say", parts[-1][1] + "\n\n" + para)
            else:
                parts.append(("say", para))
        else:
            text = value.strip("\n")
            if parts and parts[-1][0] == "markdown":
                parts[-1] = ("markdown", parts[-1][1] + "\n\n" + text)
            else:
                parts.append(("markdown", text))
    return title, preamble, [(k, t if k == "markdown" else (prefix, quote, t)) for k, t in parts]


def _code_cell(title, body: str, metadata) -> nbformat.NotebookNode:
    src = "\n".join(x for x in (title, body) if x)
    return nbformat.v4.new_code_cell(src, metadata=nbformat.from_dict(dict(metadata)))


def rewrite(nb) -> list[str]:
    """Split the prose cells of ``nb`` in place; returns notes of what it did or left."""
    notes, cells, touched, dropped_import = [], [], set(), False
    for i, cell in enumerate(nb.cells):
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type != "code" or tags != {"remove-input"} or not re.search(r"\bsay\(", cell.source):
            cells.append(cell)
            continue
        got = split_say(cell.source)
        if got is None:
            cells.append(cell)
            continue
        title, preamble, parts = got
        if [k for k, _ in parts] == ["say"]:
            cells.append(cell)  # every paragraph carries a number: nothing to do
            continue
        n_md = sum(k == "markdown" for k, _ in parts)
        notes.append(f"cell {i}: {n_md} Markdown part(s), {len(parts) - n_md} say part(s)")
        code_preamble = preamble
        if not any(k == "say" for k, _ in parts):
            # No paragraph needs the values: keep what the preamble assigns for later cells,
            # less the import of say that nothing here calls any more.
            code_preamble = re.sub(r"^from lessonlib\.book(?:\.prose)? import say\n?", "", preamble, flags=re.M).strip("\n")
            dropped_import = dropped_import or code_preamble != preamble.strip("\n")
            if code_preamble:
                cells.append(_code_cell(title, code_preamble, cell.metadata))
                notes.append(f"cell {i}: its statements stay in a hidden cell without text")
            code_preamble = None
        for kind, payload in parts:
            if kind == "markdown":
                cells.append(nbformat.v4.new_markdown_cell(payload))
            else:
                prefix, quote, text = payload
                call = f"say({prefix}{quote}\n{text}\n{quote})"
                body = "\n".join(x for x in (code_preamble, call) if x)
                cells.append(_code_cell(title, body, cell.metadata))
                code_preamble = None
            touched.add(id(cells[-1]))
    if dropped_import:  # a later cell may call say with the import that a removed preamble held
        _keep_say_importable(cells)
    # New Markdown joins the Markdown cells next to it (two untouched neighbours stay apart).
    merged = []
    for cell in cells:
        prev = merged[-1] if merged else None
        if (prev is not None and cell.cell_type == prev.cell_type == "markdown" and not cell.metadata
                and not prev.metadata and (id(cell) in touched or id(prev) in touched)):
            prev.source = prev.source.rstrip("\n") + "\n\n" + cell.source.strip("\n")
            touched.add(id(prev))
        else:
            merged.append(cell)
    nb.cells = merged
    return notes


def _keep_say_importable(cells) -> None:
    imported = False
    for cell in cells:
        if cell.cell_type != "code":
            continue
        src = cell.source
        if re.search(r"^from lessonlib\.book(?:\.prose)? import (?:[^\n]*\b)?say\b", src, re.M) or \
                re.search(r"^import lessonlib", src, re.M):
            imported = True
        elif re.search(r"^say\(", src, re.M) and not imported:
            lines = src.split("\n")
            at = 1 if lines[0].startswith("# @title") else 0
            lines.insert(at, "from lessonlib.book import say")
            cell.source = "\n".join(lines)
            imported = True


# ---------------------------------------------------------------------------
# the page's text source and its notebook
# ---------------------------------------------------------------------------

def migrate(path: Path, check: bool) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    before_nb = nbformat.writes(nb)
    notes = rewrite(nb)
    jt = nb.metadata.setdefault("jupytext", {})
    jt["formats"] = "ipynb,md:myst"
    if "exercise" in nb.metadata:  # the grader's notebook metadata (lessonlib.grading.handout.META_KEY)
        jt["notebook_metadata_filter"] = "exercise"
    nb.metadata.pop("language_info", None)  # the kernel writes it when the page runs
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.source = cell.source.rstrip("\n")  # a text source cannot keep a trailing newline
    md = path.with_suffix(".md")
    text = jupytext.writes(nb, fmt="md:myst")
    old_md = md.read_text() if md.exists() else None
    if old_md is not None and sync_pages.without_version(old_md) == sync_pages.without_version(text):
        text = old_md  # only jupytext's version line differs: keep the file as it is
    changed = []
    if text != old_md:
        changed.append(str(md.relative_to(ROOT)))
        if not check:
            md.write_text(text)
    new_nb = sync_pages.notebook_text(md) if not check else None
    if not check and new_nb != path.read_text():
        path.write_text(new_nb)
        changed.append(str(path.relative_to(ROOT)))
    elif check and notes:
        changed.append(str(path.relative_to(ROOT)))
    del before_nb
    return [f"{path.relative_to(ROOT)}: {n}" for n in notes] + [f"wrote {c}" for c in changed]


def verify(paths: list[Path]) -> list[str]:
    """Differences between each notebook and its copy in git's HEAD, other than what the
    migration does on purpose (cell ids, outputs, language_info, the jupytext metadata, a
    trailing newline) and the prose cells it split (it reports those)."""
    import subprocess

    problems = []
    for path in paths:
        rel = path.relative_to(ROOT)
        try:
            old = nbformat.reads(subprocess.run(["git", "show", f"{REV}:{rel}"], cwd=ROOT, check=True,
                                                capture_output=True, text=True).stdout, as_version=4)
        except subprocess.CalledProcessError:
            problems.append(f"{rel}: not in HEAD")
            continue
        rewrite(old)  # the intended change
        new = nbformat.read(path, as_version=4)
        def cells(nb):
            return [(c.cell_type, c.source.rstrip("\n"), dict(c.metadata)) for c in nb.cells]
        a, b = cells(old), cells(new)
        if a != b:
            bad = [i for i, (x, y) in enumerate(zip(a, b)) if x != y] or [min(len(a), len(b))]
            problems.append(f"{rel}: {len(a)} cells expected, {len(b)} found; first difference at cell {bad[0]}")
        meta_old = {k: v for k, v in old.metadata.items() if k not in ("language_info", "jupytext")}
        meta_new = {k: v for k, v in new.metadata.items() if k != "jupytext"}
        if meta_old != meta_new:
            problems.append(f"{rel}: notebook metadata differs: {meta_old} != {meta_new}")
    return problems


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a).resolve() for a in argv[1:] if not a.startswith("--")] or notebooks()
    verify_at = [a for a in argv if a.startswith("--verify")]
    if verify_at:
        global REV
        REV = verify_at[0].partition("=")[2] or "HEAD"
        problems = verify(paths)
        print("\n".join(problems) or f"{len(paths)} notebooks: every cell as in {REV} (or as the split intends)")
        return 1 if problems else 0
    out = []
    for path in paths:
        out += migrate(path, check)
    print("\n".join(out) or "nothing to do")
    return 1 if check and any(line.startswith("wrote") for line in out) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
