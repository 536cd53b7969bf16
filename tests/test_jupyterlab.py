"""One chapter notebook in JupyterLab 4, driven by headless Chromium.

A fresh venv (torch, ipykernel, ipywidgets 8, matplotlib, and jupyterlab)
serves a copy of the notebook on 127.0.0.1 with a token. The test runs all
cells (the setup cell installs lessonlib from a local bare repository, as on
Colab), checks in the saved file that every code cell ran without an error,
answers a quiz wrong then right, and moves a calculator slider; then it saves,
shuts the kernel down and reloads the page, as a reader reopening the notebook
would (JupyterLab starts a fresh kernel, which holds none of the first run's
objects), and checks that no widget error shows and the quiz still answers.
Screenshots go to _build/screenshots/.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import colab_env as ce
from browser import browser
from conftest import ROOT

pytestmark = [pytest.mark.environments, pytest.mark.slow, pytest.mark.browser]
NOTEBOOK = ROOT / "chapters" / "03-distributed-speedup" / "01-amdahl.ipynb"
SHOTS = ROOT / "_build" / "screenshots"
TOKEN = "wtc-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("lab")
    source = ce.bare_repository(base / "course.git")
    venv = ce.make_venv(base / "venv", "8", extra=("jupyterlab",))
    # No "get notified about official Jupyter news?" toast over the page (and no request for it).
    settings = venv / "share" / "jupyter" / "lab" / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "overrides.json").write_text(json.dumps(
        {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}))
    work = base / "work"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    port = _free_port()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(base), "LESSONLIB_SOURCE": source,
           "JUPYTER_PLATFORM_DIRS": "1"}
    log = open(base / "lab.log", "w")
    proc = subprocess.Popen(
        [str(venv / "bin" / "jupyter"), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={work}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--allow-root"] if os.geteuid() == 0 else []),
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("jupyter lab exited:\n" + (base / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        else:
            pytest.fail("jupyter lab did not start in 120 s")
        yield url, work
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


_ALL_RAN = """() => {
  // A cell whose input is collapsed (jupyter.source_hidden) shows no prompt: count the others.
  const shown = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim()).filter(Boolean);
  const idle = document.body.innerText.includes('Python 3 (ipykernel) | Idle');
  return idle && shown.length > 0 && shown.every(t => /\\[\\d+\\]/.test(t));
}"""


def _saved_code_cells(page, path: Path) -> list[dict]:
    """Save the notebook (Ctrl+S) and return its code cells as written to disk."""
    before = path.stat().st_mtime_ns
    page.keyboard.press("Control+s")
    for _ in range(50):
        if path.stat().st_mtime_ns != before:
            break
        page.wait_for_timeout(200)
    page.wait_for_timeout(300)  # let the write finish
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _run_all_and_wait(page, saved: Path, timeout_s=600) -> list[dict]:
    """Run > Run All Cells, then wait until every code cell has run; returns the saved code cells.

    The prompts alone cannot tell: most cells of a lesson have their input
    collapsed and show no prompt, and the kernel reads "Idle" for a moment
    between two queued cells. So once the page looks done, the notebook is
    saved and every code cell must have an execution count in the file.
    """
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=120_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()
    deadline = time.time() + timeout_s
    cells = []
    traceback = page.locator("[data-mime-type='application/vnd.jupyter.stderr']").filter(has_text="Traceback")
    while time.time() < deadline:
        if traceback.count():  # Run All stops at a failing cell: say so now, not at the deadline
            raise AssertionError("a cell failed:\n" + traceback.first.inner_text()[-3000:])
        if page.evaluate(_ALL_RAN):
            cells = _saved_code_cells(page, saved)
            if all(c.get("execution_count") for c in cells):
                return cells
        page.wait_for_timeout(1000)
    page.screenshot(path=str(SHOTS / "jupyterlab-timeout.png"))
    counts = [c.get("execution_count") for c in cells]
    first = page.locator(".jp-CodeCell .jp-OutputArea").first.inner_text()[:1500]
    raise AssertionError(f"the notebook did not finish running in time; saved execution counts {counts}; "
                         f"first output:\n{first}")


def _answer_single_choice(page):
    box = page.locator(".wtc-quiz[data-kind=single]").first
    box.scroll_into_view_if_needed()
    data = json.loads(base64.b64decode(box.locator("script.wtc-data").text_content()))
    verdicts = [v[0] for v in data["verdicts"]]
    results = []
    for i in (verdicts.index(False), verdicts.index(True)):  # wrong first, then right
        box.locator("input[type=radio]").nth(i).check()
        box.locator("button.wtc-check").click()
        results.append(box.locator(".wtc-feedback").get_attribute("data-correct"))
    return box, results


def test_run_answer_slide_and_reopen_in_jupyterlab(lab):
    url, work = lab
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser() as b:
        page = b.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{url}/lab/tree/{NOTEBOOK.name}?token={TOKEN}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        cells = _run_all_and_wait(page, work / NOTEBOOK.name)
        raised = [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
        assert not raised, [f"{o['ename']}: {o['evalue']}" for o in raised]
        errs = page.locator("[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
        failed = [e for e in errs if "Traceback" in e or "Error" in e]
        assert not failed, failed[:1]
        page.screenshot(path=str(SHOTS / "jupyterlab-after-run.png"))

        box, results = _answer_single_choice(page)
        assert results == ["false", "true"], results
        assert "Not quite" not in box.locator(".wtc-feedback").inner_text()
        page.screenshot(path=str(SHOTS / "jupyterlab-quiz-answered.png"))

        calc = page.locator(".wtc-explorer").filter(has=page.locator("input[type=range]")).first
        calc.scroll_into_view_if_needed()
        slider = calc.locator("input[type=range]").first
        before = calc.locator(".wtc-output").inner_text()
        top = slider.get_attribute("max")
        slider.fill(top if slider.input_value() != top else "0")
        after = calc.locator(".wtc-output").inner_text()
        assert after != before, "moving the slider did not change the calculator's output"
        page.screenshot(path=str(SHOTS / "jupyterlab-slider-moved.png"))

        # Save, shut the kernel down and reopen: what a reader sees the next day.
        page.keyboard.press("Control+s")
        page.wait_for_timeout(1500)
        page.get_by_role("menuitem", name="Kernel", exact=True).click()
        page.get_by_text("Shut Down Kernel", exact=True).click()
        page.wait_for_timeout(1500)
        page.reload()
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        page.wait_for_timeout(3000)
        text = page.locator(".jp-Notebook").inner_text()
        assert "Error displaying widget" not in text and "model not found" not in text
        box, results = _answer_single_choice(page)
        assert results == ["false", "true"], "the reopened notebook's quiz does not answer"
        page.screenshot(path=str(SHOTS / "jupyterlab-reopened.png"))
    assert not errors, errors
