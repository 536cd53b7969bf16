"""Headless Chromium for the tests: Debian's binary driven by Playwright.

Never ``playwright install``: that downloads a browser. The flags keep
Chromium from reaching for Google's services on a closed network.
"""
from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError(
        "Debian's chromium is needed for the browser tests: run scripts/test.sh as root "
        "(it installs it) or 'sudo apt-get install chromium'"
    )


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(root: Path):
    """Serve ``root`` on 127.0.0.1 at a free port; yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


#: Run before every page's own scripts: no page inherits a setting an earlier page stored
#: (the theme keeps its light/dark mode in local storage).
_FORGET = "try { localStorage.clear(); sessionStorage.clear(); } catch (e) {}"


@contextmanager
def shared_context(b, width: int = 1280):
    """One browser context for many pages, light mode, ``width`` px: the pages share the HTTP cache
    and compiled scripts, not their storage. (The browser tests took 37 s this way, 59 s with a
    context for each page.)"""
    ctx = b.new_context(viewport={"width": width, "height": 900}, color_scheme="light")
    ctx.add_init_script(_FORGET)
    try:
        yield ctx
    finally:
        ctx.close()


class Visit:
    """A page of the book opened in ``context`` (a :func:`shared_context`: its width, light mode) and
    loading; ``ready()`` waits until it is loaded.

    ``outside`` collects every request that leaves localhost and ``errors``
    every console error and uncaught exception, from the first request on.
    """

    def __init__(self, context, url: str):
        self.page = context.new_page()
        self.outside, self.errors = [], []
        self.page.on("request", lambda r: self.outside.append(r.url) if urlparse(r.url).scheme not in
                     ("data", "blob", "about") and urlparse(r.url).hostname != "127.0.0.1" else None)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.goto(url, wait_until="commit")

    def ready(self):
        self.page.wait_for_load_state("networkidle")  # MathJax's fonts and the figures, too
        return self.page


def visits(context, base: str, paths, ahead: int = 2):
    """Every page in ``context``, in order, each loaded: yields ``(path, visit)``.

    A load is mostly waiting (for the quiet half-second that "networkidle"
    means), so the next ``ahead`` pages start loading while one is read. Each
    page is closed once the caller is done with it.
    """
    todo = deque(paths)
    loading = deque()
    while todo or loading:
        while todo and len(loading) <= ahead:
            path = todo.popleft()
            loading.append((path, Visit(context, base + path)))
        path, visit = loading.popleft()
        visit.ready()
        try:
            yield path, visit
        finally:
            visit.page.close()


#: Visible characters of a built page, split into code, prose and other (outputs, widgets, buttons).
#: A text node counts only if it is rendered (not inside a closed <details>, a `hidden` element, or a
#: removed input). Code: a cell's input and any highlighted block in the prose.
#: Prose: the page's Markdown, including Markdown *outputs* (lessonlib.book.say); not printed
#: output, HTML reports, widgets, figures, buttons or header links.
CODE_PROSE_JS = """() => {
  const root = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const count = {code: 0, prose: 0, other: 0};
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const text = n.data.replace(/\\s+/g, ' ').trim();
    if (!text) continue;
    const el = n.parentElement;
    if (el.closest('script, style, .headerlink, button, summary, .toggle-details, .copybtn, .MathJax_Preview')) continue;
    // checkVisibility is false inside a closed <details> (whose text still has layout boxes in Chromium).
    if (!el.checkVisibility({visibilityProperty: true, opacityProperty: true})) continue;
    range.selectNodeContents(n);
    const r = range.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (el.closest('.cell_input')) count.code += text.length;
    else if (el.closest('.wtc-box, .output')) count.other += text.length;   // printed, HTML, widget outputs
    else if (el.closest('.cell_output')) count.prose += text.length;        // Markdown outputs (say)
    else if (el.closest('div.highlight, pre')) count.code += text.length;  // code blocks in the prose
    else count.prose += text.length;
  }
  return count;
}"""
