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

from browser import browser, serve


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
def test_page_is_offline_error_free_and_complete(site, path):
    base, b = site
    page, outside, errors = _open(b, base + path)
    audit = page.evaluate(_PAGE_AUDIT)
    page.close()
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
