"""The built book in headless Chromium: offline, error-free, complete, and its quizzes answer.

These tests never skip: without Debian's chromium they fail with a message
saying how to install it (scripts/test.sh installs it when run as root).
"""
from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import pytest

from conftest import ROOT
from lessonlib.book.quiz import Numeric

from browser import CODE_PROSE_JS, browser, serve


def book_pages() -> list[str]:
    toc = (ROOT / "_toc.yml").read_text()
    # index.html only redirects to the root page (intro.html).
    root = re.search(r"^root:\s*(\S+)", toc, re.M).group(1)
    return [f"{root}.html"] + [f"{entry}.html" for entry in re.findall(r"file:\s*(\S+)", toc)]


PAGES = book_pages()

_PAGE_AUDIT = """() => ({
  brokenImages: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
  figuresWithoutAlt: Array.from(document.querySelectorAll('.cell_output img'))
      .filter(i => !i.alt || i.alt.startsWith('_images/')).map(i => i.src),
  emptyOutputs: Array.from(document.querySelectorAll('.cell_output'))
      .filter(e => e.innerText.trim() === '' && !e.querySelector('img,svg,canvas,iframe,input,select,details'))
      .map(e => e.outerHTML.slice(0, 200)),
})"""


@pytest.fixture(scope="module")
def site(built_book):
    with serve(built_book) as base, browser() as b:
        yield base, b


def _open(b, url):
    page = b.new_page(viewport={"width": 1280, "height": 900})
    outside, errors = [], []
    page.on("request", lambda r: outside.append(r.url)
            if urlparse(r.url).scheme not in ("data", "blob", "about") and urlparse(r.url).hostname != "127.0.0.1"
            else None)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.wait_for_load_state("networkidle")
    return page, outside, errors


@pytest.mark.parametrize("path", PAGES)
def test_page_is_offline_error_free_and_complete(looked, path):
    seen = looked[path]
    outside, errors, audit = seen["outside"], seen["errors"], seen["audit"]
    assert outside == [], f"{path} made requests that leave localhost: {outside}"
    assert errors == [], f"{path} logged console errors: {errors}"
    assert audit["brokenImages"] == [], f"{path}: figures that did not load: {audit['brokenImages']}"
    assert audit["figuresWithoutAlt"] == [], f"{path}: figures without alt text: {audit['figuresWithoutAlt']}"
    assert audit["emptyOutputs"] == [], f"{path}: empty output areas: {audit['emptyOutputs']}"


def _first_page_with(site, selector):
    base, b = site
    for path in PAGES:
        page, _, _ = _open(b, base + path)
        if page.locator(selector).count():
            return page
        page.close()
    raise AssertionError(f"no page of the book has a {selector}")


def _verdict(box):
    fb = box.locator(".wtc-feedback")
    return fb.get_attribute("data-correct") == "true", fb.inner_text()


def test_choice_quiz_in_the_book_answers_wrong_then_right_like_python(site):
    page = _first_page_with(site, ".wtc-quiz[data-kind=single]")
    box = page.locator(".wtc-quiz[data-kind=single]").first
    # The verdicts Python computed for every choice when the page was built.
    data = json.loads(box.locator("script[type='application/json']").text_content())
    radios = box.locator("input[type=radio]")
    seen = set()
    order = sorted(range(radios.count()), key=lambda i: data["verdicts"][i][0])  # wrong first, then right
    for i in order:
        radios.nth(i).check()
        box.locator("button.wtc-check").click()
        ok, text = _verdict(box)
        assert ok == data["verdicts"][i][0] and text.endswith(data["verdicts"][i][1])
        seen.add(ok)
    assert seen == {False, True}
    page.close()


def test_numeric_quiz_in_the_book_answers_wrong_then_right_like_python(site):
    page = _first_page_with(site, ".wtc-quiz[data-kind=numeric]")
    box = page.locator(".wtc-quiz[data-kind=numeric]").first
    data = json.loads(box.locator("script[type='application/json']").text_content())
    # Rebuild the Python quiz from what the page embeds and compare verdicts.
    quiz = Numeric("q", answer=data["answer"], tolerance=data["tolerance"])
    quiz.messages = lambda: data["messages"]  # the texts, with the quiz's units, as built
    wrong = f"{data['answer'] + 10 * data['tolerance'] + 1:g}"
    right = f"{data['answer']:g}"
    for typed, expect in ((wrong, False), (right, True)):
        box.locator("input[type=text]").fill(typed)
        box.locator("button.wtc-check").click()
        ok, text = _verdict(box)
        py = quiz.check(typed)
        assert ok is expect is py.correct and text.endswith(py.feedback), (typed, text, py)
    page.close()



LESSONS = [p for p in PAGES if re.match(r"chapters/[^/]+/\d\d-", p)]
#: Visible code at most this share of visible prose, in characters (issue 11).
MAX_CODE_OVER_PROSE = 1 / 3


def test_code_is_at_most_a_third_of_the_prose_on_every_lesson_page(looked, built_book):
    rows = []
    for path in LESSONS:
        c = looked[path]["code_prose"]
        rows.append((path, c["code"], c["prose"], c["code"] / max(c["prose"], 1)))
    table = "\n".join([f"{'page':62s} {'code':>6s} {'prose':>6s} {'code/prose':>10s}"] +
                      [f"{p:62s} {c:6d} {r:6d} {x:10.2f}" for p, c, r, x in rows])
    print("\n" + table)
    (built_book.parent / "code_prose_ratio.txt").write_text(table + "\n")
    over = [(p, round(x, 2)) for p, _, _, x in rows if x > MAX_CODE_OVER_PROSE]
    assert len(rows) == 18 and not over, f"visible code above 1/3 of the prose: {over}\n{table}"


_QUIZ_SECRETS = r"""() => Array.from(document.querySelectorAll('.wtc-quiz')).map(box => {
  const d = JSON.parse(box.querySelector("script[type='application/json']").textContent);
  const ex = box.querySelector('.wtc-explanation');
  const right = (d.verdicts || []).filter(v => v[0]).map(v => v[1].replace(/^Correct\.\s*/, ''));
  return {kind: d.kind, explanationVisible: !!ex && ex.checkVisibility(),
          explanation: ex ? ex.innerText.trim() : '', rightFeedback: right.filter(t => t.length > 12)};
})"""


@pytest.mark.parametrize("path", [p for p in PAGES if p.startswith("chapters/")])
def test_no_quiz_answer_is_visible_before_answering(looked, path):
    seen = looked[path]
    quizzes, visible, tree, answers = seen["quizzes"], seen["visible"], seen["tree"], seen["predictions"]
    for q in quizzes:
        assert not q["explanationVisible"], f"{path}: an explanation shows before any answer: {q['explanation'][:80]}"
        for text in q["rightFeedback"]:
            assert text not in visible, f"{path}: the right choice's feedback is on the page: {text[:80]}"
    for a in answers:  # prediction prompts: in a closed <details>, neither shown nor in the accessibility tree
        assert a and a not in visible and a[:40] not in tree, f"{path}: a prediction's answer shows: {a}"


def test_no_glue_role_text_in_the_built_html(built_book):
    bad = [str(p.relative_to(built_book)) for p in built_book.rglob("*.html") if "{glue" in p.read_text(errors="replace")]
    assert not bad, f"raw glue roles in: {bad}"


@pytest.mark.parametrize("path", LESSONS)
def test_environment_line_is_not_cut_off(looked, path):
    text, fits = looked[path]["env_line"]
    assert text.startswith("measures on:"), text[:120]
    assert fits, f"{path}: the environment line is wider than its box: {text}"


@pytest.fixture(scope="module")
def looked(site):
    """Every page of the book, loaded once, as a reader first sees it (nothing clicked).

    Page loads are most of this phase's time, so each page is opened once and
    everything the per-page tests read is taken from that one load: the
    requests and console errors from the start, the audit of figures and
    outputs, and on chapter pages the quiz secrets, the visible text, the
    accessibility tree, the code/prose count and the environment line.
    """
    base, b = site
    out = {}
    for path in PAGES:
        page, outside, errors = _open(b, base + path)
        seen = {"audit": page.evaluate(_PAGE_AUDIT)}
        if path.startswith("chapters/"):
            seen["quizzes"] = page.evaluate(_QUIZ_SECRETS)
            seen["visible"] = page.locator("body").inner_text()
            seen["tree"] = page.locator("body").aria_snapshot()
            seen["predictions"] = page.evaluate(
                "() => Array.from(document.querySelectorAll('.wtc-prediction .wtc-explanation'))"
                ".map(e => e.textContent.trim().slice(0, 60))")
        if path in LESSONS:
            seen["code_prose"] = page.evaluate(CODE_PROSE_JS)
            first = page.locator(".cell_output pre").first
            seen["env_line"] = (first.inner_text(), first.evaluate("e => e.scrollWidth <= e.clientWidth"))
        page.close()
        seen["outside"], seen["errors"] = list(outside), list(errors)  # everything up to the close
        out[path] = seen
    return out
