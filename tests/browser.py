"""Headless Chromium for the tests: Debian's binary driven by Playwright.

Never ``playwright install``: that downloads a browser. The flags keep
Chromium from reaching for Google's services on a closed network.
"""
from __future__ import annotations

import functools
import http.server
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path

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
