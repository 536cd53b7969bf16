"""Quizzes that cannot be answered by their form alone (fast: reads the pages' text sources only).

Readers answered quizzes by elimination: the right choice was the only long, hedged, reasoned one (or
repeated the page's slogan) beside short strawmen. The content of a choice needs a reader's judgement;
these checks catch the form a reader can exploit without reading the page:

* the right choice of a single-choice quiz (or the one right choice of a select-all) is not much longer
  than the longest wrong one;
* no question contains its right choice's text;
* no wrong choice's feedback repeats the right choice's text (the feedback is a hint).

Choices are read from the quiz definitions in each page's ``.md`` (``Choice("...", correct=True, ...)``);
an f-string's placeholder counts as four characters, the width of a typical number.
"""
from __future__ import annotations

import ast
import re

import pytest

from conftest import ROOT

#: The chapters whose quizzes are checked (chapter 3's giveaways, a right choice up to 2.3 times the longest wrong
#: one on seven of its pages, were rewritten when it was added).
CHAPTERS = ("01-forward-vs-training", "02-two-checkpoints", "03-distributed-speedup")
PAGES = sorted(p for ch in CHAPTERS for p in (ROOT / "chapters" / ch).glob("[0-9][0-9]-*.md"))

#: The right choice may be at most this many times the longest wrong one, in characters.
MAX_LENGTH_RATIO = 1.4
PLACEHOLDER = "XXXX"


def _text(node) -> str | None:
    """The string a literal, an f-string (placeholders as four characters) or a concatenation gives."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else PLACEHOLDER for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def _correct(call: ast.Call):
    """True, False, or None where ``correct=`` is an expression (a page may decide it from its own run)."""
    for k in call.keywords:
        if k.arg == "correct":
            return k.value.value if isinstance(k.value, ast.Constant) else None
    return False


def quizzes(path):
    """(kind, question, [(text, correct, feedback)]) for every choice quiz of a page's text source."""
    md = path.read_text(encoding="utf-8")
    out = []
    for cell in re.findall(r"```\{code-cell\}[^\n]*\n(.*?)\n```", md, re.S):
        src = re.sub(r"\A---\n.*?\n---\n", "", cell, flags=re.S)
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("SingleChoice", "MultipleSelect")):
                continue
            question = _text(node.args[0]) if node.args else None
            choices = node.args[1] if len(node.args) > 1 else None
            if question is None or not isinstance(choices, (ast.List, ast.Tuple)):
                continue
            rows = []
            for c in choices.elts:
                if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "Choice" and c.args:
                    fb = next((_text(k.value) for k in c.keywords if k.arg == "feedback"), "") or ""
                    rows.append((_text(c.args[0]), _correct(c), fb))
            out.append((node.func.id, question, rows))
    return out


ALL = [(p, q) for p in PAGES for q in quizzes(p)]


def test_the_check_reads_the_quizzes():
    # chapters 1-3: dropping a chapter, or a page's choice quizzes going unread, fails here
    assert len(PAGES) >= 26 and {p for p, _ in ALL} == set(PAGES) and len(ALL) >= 49


def _lengths(rows):
    """Lengths of the right and the wrong choices, or None where a choice's text or verdict is not literal."""
    if any(t is None or c is None for t, c, _ in rows):
        return None
    return [len(t) for t, c, _ in rows if c], [len(t) for t, c, _ in rows if not c]


@pytest.mark.parametrize("path,quiz", ALL, ids=[f"{p.stem}:{q[1][:40]}" for p, q in ALL])
def test_the_right_choice_is_not_the_long_one(path, quiz):
    kind, question, rows = quiz
    lengths = _lengths(rows)
    if lengths is None:
        return  # a verdict computed from the run: the lengths of its candidates are checked below
    right, wrong = lengths
    if kind == "MultipleSelect" and len(right) != 1:
        return  # several right choices: length does not single one out
    assert wrong and max(right) <= MAX_LENGTH_RATIO * max(wrong), (
        f"{path.name}: the right choice ({max(right)} characters) is more than {MAX_LENGTH_RATIO} times the longest "
        f"wrong one ({max(wrong)}): {question!r}")


@pytest.mark.parametrize("path,quiz", ALL, ids=[f"{p.stem}:{q[1][:40]}" for p, q in ALL])
def test_choices_decided_by_the_run_are_of_one_length(path, quiz):
    kind, question, rows = quiz
    if all(c is not None for _, c, _ in rows):
        return
    sizes = [len(t) for t, _, _ in rows if t is not None]
    assert max(sizes) <= MAX_LENGTH_RATIO * sorted(sizes)[-2], (path.name, question)


@pytest.mark.parametrize("path,quiz", ALL, ids=[f"{p.stem}:{q[1][:40]}" for p, q in ALL])
def test_neither_question_nor_hints_name_the_answer(path, quiz):
    kind, question, rows = quiz
    for text, correct, _ in rows:
        if correct and text and len(text) > 12:
            assert text.lower() not in question.lower(), (path.name, question)
            for other, c, feedback in rows:
                if c is False:
                    assert text.lower() not in feedback.lower(), (path.name, other, feedback)


def test_the_length_check_catches_a_giveaway():
    sample = ROOT / "tests" / "_quiz_sample.md"
    try:
        sample.write_text('```{code-cell}\nSingleChoice("Why?", [Choice("No"), Choice("Yes: because of the long '
                          'reason the page gave, in its own words", correct=True), Choice("Maybe")])\n```\n',
                          encoding="utf-8")
        (kind, question, rows), = quizzes(sample)
        right, wrong = _lengths(rows)
        assert max(right) > MAX_LENGTH_RATIO * max(wrong)
    finally:
        sample.unlink()
