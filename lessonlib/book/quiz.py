"""Quizzes defined once, answered everywhere.

A quiz is data: a question, choices (or a numeric answer with a tolerance and
units), feedback for each choice, and an explanation. A wrong answer gets a
hint only (that choice's feedback, or "too high"/"too low" with the units);
the answer and the explanation appear after a right answer or a click on
"Show answer", never before.
Displayed as the last expression of a cell, a quiz shows one self-contained
HTML + inline-JS version in the book, JupyterLab / Notebook 7 and Colab (see
:mod:`lessonlib.book.interactive`); :meth:`widget` gives the live ipywidgets one.

The grading logic lives only here, in :meth:`check`. The static page embeds
the verdict and feedback that :meth:`check` gives for every possible choice
(every subset, for a multiple-select quiz), so a click in the browser gives the
same answer as Python. A numeric quiz embeds its answer, tolerance and the
three messages; the one comparison ``|x - answer| <= tolerance`` is the only
logic the script repeats.

No answer is in the page as text: the verdicts, the feedback, the answer and
the explanation travel base64-encoded (:func:`_encode`) in a data element that
only the quiz's script decodes, on a right answer or "Show answer". Where the
script does not run (an untrusted notebook, whose outputs JupyterLab shows
without their scripts and without ``hidden`` attributes; nbconvert without
JavaScript; a plain viewer), the reader sees the question, the choices and a
"run this cell" line, and no answer. Base64 is a wrapper, not a lock: it keeps
answers out of sight, not out of reach of a reader who decodes them on purpose.

Kinds: :class:`SingleChoice`, :class:`MultipleSelect`, :class:`Numeric` and
:class:`Prediction` (a "What do you think happens?" prompt whose answer is
revealed on click). Question, choice, feedback and explanation strings may
contain simple HTML.
"""
from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..checks import amount, count, flag, number, sequence, text
from .interactive import Interactive, script_json, script_text, stable_id


@dataclass(frozen=True)
class Choice:
    """One option of a choice quiz; ``feedback`` explains why it is right or wrong."""

    text: str
    correct: bool = False
    feedback: str = ""

    def __post_init__(self):
        text("text", self.text)
        flag("correct", self.correct)
        text("feedback", self.feedback, allow_empty=True)


@dataclass(frozen=True)
class Verdict:
    """The result of checking an answer: right or wrong, and what to tell the learner."""

    correct: bool
    feedback: str


RIGHT, WRONG = "Correct.", "Not quite."


def _normalise_choices(choices, answer) -> list[Choice]:
    choices = sequence("choices", choices)
    if answer is not None:
        wanted = [answer] if isinstance(answer, str) else sequence("answer", answer)
        texts = [c.text if isinstance(c, Choice) else c for c in choices]
        for a in wanted:
            if a not in texts:
                raise ValueError(f"answer {a!r} is not among the choices {texts!r}")
        choices = [
            Choice(c.text, c.text in wanted, c.feedback) if isinstance(c, Choice) else Choice(c, c in wanted)
            for c in choices
        ]
    out = []
    for i, c in enumerate(choices):
        if isinstance(c, str):
            c = Choice(c)
        if not isinstance(c, Choice):
            raise ValueError(f"choices[{i}] must be a Choice or a string, got {type(c).__name__}")
        text(f"choices[{i}].text", c.text)
        out.append(c)
    texts = [c.text for c in out]
    if len(set(texts)) != len(texts):
        raise ValueError(f"choices repeat a text: {texts!r}")
    return out


def display_order(question: str, n: int) -> list:
    """The order in which a choice quiz shows its ``n`` choices: a shuffle seeded by ``question``, the same on
    every build. Authors list the right choice where they like (often first); a reader must not learn that
    the first choice is the answer. An input's value is its shown position and the verdicts are listed by it."""
    import hashlib
    import random

    question, n = text("question", question), count("n", n, maximum=1000)
    order = list(range(n))
    random.Random(int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big")).shuffle(order)
    return order


class _ChoiceQuiz(Interactive):

    def __init__(self, question: str, choices: Sequence[Choice | str], explanation: str = "", answer=None):
        self.question = text("question", question)
        self.choices = _normalise_choices(choices, answer)
        self.explanation = text("explanation", explanation, allow_empty=True)
        n_correct = sum(c.correct for c in self.choices)
        if n_correct == 0:
            raise ValueError("no choice is marked correct: the correct answer must be among the choices")
        self._validate_correct(n_correct)

    def _validate_correct(self, n_correct: int) -> None:
        pass

    def answer_html(self) -> str:
        """The correct choice(s), shown after a right answer or "Show answer"."""
        right = [c for c in self.choices if c.correct]
        return "Answer: " + "; ".join(c.text + (f" ({c.feedback})" if c.feedback else "") for c in right)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}: {self.question}"]
        lines += [f"  ({k + 1}) {self.choices[i].text}" for k, i in enumerate(display_order(self.question, len(self.choices)))]
        return "\n".join(lines)

    def _index(self, answer) -> int:
        """A choice given as its 0-based index or its exact text."""
        if isinstance(answer, bool):
            raise ValueError(f"answer must be a choice index or text, got {answer!r}")
        if isinstance(answer, int):
            if not 0 <= answer < len(self.choices):
                raise ValueError(f"answer index {answer} is out of range 0..{len(self.choices) - 1}")
            return answer
        for i, c in enumerate(self.choices):
            if c.text == answer:
                return i
        raise ValueError(f"answer {answer!r} is not one of the choices")


class SingleChoice(_ChoiceQuiz):
    """Exactly one choice is correct."""


    def _validate_correct(self, n_correct: int) -> None:
        if n_correct != 1:
            raise ValueError(f"a SingleChoice quiz needs exactly one correct choice, got {n_correct}")

    def check(self, answer: int | str) -> Verdict:
        """Grade one answer (a 0-based index or the choice's text)."""
        c = self.choices[self._index(answer)]
        head = RIGHT if c.correct else WRONG
        return Verdict(c.correct, f"{head} {c.feedback}".strip())

    def widget(self):
        import ipywidgets as w

        sel = w.RadioButtons(options=[(self.choices[i].text, i) for i in display_order(self.question, len(self.choices))],
                             value=None,
                             layout=w.Layout(width="auto"))
        return _live_box(self, sel, lambda: None if sel.value is None else self.check(sel.value),
                         "Choose an answer first.")

    def static_html(self) -> str:
        uid = stable_id("single", self.question, [c.text for c in self.choices])
        order = display_order(self.question, len(self.choices))
        verdicts = [self.check(i) for i in order]  # by shown position, the input's value
        opts = "".join(
            f'<label><input type="radio" name="{uid}" value="{pos}"> {self.choices[i].text}</label>'
            for pos, i in enumerate(order)
        )
        data = {"kind": "single", "verdicts": [[v.correct, v.feedback] for v in verdicts]}
        return _static_box(uid, self, opts, data)


class MultipleSelect(_ChoiceQuiz):
    """Select every correct choice; right only when the selection is exactly the correct set.

    The question says so: "(Choose all that apply.)" is added where it does not already say "select all",
    "choose all" or "all that apply" (any case): check boxes alone do not say more than one may be right.
    """

    def __init__(self, question: str, choices: Sequence[Choice | str], explanation: str = "", answer=None):
        super().__init__(question, choices, explanation, answer)
        if not re.search(r"\b(select|choose) all\b|\ball that apply\b", self.question, re.IGNORECASE):
            self.question = f"{self.question} (Choose all that apply.)"

    def check(self, answer: Iterable[int | str]) -> Verdict:
        """Grade a selection: an iterable of 0-based indices or choice texts."""
        if isinstance(answer, (str, int)):
            answer = [answer]
        picked = {self._index(a) for a in answer}
        correct = {i for i, c in enumerate(self.choices) if c.correct}
        if not picked:
            return Verdict(False, "Select at least one choice.")
        ok = picked == correct
        parts = [RIGHT if ok else WRONG]
        if not ok:
            missed, extra = len(correct - picked), len(picked - correct)
            if extra:
                parts.append(f"{extra} of your selections {'is' if extra == 1 else 'are'} not right.")
            if missed:
                parts.append(f"You missed {missed} correct choice{'s' if missed != 1 else ''}.")
        # A wrong selection hears why its wrong picks are wrong (a hint), not which picks were right.
        shown = sorted(picked) if ok else sorted(picked - correct)
        parts += [self.choices[i].feedback for i in shown if self.choices[i].feedback]
        return Verdict(ok, " ".join(parts))

    def widget(self):
        import ipywidgets as w

        order = display_order(self.question, len(self.choices))
        boxes = [w.Checkbox(value=False, description=self.choices[i].text, indent=False, layout=w.Layout(width="auto"))
                 for i in order]
        sel = w.VBox(boxes)
        sel.boxes = boxes
        return _live_box(self, sel, lambda: self.check([i for i, b in zip(order, boxes) if b.value]), None)

    def static_html(self) -> str:
        uid = stable_id("multiple", self.question, [c.text for c in self.choices])
        n = len(self.choices)
        if n > 10:
            raise ValueError("a MultipleSelect quiz offers at most 10 choices")
        # Every subset, indexed by its bitmask over the shown positions (bit p = the p-th shown input checked).
        order = display_order(self.question, n)
        verdicts = []
        for mask in range(2 ** n):
            v = self.check([order[p] for p in range(n) if mask >> p & 1])
            verdicts.append([v.correct, v.feedback])
        opts = "".join(
            f'<label><input type="checkbox" name="{uid}" value="{pos}"> {self.choices[i].text}</label>'
            for pos, i in enumerate(order)
        )
        return _static_box(uid, self, opts, {"kind": "multiple", "verdicts": verdicts})


class Numeric(Interactive):
    """A number with a tolerance and units, e.g. a speedup of 2.5 (±0.01) ×.

    ``tolerance`` is absolute, in the answer's units.
    """


    def __init__(self, question: str, answer: float | None = None, tolerance: float = 0.0,
                 units: str = "", explanation: str = ""):
        self.question = text("question", question)
        if answer is None:
            raise ValueError("a Numeric quiz needs an answer")
        self.answer, self.tolerance = number("answer", answer), amount("tolerance", tolerance)
        self.units = text("units", units, allow_empty=True)
        self.explanation = text("explanation", explanation, allow_empty=True)

    def __repr__(self) -> str:
        return f"Numeric: {self.question} [answer in {self.units or 'units'}]"

    def answer_html(self) -> str:
        """The answer with its units, shown after a right answer or "Show answer"."""
        return f"Answer: {self.answer:.4g}{' ' + self.units if self.units else ''}"

    def messages(self) -> dict[str, str]:
        """The feedback texts; ``{x}`` stands for the learner's number."""
        u = f" {self.units}" if self.units else ""
        return {
            "right": f"{RIGHT} {{x}}{u} is within {self.tolerance:g}{u} of the answer.",
            "high": f"{WRONG} {{x}}{u} is too high.",
            "low": f"{WRONG} {{x}}{u} is too low.",
            "nan": "Enter a number.",
        }

    def check(self, answer: float | str) -> Verdict:
        """Grade a number (or the text a learner typed)."""
        m = self.messages()
        try:
            x = float(str(answer).strip().replace(",", "")) if isinstance(answer, str) else float(answer)
        except (TypeError, ValueError):
            return Verdict(False, m["nan"])
        if not math.isfinite(x):
            return Verdict(False, m["nan"])
        # Echo what the learner typed (the static page does the same).
        shown = html.escape(answer.strip() if isinstance(answer, str) else f"{x:g}")
        if abs(x - self.answer) <= self.tolerance + 1e-12 * max(1.0, abs(self.answer)):
            return Verdict(True, m["right"].format(x=shown))
        return Verdict(False, m["high" if x > self.answer else "low"].format(x=shown))

    def widget(self):
        import ipywidgets as w

        box = w.Text(placeholder=f"a number{' in ' + self.units if self.units else ''}", layout=w.Layout(width="14em"))
        return _live_box(self, box, lambda: self.check(box.value), None)

    def static_html(self) -> str:
        uid = stable_id("numeric", self.question, self.answer, self.tolerance, self.units)
        units = f" <span>{self.units}</span>" if self.units else ""
        field = (f'<input type="text" inputmode="decimal" id="{uid}-x" aria-label="your answer" '
                 f'placeholder="a number">{units}')
        data = {"kind": "numeric", "answer_value": self.answer, "tolerance": self.tolerance, "messages": self.messages()}
        return _static_box(uid, self, field, data)


class Prediction(Interactive):
    """A "What do you think happens?" prompt: think first, then reveal the answer."""


    def __init__(self, question: str, answer: str):
        self.question = text("question", question)
        self.answer = text("answer", answer)

    def __repr__(self) -> str:
        return f"Prediction: {self.question}"

    def widget(self):
        import ipywidgets as w

        button = w.Button(description="Reveal answer", button_style="info")
        answer = w.HTML("")

        def reveal(_b):
            answer.value = f'<div class="wtc-explanation">{self.answer}</div>'
            button.disabled = True

        button.on_click(reveal)
        box = w.VBox([w.HTML(f"<b>What do you think happens?</b> {self.question}"), button, answer])
        box.button, box.answer = button, answer
        return box

    def static_html(self) -> str:
        uid = stable_id("prediction", self.question)
        return (f'<div class="wtc-box wtc-prediction" id="{uid}" data-kind="prediction">'
                f'<div class="wtc-title">What do you think happens?</div><div>{self.question}</div>'
                + _NOSCRIPT.format(what="reveal the answer") + _data_and_script(uid, {"kind": "prediction", "answer": self.answer})
                + "</div>")


# ----- shared rendering ---------------------------------------------------

def _live_box(quiz, selector, grade, empty_msg):
    """Question, selector, a Check button and the feedback area, as ipywidgets."""
    import ipywidgets as w

    check = w.Button(description="Check", button_style="primary")
    reveal = w.Button(description="Show answer")
    feedback = w.HTML("")
    solution = w.HTML("")

    revealed = []

    def show_solution(answer_line=True):
        if answer_line:
            revealed.append(True)
        solution.value = _explanation_html(quiz, answer_line=answer_line or bool(revealed))

    def on_check(_b):
        verdict = grade()
        if verdict is None:
            feedback.value = empty_msg
            return
        cls, mark = ("wtc-right", "✔") if verdict.correct else ("wtc-wrong", "✘")
        color = "#17612f" if verdict.correct else "#9b1c1c"
        feedback.value = f'<span class="{cls}" style="color:{color};font-weight:600">{mark} {verdict.feedback}</span>'
        if verdict.correct:  # a wrong answer gets its hint only; a right one already names the answer
            show_solution(answer_line=False)

    check.on_click(on_check)
    reveal.on_click(lambda _b: show_solution())
    box = w.VBox([w.HTML(f"<b>{quiz.question}</b>"), selector, w.HBox([check, reveal]), feedback, solution])
    box.selector, box.check_button, box.reveal_button, box.feedback, box.solution = \
        selector, check, reveal, feedback, solution
    return box


def _explanation_html(quiz, answer_line: bool = True) -> str:
    """What "Show answer" reveals: the answer and the explanation.

    After a right answer (``answer_line=False``) the verdict line already says the
    answer and why, so only the explanation is added (nothing, without one).
    """
    body = f'<div class="wtc-answer">{quiz.answer_html()}</div>' if answer_line else ""
    if quiz.explanation:
        body += f"<div>{quiz.explanation}</div>"
    if not body:
        return ""
    return ('<div class="wtc-explanation" style="margin-top:.4em;border-left:3px solid #8aa4bf;padding-left:.6em">'
            f"{body}</div>")


_SCRIPT = "<script>" + script_text("quiz.js") + script_text("keys.js") + "</script>"

#: Shown where the quiz's script cannot run; the script removes it (it also adds the buttons).
_NOSCRIPT = ('<div class="wtc-noscript"><em>Run this cell (Shift+Enter) to {what}: '
             "this view does not run the quiz's script, so it shows no answers.</em></div>")


def _encode(data: dict) -> str:
    """``data`` as base64 of its UTF-8 JSON: what the page carries instead of answers in plain text.

    Decoded by ``static/quiz.js`` (``atob`` and ``TextDecoder``). NaN, infinity and
    objects JSON cannot hold are refused as in :func:`~lessonlib.book.interactive.script_json`.
    """
    return base64.b64encode(script_json(data).encode("utf-8")).decode("ascii")


def _data_and_script(uid: str, data: dict) -> str:
    return (f'<script type="text/plain" class="wtc-data" id="{uid}-data">{_encode(data)}</script>'
            + _SCRIPT % {"uid": uid})


def _static_box(uid: str, quiz, inputs_html: str, data: dict) -> str:
    # No answer, explanation or feedback in the HTML: they are in the encoded data, and the
    # script builds the buttons, the feedback line and the explanation (see the module docstring).
    data = dict(data, answer=quiz.answer_html(), explanation=quiz.explanation)
    return (f'<div class="wtc-box wtc-quiz" id="{uid}" data-kind="{data["kind"]}">'
            f'<div class="wtc-title">{quiz.question}</div>{inputs_html}'
            + _NOSCRIPT.format(what="check your answer") + _data_and_script(uid, data) + "</div>")
