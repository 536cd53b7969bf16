"""The built book in headless Chromium: contrast in light and dark mode, nothing clipped at 1280 and 390 px.

Contrast is the WCAG 2 ratio between an element's computed text colour and
the colour behind it (the first non-transparent background up the tree), for
every quiz and calculator text and control, after each quiz has been
answered (so feedback colours are on the page) and every "Reveal" opened.
Clipping: inside the article, an element whose content is wider than its box
must scroll (overflow-x auto/scroll); no element may stick out of the
article's right edge unless an ancestor scrolls; figures fit; a multi-panel
figure on a phone shows its stacked version at half its pixel size or more.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import browser, serve
from test_browser import PAGES

pytestmark = pytest.mark.browser
SHOTS = Path(__file__).resolve().parents[1] / "_build" / "screenshots"

_PREPARE = """() => {
  document.querySelectorAll('.wtc-box details').forEach(d => d.open = true);
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

_CLIPPED = """() => {
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
  }
  const figures = [];
  for (const img of article.querySelectorAll('.cell_output img')) {
    const r = img.getBoundingClientRect();
    if (r.right > right + 1) out.push('figure wider than the page: ' + img.alt.slice(0, 60));
    if (img.parentElement.tagName.toLowerCase() === 'picture' && img.naturalWidth)
      figures.push({alt: img.alt.slice(0, 50), phone: img.currentSrc !== img.src,
                    scale: r.width / img.naturalWidth});
  }
  return {clipped: out, figures};
}"""


@pytest.fixture(scope="module")
def site(built_book):
    with serve(built_book) as base, browser() as b:
        yield base, b


def _page(b, url, width):
    page = b.new_page(viewport={"width": width, "height": 900}, color_scheme="light")
    page.goto(url)
    page.wait_for_load_state("networkidle")
    return page


def _to_dark(page):
    """Switch a loaded page to dark mode as a reader's setting would, with no colour transitions left running."""
    page.add_style_tag(content="*,*::before,*::after{transition:none!important}")
    page.emulate_media(color_scheme="dark")
    page.evaluate("() => document.documentElement.setAttribute('data-theme', 'dark')")


@pytest.fixture(scope="module")
def looked(site):
    """Every page, loaded twice (not four times: loads are most of this phase's time).

    At 1280 px: clipping as loaded; then every quiz answered and every reveal
    opened, and contrast read in light mode, then again after switching to dark.
    At 390 px: clipping as loaded. Returns ``{"contrast": {mode: [(path, rows)]},
    "clipped": {width: [(path, found)]}}``; a screenshot of the first quiz in
    each mode goes to ``_build/screenshots``.
    """
    base, b = site
    SHOTS.mkdir(parents=True, exist_ok=True)
    out = {"contrast": {"light": [], "dark": []}, "clipped": {1280: [], 390: []}}
    shot = {"light": False, "dark": False}
    for path in PAGES:
        page = _page(b, base + path, 1280)
        out["clipped"][1280].append((path, page.evaluate(_CLIPPED)))
        page.evaluate(_PREPARE)
        for mode in ("light", "dark"):
            if mode == "dark":
                _to_dark(page)
            rows = page.evaluate(_CONTRAST)
            out["contrast"][mode].append((path, rows))
            if rows and not shot[mode]:
                page.locator(".wtc-quiz").first.scroll_into_view_if_needed()
                page.screenshot(path=str(SHOTS / f"book-quiz-{mode}.png"))
                shot[mode] = True
        page.close()
        page = _page(b, base + path, 390)
        out["clipped"][390].append((path, page.evaluate(_CLIPPED)))
        page.close()
    return out


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_quiz_and_calculator_contrast(looked, mode):
    bad, counted = [], 0
    for path, rows in looked["contrast"][mode]:
        counted += len(rows)
        bad += [f"{path}: {r['what']} {r['text']!r} {r['ratio']:.2f}:1" for r in rows if r["ratio"] < 4.5]
    print(f"{mode}: {counted} quiz/calculator texts and controls checked, {len(bad)} below 4.5:1")
    assert counted > 100, "too few quiz and calculator elements found: is the book built?"
    assert not bad, "contrast below 4.5:1:\n" + "\n".join(bad[:40])


@pytest.mark.parametrize("width", [1280, 390])
def test_nothing_clipped(looked, width):
    problems, pictures = [], 0
    for path, found in looked["clipped"][width]:
        problems += [f"{path}: {c}" for c in found["clipped"]]
        for f in found["figures"]:
            pictures += 1
            if width <= 700 and (not f["phone"] or f["scale"] < 0.5):
                problems.append(f"{path}: multi-panel figure not readable on a phone ({f['scale']:.2f} of its pixels, "
                                f"phone version: {f['phone']}): {f['alt']}")
    print(f"{width} px: {len(PAGES)} pages, {pictures} multi-panel figures, {len(problems)} problems")
    assert not problems, f"at {width} px:\n" + "\n".join(problems[:40])
