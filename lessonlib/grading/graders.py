"""Checks that decide grades: expected values against handed-in plain data.

The hidden part of a check cell (between ``### BEGIN HIDDEN TESTS`` and
``### END HIDDEN TESTS``) computes the expected values with instructor code
and registers one function per question::

    _expected = count_flops(model, x, y, loss_fn).forward

    @grader("1a-q1")
    def _(got):
        check_close("forward_flops", got["forward_flops"], _expected, rel=1e-9,
                    hint="Recount layer by layer: is every layer in it?")

``got`` holds the answers that the check cell handed in (see
:func:`lessonlib.grading.answers.hand_in`), decoded to plain Python values.
The function passes, raises ``AssertionError`` (a wrong answer: its message is
the feedback) or :class:`Flag` (a person should read the answer).

Where :func:`grader` runs decides what it does:

* In the autograder's reference process (:mod:`lessonlib.grading.reference`)
  it only registers the function; the grader calls it later with each
  student's answers. That process runs the instructor's notebook (without
  its solutions), so every expected value comes from instructor code.
* Anywhere else (the instructor's notebook in Jupyter, the book build, nbval,
  nbgrader) it checks the answers just handed in by the same cell and prints
  ``1a-q1 ✓``, so the instructor's solutions are tested where they run.

Feedback says what is wrong (direction, a unit mix-up, a nudge), never the
expected value or the formula. Pure Python; nothing imported from the rest of lessonlib.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable, Mapping, Sequence

from . import answers as _answers
from .answers import require_number

#: "live" (check at once) or "reference" (register for the autograder).
MODE = "live"
#: Check functions registered in reference mode: ``grade_id -> function``.
REGISTRY: dict[str, Callable] = {}


class Flag(Exception):
    """Not a wrong answer but one a person should read (the grade waits for them)."""


#: Prefix of the entries the grader adds to a question's answers: the answers that the same
#: notebook handed in to its other questions (``"@2a-q2"``). A student's own ``@`` names are dropped.
OTHER = "@"


class Answers(dict):
    """The handed-in answers of one question; ``folder`` is its hand-in folder, if any.

    ``others`` holds what the same notebook handed in to its other questions,
    by grade id (see :meth:`answers_to`): a check may require that two
    answers agree.
    """

    folder: Path | None = None
    others: dict

    def __missing__(self, key):
        raise AssertionError(f"{key} was not handed in")

    def answers_to(self, grade_id: str) -> "Answers":
        """What this notebook handed in to question ``grade_id`` (``AssertionError`` if nothing)."""
        found = getattr(self, "others", {}).get(grade_id)
        if found is None:
            raise AssertionError(f"nothing was handed in to {grade_id}, which this answer must agree with")
        return found


def decode(value):
    """Inverse of :func:`lessonlib.grading.answers.to_plain`: plain JSON to Python values."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$dict"} and isinstance(value["$dict"], list):
            out = {}
            for pair in value["$dict"]:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise ValueError("malformed dict in a hand-in")
                key = decode(pair[0])
                if isinstance(key, (list, dict, set)):
                    raise ValueError("malformed dict key in a hand-in")
                out[key] = decode(pair[1])
            return out
        if set(value) == {"$set"} and isinstance(value["$set"], list):
            items = [decode(v) for v in value["$set"]]
            if any(isinstance(v, (list, dict, set)) for v in items):
                raise ValueError("malformed set in a hand-in")
            return set(items)
        if set(value) == {"$float"} and value["$float"] in ("nan", "inf", "-inf"):
            return float(value["$float"])
        raise ValueError("unexpected object in a hand-in")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"unexpected {type(value).__name__} in a hand-in")


def decode_answers(answers) -> Answers:
    """The ``answers`` object of a hand-in (names to plain data) as :class:`Answers`."""
    if not isinstance(answers, dict) or not all(isinstance(k, str) for k in answers):
        raise ValueError("answers must map names to values")
    got = Answers({k: decode(v) for k, v in answers.items() if not k.startswith(OTHER)})
    got.others = {}
    for k, v in answers.items():
        if k.startswith(OTHER):
            other = decode(v)
            if not isinstance(other, dict) or not all(isinstance(n, str) for n in other):
                raise ValueError(f"malformed answers of {k[1:]} in a hand-in")
            got.others[k[1:]] = Answers(other)
    return got


# --------------------------------------------------------------------------
# Comparisons
# --------------------------------------------------------------------------

def _how_far(x: float, expected: float) -> str:
    """Direction and rough size of a miss, without the expected value."""
    if expected == 0:
        return "it should be zero"
    if x == 0:
        return "it should not be zero"
    if (x > 0) != (expected > 0):
        return "it has the wrong sign"
    ratio = x / expected
    direction = "too large" if abs(x) > abs(expected) else "too small"
    if ratio > 10 or ratio < 0.1:
        return f"it is far {direction} (more than ten times off: check the units and the formula)"
    return f"it is {direction}"


def check_close(name: str, value, expected: float, *, rel: float = 1e-6, abs_tol: float = 0.0,
                hint: str = "") -> None:
    """Assert ``value`` is within ``rel`` (relative) or ``abs_tol`` of ``expected``.

    The message gives the direction of the miss, not the expected value or the ratio.
    """
    x = require_number(name, value)
    expected = float(expected)
    if not math.isclose(x, expected, rel_tol=rel, abs_tol=abs_tol):
        raise AssertionError(f"{name} = {x:g} is not right: {_how_far(x, expected)}. {hint}".strip())


def check_choice(name: str, value, expected: str, options: Sequence[str], *, hint: str = "") -> None:
    """Assert ``value`` (a string) is ``expected``, one of ``options`` (case-insensitive)."""
    opts = [o.lower() for o in options]
    if not isinstance(value, str) or not value.strip():
        raise AssertionError(f"{name} should be one of {list(options)}, got {str(value)[:60]!r}.")
    v = value.strip().lower()
    if v not in opts:
        raise AssertionError(f"{name} = {value[:60]!r} is not one of {list(options)}.")
    if v != expected.lower():
        raise AssertionError(f"{name} = {value!r} is not right. {hint}".strip())


# --------------------------------------------------------------------------
# Free text
# --------------------------------------------------------------------------

#: Short words that hold a sentence together. A sentence with none of them is a list of keywords.
FUNCTION_WORDS = frozenset("""
a an the this that these those it its they them their we our us you your i me my he she
is are was were be been being am do does did has have had will would can could should may might must
and but or so because since as if then than while when where which who what though although yet
of to in on at by for with from into over under about per without through after before
not also only just very too
""".split())


def sentences(text: str) -> list[str]:
    """The sentences of ``text``: split after ``.``, ``!`` or ``?`` and at line breaks."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n\s*\n|\n(?=\s*[-*•]\s)", text or "") if s.strip()]


def well_formed(sentence: str) -> bool:
    """A plausible sentence: at least four words, few repeats, some words that are not keywords.

    A screen, not a parser: "Memory less, memory less." fails (repeats, no
    function word); "It keeps fewer activations, so memory goes down." passes.
    """
    words = [w.lower() for w in re.findall(r"[A-Za-z][A-Za-z'-]*", sentence)]
    if len(words) < 4:
        return False
    if len(set(words)) < 0.75 * len(words):
        return False
    return any(w in FUNCTION_WORDS for w in words)


def _lead_in(ss: Sequence[str], i: int) -> bool:
    """A short opening such as "Yes." or "Yes, I would." before a well-formed sentence: a plain verdict."""
    words = [w.lower() for w in re.findall(r"[A-Za-z][A-Za-z'-]*", ss[i])]
    return 0 < len(words) < 4 and len(set(words)) == len(words) and i + 1 < len(ss) and well_formed(ss[i + 1])


def _matches(sentence: str, groups: Sequence[Sequence[str]]) -> bool:
    return all(any(re.search(p, sentence, re.I) for p in group) for group in groups)


def key_points_found(text: str, key_points: Mapping[str, Sequence[Sequence[str]]]) -> dict[str, bool]:
    """Which key points a free-text answer makes in *some* sentence (well-formed or not).

    ``key_points`` maps a key point's name to a list of word groups (regular
    expressions, case-insensitive); a sentence makes the point when it matches
    at least one pattern of *every* group. For example
    ``{"memory goes down": [["memory", "activation"], ["reduc", "less", "save"]]}``.
    """
    ss = sentences(text or "")
    return {point: any(_matches(s, groups) for s in ss) for point, groups in key_points.items()}


def _distinct_assignment(options: list[list[int]]) -> bool:
    """Can each point get its own sentence? (``options[p]``: sentences that make point ``p``.)"""
    owner: dict[int, int] = {}

    def place(p: int, seen: set) -> bool:
        for s in options[p]:
            if s in seen:
                continue
            seen.add(s)
            if s not in owner or place(owner[s], seen):
                owner[s] = p
                return True
        return False

    return all(place(p, set()) for p in range(len(options)))


#: Words that turn a claim around or hedge it. A screen of words cannot tell "it reduces memory"
#: from "it does not reduce memory", so a key point made in a sentence with one of them is read by a person.
NEGATION = re.compile(r"\b(?:not|no|never|neither|nor|none|nothing|without|hardly|barely|scarcely|cannot|"
                      r"unlikely|fails? to)\b|n[\'\u2019]t\b", re.I)


#: "not storing", "without keeping": a way of saying *discarding*, the mechanism an answer describes,
#: not a claim turned around ("it saves memory by not storing every activation").
NOT_KEEPING = re.compile(r"\b(?:not|without) (?:storing|keeping|saving|holding|retaining|caching)\b", re.I)


def negated(sentence: str) -> bool:
    """Whether ``sentence`` holds a word that negates or hedges a claim (``not``, ``n't``, ``never``...).

    "Not storing" and "without keeping" (:data:`NOT_KEEPING`) name a mechanism, discarding, and do not count.
    """
    return bool(NEGATION.search(NOT_KEEPING.sub("discarding", sentence)))


#: Where one clause of a sentence ends and the next begins: punctuation, the words that join clauses,
#: and just before "without" (which opens a clause of its own: "memory drops without changing the result").
#: A negation is read as turning the claim of its own clause only.
CLAUSE_BREAK = re.compile(r"[,;:()\u2013\u2014]|\s-\s|\b(?:but|and|so|while|whereas|although|though|because|since|"
                          r"which|yet|if|unless|when|whether)\b|(?=\bwithout\b)", re.I)


def clauses(sentence: str) -> list[str]:
    """The clauses of ``sentence`` (split at :data:`CLAUSE_BREAK`), for telling what a negation turns."""
    return [c.strip() for c in CLAUSE_BREAK.split(sentence or "") if c and c.strip()]


def turned(sentence: str, groups: Sequence[Sequence[str]]) -> bool:
    """Whether a negated or hedged clause of ``sentence`` speaks of what the key point ``groups`` is about.

    The first group of a key point names what acts ("checkpointing", "it") and is left out when there
    are others: every clause has an "it". A clause is about the point when it holds a word of any other
    group (memory, time, the direction). So "it does not change the gradients" (no such word) leaves
    "it reduces memory" standing, while "memory does not go down", "without any extra time" and an
    elliptical "..., but not by much" (read with the clause before it) turn the point, wherever in the
    answer they are.
    """
    content = list(groups[1:]) if len(groups) > 1 else list(groups)
    parts = clauses(sentence)
    # an elliptical clause ("..., but not by much") speaks of the clause before it
    scopes = [(parts[i - 1] + " " + c) if i and len(c.split()) <= 3 else c for i, c in enumerate(parts)]
    return any(negated(c) and any(re.search(p, c, re.I) for g in content for p in g) for c in scopes)


def check_key_points(name: str, text, key_points: Mapping[str, Sequence[Sequence[str]]],
                     *, min_words: int = 8,
                     misconceptions: Mapping[str, Sequence[Sequence[str]]] | None = None) -> None:
    """Pass a free-text answer that makes every key point in its own well-formed, plain sentence.

    Fails (``AssertionError``) an empty or too short answer. Otherwise raises
    :class:`Flag`, for a person to read, when the screen is in doubt:

    * a key point is missing, or made only in a malformed or repeated sentence,
      or shares its only sentence with another point;
    * a clause that speaks of a key point's subject (memory, time, the verdict)
      negates or hedges it (:func:`turned`), anywhere in the answer: words alone
      cannot tell a claim from its negation. A negation in a clause about
      something else ("it does not change the gradients") does not count;
    * a sentence says one of ``misconceptions`` (same form as ``key_points``:
      a known wrong claim, e.g. that saving the model to disk frees device
      memory), whatever else the answer says.

    Key points should carry the structure of the claim, not only its words:
    a group for what acts (checkpointing, recomputation), one for what
    changes (memory) and one for the direction (down), so that an off-topic
    sentence that happens to use the words is not enough. The message names
    what the screen did not find or what made it doubt.
    """
    if not isinstance(text, str) or not text.strip():
        raise AssertionError(f"{name} is empty: write your answer as a string.")
    words = len(text.split())
    if words < min_words:
        raise AssertionError(f"{name} has {words} words; explain in at least {min_words}.")
    ss = sentences(text)
    wrong = [m for m, groups in (misconceptions or {}).items() if any(_matches(s, groups) for s in ss)]
    if wrong:
        raise Flag(f"{name}: to read; it seems to claim a known misconception: " + "; ".join(wrong) + ".")
    normal = [" ".join(re.findall(r"[a-z0-9']+", s.lower())) for s in ss]
    good = [i for i, s in enumerate(ss) if (well_formed(s) or _lead_in(ss, i)) and normal.index(normal[i]) == i]
    points = list(key_points)
    anywhere = key_points_found(text, key_points)
    missing = [p for p in points if not anywhere[p]]
    if missing:
        raise Flag(f"{name}: to read; the screen did not find: " + "; ".join(missing) + ".")
    against = [p for p in points if any(turned(s, key_points[p]) for s in ss)]
    if against:
        raise Flag(f"{name}: to read; negated or hedged where it speaks of: " + "; ".join(against)
                   + " (a screen of words cannot tell a claim from its negation).")
    options = [[i for i in good if _matches(ss[i], key_points[p])] for p in points]
    weak = [p for p, o in zip(points, options) if not o]
    if weak:
        raise Flag(f"{name}: to read; made only in malformed or repeated sentences: " + "; ".join(weak) + ".")
    if not _distinct_assignment(options):
        raise Flag(f"{name}: to read; the key points share sentences instead of one sentence each.")


# --------------------------------------------------------------------------
# Registering the checks of a question
# --------------------------------------------------------------------------

def answers_for(grade_id: str) -> Answers:
    """The answers this process handed in last for ``grade_id`` (for an instructor's self-check)."""
    if grade_id not in _answers.handed:
        raise AssertionError(f"no answers were handed in for {grade_id}: call hand_in first")
    got = decode_answers(_answers.handed[grade_id]["answers"])
    got.folder = _answers.folders.get(grade_id)
    got.others = {g: decode_answers(p["answers"]) for g, p in _answers.handed.items() if g != grade_id}
    return got


def grader(grade_id: str) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(got)`` checks the answers to ``grade_id`` (see the module's docstring)."""
    if not isinstance(grade_id, str) or not grade_id:
        raise ValueError(f"grade_id must be a question id such as '1a-q1', got {grade_id!r}")

    def register(fn: Callable) -> Callable:
        if MODE == "reference":
            if grade_id in REGISTRY:
                raise ValueError(f"two checks registered for {grade_id}")
            REGISTRY[grade_id] = fn
        else:
            fn(answers_for(grade_id))
            print(f"{grade_id} ✓")
        return fn

    return register
