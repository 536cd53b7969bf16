"""Quizzes: grading, malformed definitions, the live widget, and the static page."""
from __future__ import annotations

import html as html_lib
import itertools
import json

import pytest

from lessonlib.book.interactive import Explorer
from lessonlib.book.quiz import Choice, MultipleSelect, Numeric, Prediction, SingleChoice, display_order

from browser import browser, serve


def single():
    return SingleChoice(
        "Which pass costs about twice the forward?",
        [Choice("The loss", feedback="The loss is one small reduction."),
         Choice("Backward", correct=True, feedback="It computes two products per layer."),
         Choice("The update", feedback="The update is elementwise.")],
        explanation="Backward needs gradients for inputs and for weights.",
    )


def multiple():
    return MultipleSelect(
        "What does training hold that serving does not?",
        ["Gradients", "Optimizer state", "The weights", "Saved activations"],
        answer=["Gradients", "Optimizer state", "Saved activations"],
        explanation="Serving needs only the weights.",
    )


def numeric():
    return Numeric("Speedup of 80 parallel + 20 serial units on 4 devices?", answer=2.5,
                   tolerance=0.01, units="×", explanation="100 / (20 + 80/4) = 2.5")


# ----- grading ------------------------------------------------------------

def test_single_choice_grading_by_index_and_text():
    q = single()
    assert q.check(1).correct and q.check("Backward").correct
    v = q.check(0)
    assert not v.correct and "one small reduction" in v.feedback


def test_multiple_select_needs_exactly_the_correct_set():
    q = multiple()
    assert q.check([0, 1, 3]).correct
    assert not q.check([0, 1]).correct            # one missed
    assert "missed 1" in q.check([0, 1]).feedback
    assert not q.check([0, 1, 2, 3]).correct      # one extra
    assert not q.check([]).correct


@pytest.mark.parametrize("typed, ok", [
    (2.5, True), ("2.5", True), ("2.509", True), (2.49, True),   # within ±0.01
    ("2.52", False), (4, False), ("", False), ("four", False), ("nan", False),
])
def test_numeric_tolerance(typed, ok):
    assert numeric().check(typed).correct is ok


def test_numeric_boundary_is_inclusive_and_direction_is_reported():
    q = Numeric("x?", answer=40, tolerance=0.5, units="units")
    assert q.check(40.5).correct and q.check(39.5).correct
    assert "too high" in q.check(41).feedback and "too low" in q.check(10).feedback


@pytest.mark.parametrize("make, message", [
    (lambda: SingleChoice("q?", []), "choices must not be empty"),
    (lambda: SingleChoice("q?", ["a", "b"], answer="c"), "not among the choices"),
    (lambda: SingleChoice("q?", ["a", "b"]), "no choice is marked correct"),
    (lambda: SingleChoice("q?", ["a", "b"], answer=["a", "b"]), "exactly one correct"),
    (lambda: SingleChoice("", ["a"], answer="a"), "question"),
    (lambda: SingleChoice("q?", ["a", "a"], answer="a"), "repeat"),
    (lambda: MultipleSelect("q?", ["a", "b"], answer=["a", "z"]), "not among the choices"),
    (lambda: Numeric("q?"), "needs an answer"),
    (lambda: Numeric("q?", answer=1, tolerance=-0.1), "tolerance must be zero or positive"),
    (lambda: Numeric("q?", answer=float("inf")), "finite"),
    (lambda: Prediction("q?", ""), "answer"),
])
def test_malformed_quizzes_raise_when_defined(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_checking_a_choice_that_does_not_exist_is_an_error():
    with pytest.raises(ValueError, match="out of range"):
        single().check(7)


# ----- live widget --------------------------------------------------------

def test_live_single_choice_widget_hints_when_wrong_and_explains_when_right():
    q = single()
    w = q.widget()
    w.check_button.click()
    assert "Choose an answer first" in w.feedback.value
    w.selector.value = 0
    w.check_button.click()
    assert "Not quite" in w.feedback.value and "one small reduction" in w.feedback.value
    # A wrong answer gets its hint only: neither the right choice nor the explanation.
    assert w.solution.value == "" and "Backward" not in w.feedback.value
    w.selector.value = 1
    w.check_button.click()
    assert "Correct" in w.feedback.value and q.explanation in w.solution.value
    # the verdict line names the right answer and why; the solution adds the explanation, not a repeat
    assert "Answer:" not in w.solution.value and q.choices[1].feedback in w.feedback.value
    w.reveal_button.click()
    assert "Answer:" in w.solution.value and q.explanation in w.solution.value


def test_live_show_answer_reveals_answer_and_explanation():
    for q, answer in ((single(), "Backward"), (numeric(), "2.5"), (multiple(), "Saved activations")):
        w = q.widget()
        assert w.solution.value == ""
        w.reveal_button.click()
        assert answer in w.solution.value and q.explanation in w.solution.value


def test_wrong_multiple_selection_names_no_correct_choice():
    q = MultipleSelect("Pick the even numbers.", [Choice("2", True, "Yes: 2 = 2 × 1."), Choice("3", feedback="Odd."),
                                                   Choice("4", True, "Yes: 4 = 2 × 2.")])
    v = q.check([0, 1])  # one right pick, one wrong pick
    assert not v.correct and "Odd." in v.feedback and "Yes:" not in v.feedback
    assert "Yes: 2" in q.check([0, 2]).feedback


def test_live_multiple_and_numeric_widgets():
    m = multiple().widget()
    for i in (0, 1, 3):
        m.selector.boxes[i].value = True
    m.check_button.click()
    assert "Correct" in m.feedback.value
    n = numeric().widget()
    n.selector.value = "4"
    n.check_button.click()
    assert "too high" in n.feedback.value and n.solution.value == ""  # direction, not the worked answer


def test_prediction_reveals_on_click():
    p = Prediction("Does pure bf16 training learn?", "It stalls: updates round away.")
    w = p.widget()
    assert "stalls" not in w.answer.value
    w.button.click()
    assert "stalls" in w.answer.value
    assert "stalls" not in p.static_html()  # encoded, revealed by the script (see below)


def _secrets(quiz) -> list[str]:
    """Every text a quiz must not show before it is answered: answer, explanation, feedback, verdicts."""
    if isinstance(quiz, Prediction):
        return [quiz.answer]
    out = [quiz.answer_html()] + ([quiz.explanation] if quiz.explanation else [])
    if isinstance(quiz, Numeric):
        return out + [part for m in quiz.messages().values() for part in m.split("{x}") if len(part.strip()) > 3]
    return out + [c.feedback for c in quiz.choices if c.feedback] + [quiz.check(0).feedback, "Correct.", "Not quite."]


@pytest.mark.parametrize("make", [single, multiple, numeric,
                                  lambda: Prediction("Does pure bf16 training learn?", "It stalls: updates round away.")])
def test_static_html_holds_no_answer_in_plain_form(make):
    # JupyterLab shows an untrusted notebook's outputs without their scripts and strips `hidden`:
    # whatever the HTML holds as text, hidden or not, a reader sees there. So it holds none of it.
    quiz = make()
    page = quiz._repr_mimebundle_()["text/html"]
    for secret in _secrets(quiz):
        for part in (secret, html_lib.escape(secret)):
            assert part.strip() not in page, f"{type(quiz).__name__}: {part!r} is in the HTML"
    assert "wtc-noscript" in page and "Run this cell" in page  # what shows where the script cannot run
    assert "hidden" not in quiz.static_html().split("<script")[0]  # nothing relies on the hidden attribute


def test_display_bundle_is_self_contained_html_without_a_widget_model():
    # No widget-view+json: a reopened notebook would show "model not found".
    bundle = single()._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"}
    html = bundle["text/html"]
    assert "<script" in html and "src=" not in html  # inline only, no external script
    assert single().static_html() == single().static_html()  # deterministic ids


def test_explorer_live_and_static_agree_on_outputs():
    e = Explorer(lambda devices, serial: f"{100 / (serial + (100 - serial) / devices):.2f}×",
                 {"devices": [1, 2, 4, 8], "serial": [0, 10, 20]}, title="Amdahl")
    outputs, index = e.table()
    assert len(index) == 12
    w = e.widget()
    w.inputs["devices"].value = 4
    w.inputs["serial"].value = 20
    assert w.output.value == "2.50×" == outputs[index[2 * 3 + 2]]
    with pytest.raises(ValueError, match="combinations"):
        Explorer(lambda a, b: "", {"a": list(range(100)), "b": list(range(100))})
    with pytest.raises(ValueError, match="no values"):
        Explorer(lambda a: "", {"a": []})


# ----- the static page in a real browser ----------------------------------

@pytest.mark.browser
@pytest.mark.slow  # starts Chromium
def test_static_verdicts_equal_python_verdicts_in_chromium(tmp_path):
    from lessonlib.book.interactive import _STYLE

    s, m, n = single(), multiple(), numeric()
    e = Explorer(lambda a, b: f"<b>{a}-{b}</b>", {"a": [1, 2, 3], "b": ["x", "y"]}, title="t")
    body = "".join(_STYLE + q.static_html() for q in (s, m, n, e))
    (tmp_path / "quiz.html").write_text(f"<!doctype html><html><head><link rel=\"icon\" href=\"data:,\"></head><body>{body}</body></html>")
    with serve(tmp_path) as base, browser() as b:
        page = b.new_page()
        errors = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(base + "quiz.html")

        def verdict(box):
            fb = box.locator(".wtc-feedback")
            return fb.get_attribute("data-correct") == "true", fb.inner_text()

        box = page.locator(".wtc-quiz[data-kind=single]")
        shown_at = display_order(s.question, len(s.choices)).index  # an input's value: its shown position
        for i in range(len(s.choices)):
            box.locator(f"input[type=radio][value='{shown_at(i)}']").check()
            box.locator("button.wtc-check").click()
            ok, text = verdict(box)
            py = s.check(i)
            assert ok == py.correct and text.endswith(py.feedback), (i, text, py)

        box = page.locator(".wtc-quiz[data-kind=multiple]")
        shown_at = display_order(m.question, len(m.choices)).index
        for subset in itertools.chain.from_iterable(itertools.combinations(range(4), k) for k in range(5)):
            for i in range(4):
                box.locator(f"input[type=checkbox][value='{shown_at(i)}']").set_checked(i in subset)
            box.locator("button.wtc-check").click()
            ok, text = verdict(box)
            py = m.check(list(subset))
            assert ok == py.correct and text.endswith(py.feedback), (subset, text, py)

        box = page.locator(".wtc-quiz[data-kind=numeric]")
        for typed in ["4", "2.5", "2.509", "2.52", "1", "2,5", " 2.50 ", "abc", ""]:
            box.locator("input[type=text]").fill(typed)
            box.locator("button.wtc-check").click()
            ok, text = verdict(box)
            py = n.check(typed)
            assert ok == py.correct and text.endswith(py.feedback), (typed, text, py)

        box = page.locator(".wtc-explorer")
        box.locator("input[type=range]").fill("2")
        box.locator("select").select_option("1")
        assert box.locator(".wtc-output").inner_text() == "3-y"
        assert errors == []


def test_static_quiz_hides_the_answer_until_right_or_revealed_in_chromium(tmp_path):
    from lessonlib.book.interactive import _STYLE

    n = Numeric("How many GB?", answer=7, tolerance=0, units="GB", explanation="Seven, worked out step by step.")
    s = single()
    body = _STYLE + n.static_html() + s.static_html()
    (tmp_path / "q.html").write_text(f"<!doctype html><html><head><link rel=\"icon\" href=\"data:,\"></head><body>{body}</body></html>")
    with serve(tmp_path) as base, browser() as b:
        page = b.new_page()
        page.goto(base + "q.html")
        text = page.locator("body").inner_text()
        assert "worked out" not in text and "Answer:" not in text and s.explanation not in text
        box = page.locator(".wtc-quiz[data-kind=numeric]")
        box.locator("input[type=text]").fill("9")
        box.locator("button.wtc-check").click()
        assert "too high" in box.locator(".wtc-feedback").inner_text()
        assert not box.locator(".wtc-explanation").is_visible()          # a hint, not the worked answer
        box.locator("button.wtc-reveal").click()
        assert box.locator(".wtc-explanation").is_visible()
        assert "Answer: 7 GB" in box.inner_text() and "worked out" in box.inner_text()
        box = page.locator(".wtc-quiz[data-kind=single]")
        box.locator(f"input[type=radio][value='{display_order(s.question, len(s.choices)).index(1)}']").check()
        box.locator("button.wtc-check").click()
        assert box.locator(".wtc-explanation").is_visible()              # a right answer explains
        # ... without repeating the answer its verdict line just gave; "Show answer" still adds it
        assert not box.locator(".wtc-answer").is_visible() and s.explanation in box.inner_text()
        box.locator("button.wtc-reveal").click()
        assert box.locator(".wtc-answer").is_visible()


def _page(tmp_path, body: str) -> None:
    (tmp_path / "q.html").write_text("<!doctype html><html><head><link rel=\"icon\" href=\"data:,\"></head>"
                                     f"<body>{body}</body></html>")


@pytest.mark.browser
@pytest.mark.slow  # starts Chromium
def test_without_scripts_no_answer_shows_and_a_line_says_to_run_the_cell(tmp_path):
    # What an untrusted notebook or a plain viewer shows: the HTML without its scripts, `hidden` ignored.
    from lessonlib.book.interactive import _STYLE

    p = Prediction("Does pure bf16 training learn?", "It stalls: updates round away.")
    quizzes = (single(), multiple(), numeric(), p)
    shown = "<style>[hidden]{display:block!important}</style>"  # as if `hidden` were stripped
    _page(tmp_path, _STYLE + shown + "".join(q.static_html() for q in quizzes))
    with serve(tmp_path) as base, browser() as b:
        ctx = b.new_context(java_script_enabled=False)
        page = ctx.new_page()
        page.goto(base + "q.html")
        text = page.locator("body").inner_text()
        for q in quizzes:
            for secret in _secrets(q):
                assert secret.strip() not in text, secret
        assert text.count("Run this cell") == len(quizzes)
        ctx.close()


@pytest.mark.browser
@pytest.mark.slow  # starts Chromium
def test_prediction_reveals_its_answer_on_click_in_chromium(tmp_path):
    from lessonlib.book.interactive import _STYLE

    p = Prediction("Does pure bf16 training learn?", "It <em>stalls</em>: updates round away.")
    _page(tmp_path, _STYLE + p.static_html())
    with serve(tmp_path) as base, browser() as b:
        page = b.new_page()
        page.goto(base + "q.html")
        box = page.locator(".wtc-prediction")
        assert "stalls" not in box.inner_text() and "Run this cell" not in box.inner_text()
        box.locator("button.wtc-reveal").click()
        assert "It stalls: updates round away." in box.inner_text()
        assert box.locator(".wtc-explanation em").inner_text() == "stalls"


@pytest.mark.browser
@pytest.mark.slow  # starts Chromium
def test_arrow_keys_move_a_slider_and_a_choice_and_stay_inside_the_widget(tmp_path):
    # JupyterLab and Notebook 7 handle keydown on the document (bubbling): a key that reaches it
    # moves to another cell instead of moving the slider. Here a document listener stands in for them.
    from lessonlib.book.interactive import _STYLE

    e = Explorer(lambda a: f"a={a}", {"a": [1, 2, 3, 4]}, title="t")
    s = single()
    _page(tmp_path, _STYLE + e.static_html() + s.static_html()
          + "<script>window.reached=[];document.addEventListener('keydown',e=>window.reached.push(e.key));</script>")
    with serve(tmp_path) as base, browser() as b:
        page = b.new_page()
        page.goto(base + "q.html")
        slider = page.locator(".wtc-explorer input[type=range]")
        slider.focus()
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        assert slider.input_value() == "2" and page.locator(".wtc-explorer .wtc-output").inner_text() == "a=3"
        page.keyboard.press("ArrowLeft")
        assert slider.input_value() == "1"
        radios = page.locator(".wtc-quiz input[type=radio]")
        radios.nth(0).check()
        page.keyboard.press("ArrowDown")
        assert radios.nth(1).is_checked()
        page.keyboard.press("d")
        assert page.evaluate("window.reached") == []
        page.keyboard.press("Shift+Enter")  # still runs the cell in JupyterLab
        assert [k for k in page.evaluate("window.reached") if k != "Shift"] == ["Enter"]
        box = page.locator(".wtc-quiz")
        assert box.get_attribute("data-lm-suppress-shortcuts") == "true"


def test_the_right_choice_is_not_always_shown_first():
    """Authors tend to list the right choice first; the page shows the choices in a shuffled order (the same on
    every build), so the first choice shown is the answer about 1 time in n. An input's value is its shown
    position: the page's source does not say which choice the author listed first either."""
    import re

    firsts = 0
    for k in range(40):
        q = SingleChoice(f"Question {k}?", [Choice("right", correct=True), Choice("a"), Choice("b"), Choice("c")])
        html = q.static_html()
        shown = re.findall(r'value="(\d+)"> (\w+)</label>', html)
        assert [v for v, _ in shown] == ["0", "1", "2", "3"]  # values in shown order: they carry no index
        firsts += shown[0][1] == "right"
    assert firsts < 20  # a fair shuffle: about 10 in 40; without one, 40
    assert q.static_html() == q.static_html()  # the same order on every build


def test_a_multiple_select_question_says_more_than_one_may_be_right():
    q = MultipleSelect("Which are even?", [Choice("2", True), Choice("4", True), Choice("5")])
    assert q.question == "Which are even? (Choose all that apply.)"
    assert "Choose all that apply" in q.static_html()
    said = MultipleSelect("Which are even? Choose all that apply.", [Choice("2", True), Choice("5")])
    assert said.question == "Which are even? Choose all that apply."  # not said twice
    for asked in ("Which are even? Select all.", "Which are even? SELECT ALL the even ones.",
                  "Choose all the even ones.", "Which are even? All That Apply."):
        assert MultipleSelect(asked, [Choice("2", True), Choice("5")]).question == asked  # any wording, any case
