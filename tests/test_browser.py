"""The built book in headless Chromium: offline, error-free, complete, readable, and its quizzes answer.

Readable: contrast in light and dark mode, and nothing clipped at 1280 and 390 px.

Contrast is the WCAG 2 ratio between an element's computed text colour and
the colour behind it (the first non-transparent background up the tree), for
every quiz and calculator text and control, after each quiz has been
answered (so feedback colours are on the page) and every "Reveal" opened.
Clipping: inside the article, an element whose content is wider than its box
must scroll (overflow-x auto/scroll); no element may stick out of the
article's right edge unless an ancestor scrolls; figures fit; a multi-panel
figure on a phone shows its stacked version at half its pixel size or more.

These tests never skip: without Debian's chromium they fail with a message
saying how to install it (scripts/test.sh installs it when run as root).
"""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT, chapter_notebooks
from lessonlib.book.quiz import Numeric

from browser import CODE_PROSE_JS, Visit, browser, serve, shared_context, visits


def book_pages() -> list[str]:
    toc = (ROOT / "_toc.yml").read_text()
    # index.html only redirects to the root page (intro.html).
    root = re.search(r"^root:\s*(\S+)", toc, re.M).group(1)
    return [f"{root}.html"] + [f"{entry}.html" for entry in re.findall(r"file:\s*(\S+)", toc)]


PAGES = book_pages()
SHOTS = Path(__file__).resolve().parents[1] / "_build" / "screenshots"
LAYOUT = "layout"  # looked[LAYOUT]: what the contrast and clipping tests read, over every page

_PAGE_AUDIT = r"""() => ({
  brokenImages: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
  figuresWithoutAlt: Array.from(document.querySelectorAll('.cell_output img'))
      .filter(i => !i.alt || /(^|\/)_images\//.test(i.alt)).map(i => i.src),  // Sphinx's alt: the file's path
  emptyOutputs: Array.from(document.querySelectorAll('.cell_output'))
      // an output folded behind a toggle (a hide-output cell) has no innerText until opened: read its text instead
      .filter(e => (e.closest('details') ? e.textContent : e.innerText).trim() === ''
                   && !e.querySelector('img,svg,canvas,iframe,input,select,details'))
      .map(e => e.outerHTML.slice(0, 200)),
})"""


@pytest.fixture(scope="module")
def site(built_book):
    with serve(built_book) as base, browser() as b, shared_context(b) as ctx:
        yield base, ctx


@pytest.mark.parametrize("path", PAGES)
def test_page_is_offline_error_free_and_complete(looked, path):
    seen = looked[path]
    outside, errors, audit = seen["outside"], seen["errors"], seen["audit"]
    assert outside == [], f"{path} made requests that leave localhost: {outside}"
    assert errors == [], f"{path} logged console errors: {errors}"
    assert audit["brokenImages"] == [], f"{path}: figures that did not load: {audit['brokenImages']}"
    assert audit["figuresWithoutAlt"] == [], f"{path}: figures without alt text: {audit['figuresWithoutAlt']}"
    assert audit["emptyOutputs"] == [], f"{path}: empty output areas: {audit['emptyOutputs']}"


def _first_page_with(site, looked, kind):
    """The first page with a quiz of ``kind`` (known from ``looked``), opened afresh."""
    base, context = site
    path = next((p for p in PAGES if any(q["kind"] == kind for q in looked[p].get("quizzes", ()))), None)
    assert path, f"no page of the book has a {kind} quiz"
    return Visit(context, base + path).ready()


def _data(box) -> dict:
    """A quiz's data, decoded as its script does (base64 of JSON: the page holds no answer as text)."""
    return json.loads(base64.b64decode(box.locator("script.wtc-data").text_content()))


def _verdict(box):
    fb = box.locator(".wtc-feedback")
    return fb.get_attribute("data-correct") == "true", fb.inner_text()


def test_choice_quiz_in_the_book_answers_wrong_then_right_like_python(site, looked):
    page = _first_page_with(site, looked, "single")
    box = page.locator(".wtc-quiz[data-kind=single]").first
    # The verdicts Python computed for every choice when the page was built.
    data = _data(box)
    radios = box.locator("input[type=radio]")
    seen = set()
    order = sorted(range(radios.count()), key=lambda i: data["verdicts"][i][0])  # wrong first, then right
    for i in order:
        box.locator(f"input[type=radio][value='{i}']").check()  # by its index: the page shuffles the order
        box.locator("button.wtc-check").click()
        ok, text = _verdict(box)
        assert ok == data["verdicts"][i][0] and text.endswith(data["verdicts"][i][1])
        seen.add(ok)
    assert seen == {False, True}
    page.close()


def test_numeric_quiz_in_the_book_answers_wrong_then_right_like_python(site, looked):
    page = _first_page_with(site, looked, "numeric")
    box = page.locator(".wtc-quiz[data-kind=numeric]").first
    data = _data(box)
    # Rebuild the Python quiz from what the page embeds and compare verdicts.
    quiz = Numeric("q", answer=data["answer_value"], tolerance=data["tolerance"])
    quiz.messages = lambda: data["messages"]  # the texts, with the quiz's units, as built
    wrong = f"{data['answer_value'] + 10 * data['tolerance'] + 1:g}"
    right = f"{data['answer_value']:g}"
    for typed, expect in ((wrong, False), (right, True)):
        box.locator("input[type=text]").fill(typed)
        box.locator("button.wtc-check").click()
        ok, text = _verdict(box)
        py = quiz.check(typed)
        assert ok is expect is py.correct and text.endswith(py.feedback), (typed, text, py)
    page.close()



LESSONS = [p for p in PAGES if re.match(r"chapters/[^/]+/\d\d-", p)]
#: Visible code at most this share of visible prose, in characters.
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
    assert len(rows) == len(chapter_notebooks()) and not over, f"visible code above 1/3 of the prose: {over}\n{table}"


#: A quiz's encoded data (lessonlib.book.quiz._encode), decoded as its script does.
_DECODE = r"""const decode = box => { const b = atob(box.querySelector('script.wtc-data').textContent.trim());
  return JSON.parse(new TextDecoder().decode(Uint8Array.from(b, c => c.charCodeAt(0)))); };"""

_QUIZ_SECRETS = r"""() => { """ + _DECODE + r"""
 return Array.from(document.querySelectorAll('.wtc-quiz')).map(box => {
  const d = decode(box);
  const ex = box.querySelector('.wtc-explanation');
  const right = (d.verdicts || []).filter(v => v[0]).map(v => v[1].replace(/^Correct\.\s*/, ''));
  const plain = s => { const e = document.createElement('div'); e.innerHTML = s; return e.textContent.trim(); };
  return {kind: d.kind, explanationVisible: !!ex && ex.checkVisibility(), html: box.innerHTML,
          secrets: [plain(d.answer), plain(d.explanation || '')].filter(t => t.length > 12),
          rightFeedback: right.filter(t => t.length > 12)};
 });
}"""


@pytest.mark.parametrize("path", [p for p in PAGES if p.startswith("chapters/")])
def test_no_quiz_answer_is_visible_before_answering(looked, path):
    seen = looked[path]
    quizzes, visible, tree, answers = seen["quizzes"], seen["visible"], seen["tree"], seen["predictions"]
    for q in quizzes:
        assert not q["explanationVisible"], f"{path}: an explanation shows before any answer"
        for text in q["rightFeedback"] + q["secrets"]:
            assert text not in visible, f"{path}: a quiz's answer or right feedback is on the page: {text[:80]}"
            assert text[:40] not in q["html"], f"{path}: a quiz's HTML holds its answer: {text[:80]}"
    for a in answers:  # prediction prompts: revealed by their script on a click, not in the page before
        assert a and a not in visible and a[:40] not in tree, f"{path}: a prediction's answer shows: {a}"


@pytest.mark.parametrize("path", LESSONS)
def test_environment_line_is_not_cut_off(looked, path):
    text, fits = looked[path]["env_line"]
    assert text.startswith("measures on:"), text[:120]
    assert fits, f"{path}: the environment line is wider than its box: {text}"


@pytest.fixture(scope="module")
def looked(site):
    """Every page of the book, loaded once at 1280 px, and everything the tests read taken from that load.

    Page loads are most of this phase's time. First, as a reader sees the page
    (nothing clicked): the requests and console errors from the start, the
    audit of figures and outputs, and on chapter pages the quiz secrets, the
    visible text, the accessibility tree, the code/prose count and the
    environment line. Then clipping as loaded, at 1280 px and with the window
    narrowed to 390 px (a phone's width). Then, back at 1280 px, every quiz
    answered and every reveal opened, and contrast read in light mode, then
    again after switching to dark.

    Returns ``{path: {...}}`` and, under ``LAYOUT``, ``{"contrast": {mode:
    [(path, rows)]}, "clipped": {width: [(path, found)]}}``; a screenshot of
    the first quiz in each mode goes to ``_build/screenshots``.
    """
    base, context = site
    SHOTS.mkdir(parents=True, exist_ok=True)
    out = {LAYOUT: {"contrast": {"light": [], "dark": []}, "clipped": {1280: [], 390: []}}}
    shot = {"light": False, "dark": False}
    for path, visit in visits(context, base, PAGES):
        page = visit.page
        out[path] = _first_look(page, path)
        out[LAYOUT]["clipped"][1280].append((path, page.evaluate(_CLIPPED)))
        _resize(page, 390)
        out[LAYOUT]["clipped"][390].append((path, page.evaluate(_CLIPPED)))
        _resize(page, 1280)
        page.evaluate(_PREPARE)
        for mode in ("light", "dark"):
            if mode == "dark":
                _to_dark(page)
            rows = page.evaluate(_CONTRAST)
            out[LAYOUT]["contrast"][mode].append((path, rows))
            if rows and not shot[mode]:
                page.locator(".wtc-quiz").first.scroll_into_view_if_needed()
                page.screenshot(path=str(SHOTS / f"book-quiz-{mode}.png"))
                shot[mode] = True
        # requests and errors while the page was read and its quizzes answered (lists complete at close)
        out[path]["outside"], out[path]["errors"] = visit.outside, visit.errors
    return out


#: True once every image has loaded and each ``<picture>`` shows the source its media query picks.
_PICTURES_SETTLED = """() => Array.from(document.images).every(i => i.complete) &&
  Array.from(document.querySelectorAll('picture')).every(p => {
    const s = Array.from(p.querySelectorAll('source')).find(s => !s.media || matchMedia(s.media).matches);
    return !s || p.querySelector('img').currentSrc === s.getAttribute('srcset');
  })"""


def _resize(page, width):
    """The window made ``width`` px wide, as a phone or a narrowed browser shows the page; waits until the
    figures show the version for that width. (Checked against fresh loads at 390 px: the same result on
    every page, for a third of the browser's work.)"""
    page.set_viewport_size({"width": width, "height": 900})
    page.wait_for_function(_PICTURES_SETTLED)


def _first_look(page, path):
    seen = {"audit": page.evaluate(_PAGE_AUDIT)}
    if path.startswith("chapters/"):
        seen["quizzes"] = page.evaluate(_QUIZ_SECRETS)
        seen["visible"] = page.locator("body").inner_text()
        seen["tree"] = page.locator("body").aria_snapshot()
        seen["predictions"] = page.evaluate(
            "() => { " + _DECODE + " return Array.from(document.querySelectorAll('.wtc-prediction')).map(box => {"
            " const e = document.createElement('div'); e.innerHTML = decode(box).answer;"
            " return e.textContent.trim().slice(0, 60); }); }")
    if path in LESSONS:
        seen["code_prose"] = page.evaluate(CODE_PROSE_JS)
        first = page.locator(".cell_output pre").first
        seen["env_line"] = (first.inner_text(), first.evaluate("e => e.scrollWidth <= e.clientWidth"))
    return seen


# ---------------------------------------------------------------------------
# readable: contrast and clipping
# ---------------------------------------------------------------------------

_PREPARE = """() => {
  document.querySelectorAll('.wtc-prediction button.wtc-reveal').forEach(b => b.click());
  document.querySelectorAll('.wtc-quiz').forEach((q, i) => {
    const inputs = q.querySelectorAll('input[type=radio],input[type=checkbox]');
    if (inputs.length) inputs[i % inputs.length].checked = true;
    const t = q.querySelector('input[type=text]'); if (t) t.value = '1';
    q.querySelector('button.wtc-check').click();
  });
}"""

_CONTRAST = """() => {
  function rgba(s) { const m = s.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; }
  function lum(c) { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); }
  function behind(el) { const layers = [];
    for (let e = el; e; e = e.parentElement) { const c = rgba(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; } }
    let out = [255, 255, 255];
    for (const c of layers.reverse()) out = out.map((v, i) => v * (1 - c[3]) + c[i] * c[3]);
    return out; }
  function ratio(a, b) { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); }
  const rows = [];
  for (const box of document.querySelectorAll('.wtc-box')) {
    for (const el of [box, ...box.querySelectorAll('*')]) {
      const st = getComputedStyle(el);
      if (st.display === 'none' || st.visibility === 'hidden' || el.closest('[hidden]')) continue;
      const tag = el.tagName.toLowerCase();
      if (['script', 'style'].includes(tag)) continue;
      const ownText = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
      const control = ['button', 'select', 'input', 'summary', 'output'].includes(tag);
      if (!ownText && !control) continue;
      let fg = rgba(st.color);
      const type = (el.getAttribute('type') || '').toLowerCase();
      const accented = ['radio', 'checkbox', 'range'].includes(type);
      if (accented) {  // the control's colour is its accent-color; 'auto' (the browser's own) is not ours to vouch for
        if (!rgba(st.accentColor)) { rows.push({what: tag + '[' + type + '] accent-color not set', text: '', ratio: 0}); continue; }
        fg = rgba(st.accentColor); }
      const bg = behind(accented ? el.parentElement : el);
      const blended = fg.slice(0, 3).map((v, i) => v * fg[3] + bg[i] * (1 - fg[3]));
      rows.push({what: tag + (type ? '[' + type + ']' : '') + (el.className ? '.' + String(el.className).split(' ')[0] : ''),
                 text: (el.innerText || el.value || '').trim().slice(0, 40), ratio: ratio(blended, bg)});
    }
  }
  return rows;
}"""

#: The smallest text a figure may show on a phone, in CSS px (lessonlib.book.plots.PHONE_MIN_FONT_PT gives 8.4).
READABLE_PX = 8

_CLIPPED = """() => {
  const narrow = window.innerWidth <= 700;  // lessonlib.book.plots.PHONE_MAX_WIDTH
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  const right = article.getBoundingClientRect().right;
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const out = [];
  for (const el of article.querySelectorAll('*')) {
    const st = getComputedStyle(el);
    if (st.display === 'none' || st.visibility === 'hidden' || st.position === 'fixed') continue;
    if (['script', 'style', 'mjx-assistive-mml'].includes(el.tagName.toLowerCase())) continue;
    let scroller = false; for (let a = el.parentElement; a && a !== article; a = a.parentElement) if (scrolls(a)) { scroller = true; break; }
    if (scroller) continue;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > right + 1) out.push('sticks out by ' + Math.round(r.right - right) + ' px: ' + el.outerHTML.slice(0, 120));
    else if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0 && !scrolls(el) && st.overflowX !== 'visible')
      out.push('cut off inside: ' + el.outerHTML.slice(0, 120));
    // On a phone a scroll box hides what is past its edge (a table's last column, a printed line's end):
    // every table, printed output and code block must fit the screen instead.
    // Printed output (div.cell_output pre) wraps at every width: its scroll box cut 2.4's file list at 1280 px.
    else if ((narrow || el.matches('div.cell_output pre')) && scrolls(el) && el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0)
      out.push('cut off inside a scroll box by ' + (el.scrollWidth - el.clientWidth) + ' px: ' + el.outerHTML.slice(0, 120));
  }
  // A text column squeezed to a word a line (the table fit by starving it, as 1.4's recipe table did): on a wide
  // screen a long cell (lessonlib.book.tables.LONG_CELL marks it wtc-long) keeps 14em and the table scrolls instead.
  if (!narrow) for (const td of article.querySelectorAll('td.wtc-long')) {
    const w = td.getBoundingClientRect().width, em = parseFloat(getComputedStyle(td).fontSize);
    if (w > 0 && w < 10 * em) out.push('text column squeezed to ' + Math.round(w) + ' px: ' + td.textContent.slice(0, 60));
  }
  const figures = [];
  for (const img of article.querySelectorAll('.cell_output img')) {
    const r = img.getBoundingClientRect();
    if (r.right > right + 1) out.push('figure wider than the page: ' + img.alt.slice(0, 60));
    // The smallest text of the version shown (lessonlib.book.plots.Figure), in CSS px as drawn.
    const phone = img.currentSrc !== img.src, font = img.dataset[phone ? 'phoneFontPx' : 'fontPx'];
    if (narrow && r.width > 0 && img.naturalWidth) {
      if (!font) out.push('figure without its text size (not shown with lessonlib.book.plots.show): ' + img.alt.slice(0, 60));
      else if (Number(font) * r.width / img.naturalWidth < READABLE)
        out.push('figure text ' + (Number(font) * r.width / img.naturalWidth).toFixed(1) + ' CSS px on a phone: ' + img.alt.slice(0, 60));
    }
    if (img.parentElement.tagName.toLowerCase() === 'picture' && img.naturalWidth)
      figures.push({alt: img.alt.slice(0, 50), phone: img.currentSrc !== img.src,
                    scale: r.width / img.naturalWidth});
  }
  return {clipped: out, figures};
}""".replace("READABLE", str(READABLE_PX))


def _to_dark(page):
    """Switch a loaded page to dark mode as a reader's setting would, with no colour transitions left running."""
    page.add_style_tag(content="*,*::before,*::after{transition:none!important}")
    page.emulate_media(color_scheme="dark")
    page.evaluate("() => document.documentElement.setAttribute('data-theme', 'dark')")


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_quiz_and_calculator_contrast(looked, mode):
    bad, counted = [], 0
    for path, rows in looked[LAYOUT]["contrast"][mode]:
        counted += len(rows)
        bad += [f"{path}: {r['what']} {r['text']!r} {r['ratio']:.2f}:1" for r in rows if r["ratio"] < 4.5]
    print(f"{mode}: {counted} quiz/calculator texts and controls checked, {len(bad)} below 4.5:1")
    assert counted > 100, "too few quiz and calculator elements found: is the book built?"
    assert not bad, "contrast below 4.5:1:\n" + "\n".join(bad[:40])


@pytest.mark.parametrize("width", [1280, 390])
def test_nothing_clipped(looked, width):
    problems, pictures = [], 0
    for path, found in looked[LAYOUT]["clipped"][width]:
        problems += [f"{path}: {c}" for c in found["clipped"]]
        for f in found["figures"]:
            pictures += 1
            if width <= 700 and (not f["phone"] or f["scale"] < 0.5):
                problems.append(f"{path}: multi-panel figure not readable on a phone ({f['scale']:.2f} of its pixels, "
                                f"phone version: {f['phone']}): {f['alt']}")
    print(f"{width} px: {len(PAGES)} pages, {pictures} multi-panel figures, {len(problems)} problems")
    assert not problems, f"at {width} px:\n" + "\n".join(problems[:40])
