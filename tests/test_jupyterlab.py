"""One chapter notebook in JupyterLab 4, driven by headless Chromium.

A fresh venv (torch, ipykernel, ipywidgets 8, matplotlib, and jupyterlab)
serves a copy of the notebook on 127.0.0.1 with a token. The test runs all
cells (the setup cell installs lessonlib from a local bare repository, as on
Colab), checks in the saved file that every code cell ran without an error,
answers a quiz wrong then right, and moves a calculator slider; then it saves,
shuts the kernel down and reloads the page, as a reader reopening the notebook
would (JupyterLab starts a fresh kernel, which holds none of the first run's
objects), and checks that no widget error shows and the quiz still answers.
The same server then opens notebooks executed elsewhere: one untrusted (no answer
shows), and one of our own, driven by the keyboard. Screenshots go to _build/screenshots/.
"""
from __future__ import annotations

import base64
import json
import os
import re
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
#: A chapter page with a single-choice quiz and a calculator, quick to run (its measurements are small): the
#: launcher of the multi-process pages runs in a kernel under nbval already, so this test does not repeat one.
NOTEBOOK = ROOT / "chapters" / "02-two-checkpoints" / "05-how-often-and-which-kind.ipynb"
SHOTS = ROOT / "_build" / "screenshots"
TOKEN = "wtc-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(venv: Path) -> None:
    # No "get notified about official Jupyter news?" toast over the page (and no request for it).
    settings = venv / "share" / "jupyter" / "lab" / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "overrides.json").write_text(json.dumps(
        {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}))


def _env(venv: Path, base: Path, **extra) -> dict:
    return {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(base), "JUPYTER_PLATFORM_DIRS": "1", **extra}


def _serve_lab(venv: Path, base: Path, work: Path, env: dict):
    """Start ``jupyter lab`` from ``venv`` on ``work``; returns (process, url, log file) once it answers."""
    port = _free_port()
    log = open(base / "lab.log", "w")
    proc = subprocess.Popen(
        [str(venv / "bin" / "jupyter"), "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={work}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--allow-root"] if os.geteuid() == 0 else []),
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
            return proc, url, log
        except OSError:
            if proc.poll() is not None:
                log.close()
                pytest.fail("jupyter lab exited:\n" + (base / "lab.log").read_text()[-3000:])
            time.sleep(0.5)
    _stop(proc, log)
    pytest.fail("jupyter lab did not start in 120 s")


def _stop(proc, log) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("lab")
    source = ce.bare_repository(base / "course.git")
    venv = ce.make_venv(base / "venv", "8", extra=("jupyterlab",))
    _settings(venv)
    work = base / "work"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    env = _env(venv, base, LESSONLIB_SOURCE=source)
    proc, url, log = _serve_lab(venv, base, work, env)
    try:
        yield url, work, venv, env
    finally:
        _stop(proc, log)


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
        box.locator(f"input[type=radio][value='{i}']").check()  # by its index: the page shuffles the order
        box.locator("button.wtc-check").click()
        results.append(box.locator(".wtc-feedback").get_attribute("data-correct"))
    return box, results


def test_run_answer_slide_and_reopen_in_jupyterlab(lab):
    url, work, _, _ = lab
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


# ----- executed notebooks opened in JupyterLab alone: untrusted, and by keyboard ----------------

#: A page whose quizzes need nothing from the page's run: they are rebuilt here from its cells.
QUIZ_PAGE = ROOT / "chapters" / "01-forward-vs-training" / "01-prediction-vs-step.ipynb"


def _page_quizzes() -> list:
    """The quizzes and the prediction of ``QUIZ_PAGE``, built from its cells as the page builds them."""
    import ast

    import nbformat

    from lessonlib.book import quiz

    names = {k: getattr(quiz, k) for k in ("Choice", "SingleChoice", "MultipleSelect", "Numeric", "Prediction")}
    cells = nbformat.read(QUIZ_PAGE, as_version=4).cells
    # the page's imports from lessonlib.calc (formulas, no run needed) that a quiz may compute its numbers with
    for line in (ln for c in cells if c.cell_type == "code" for ln in c.source.splitlines()):
        if re.fullmatch(r"from lessonlib\.calc(\.\w+)* import [\w, ]+", line.strip()):
            exec(line.strip(), names)
    found = []
    for cell in cells:
        if cell.cell_type == "code" and any(f"{k}(" in cell.source for k in ("SingleChoice", "MultipleSelect",
                                                                           "Numeric", "Prediction")):
            tree = ast.parse(cell.source)
            ns = dict(names)
            exec(compile(ast.Module(tree.body[:-1], []), "cell", "exec"), ns)
            found.append(eval(compile(ast.Expression(tree.body[-1].value), "cell", "eval"), ns))
    assert len(found) >= 4, found
    return found


def _executed(path: Path, objects) -> None:
    """A notebook whose code cells already show ``objects`` (as a kernel's display would), unsigned."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    for i, obj in enumerate(objects):
        cell = nbformat.v4.new_code_cell(f"# object {i}", execution_count=i + 1)
        cell.outputs = [nbformat.v4.new_output("display_data", data=obj._repr_mimebundle_())]
        nb.cells.append(cell)
    nbformat.write(nb, path)


def _open(b, url: str, name: str, width: int = 1280):
    page = b.new_page(viewport={"width": width, "height": 900})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/lab/tree/{name}?reset&token={TOKEN}")  # reset: no tab of an earlier test restored beside it
    page.wait_for_selector(".jp-Notebook .jp-Cell .jp-OutputArea-output", timeout=120_000)
    page.wait_for_timeout(2000)  # the outputs render after the cells
    return page, errors


def test_an_untrusted_notebook_shows_no_answer_in_jupyterlab(lab):
    # An executed notebook from elsewhere (a download from Colab, a classmate's run) opens untrusted:
    # JupyterLab drops its outputs' scripts and strips their `hidden` attributes.
    url, work, _, _ = lab  # the same server: these notebooks are executed already, no kernel needed
    quizzes = _page_quizzes()
    _executed(work / "untrusted.ipynb", quizzes)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser() as b:
        page, errors = _open(b, url, "untrusted.ipynb")
        boxes = page.locator(".wtc-box")
        assert boxes.count() == len(quizzes)
        assert page.locator(".wtc-box script").count() == 0, "untrusted, so its outputs' scripts are dropped"
        boxes.first.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "jupyterlab-untrusted.png"))
        text = page.locator(".jp-Notebook").inner_text()
        assert text.count("Run this cell") == len(quizzes)
        for q in quizzes:
            secrets = [q.answer] if hasattr(q, "answer") and isinstance(q.answer, str) else []
            if hasattr(q, "answer_html"):
                secrets.append(q.answer_html())
            secrets += [q.explanation] if getattr(q, "explanation", "") else []
            secrets += [c.feedback for c in getattr(q, "choices", []) if c.feedback]
            for secret in secrets:
                plain = re.sub(r"<[^>]+>", "", secret)
                assert plain[:40] not in text, f"an untrusted notebook shows: {plain[:80]}"
    assert not errors, errors


def test_arrow_keys_move_a_calculator_slider_and_a_choice_in_jupyterlab(lab):
    # In command mode JupyterLab takes the arrow keys to move between cells, unless the widget keeps them.
    from lessonlib.book.interactive import Explorer

    url, work, venv, env = lab
    calc = Explorer(lambda devices: f"{devices} devices", {"devices": [1, 2, 4, 8, 16]}, title="Calculator")
    choice = next(q for q in _page_quizzes() if type(q).__name__ == "SingleChoice")
    _executed(work / "keys.ipynb", [calc, choice])
    ce.run([str(venv / "bin" / "jupyter"), "trust", str(work / "keys.ipynb")], env=env)  # our own run: trusted
    with browser() as b:
        page, errors = _open(b, url, "keys.ipynb")
        active = "() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].findIndex(c => c.classList.contains('jp-mod-active'))"
        # By element id: an untrusted notebook's outputs (another tab) keep no ids, and their inputs are disabled.
        calc_id, quiz_id = (re.search(r'id="(wtc-[0-9a-f]+)"', o.static_html()).group(1) for o in (calc, choice))
        slider = page.locator(f"#{calc_id} input[type=range]")
        slider.click()  # focus, as a reader's click does; the slider starts at its first value
        slider.fill("0")
        cell = page.evaluate(active)
        for key, value in (("ArrowRight", "1"), ("ArrowRight", "2"), ("ArrowLeft", "1")):
            page.keyboard.press(key)
            assert slider.input_value() == value, f"{key} did not move the slider"
            assert page.evaluate(active) == cell, f"{key} moved to another cell"
        assert page.locator(f"#{calc_id} .wtc-output").inner_text() == "2 devices"
        quiz = page.locator(f"#{quiz_id}")
        quiz.scroll_into_view_if_needed()
        radios = quiz.locator("input[type=radio]")
        radios.nth(0).click()
        cell = page.evaluate(active)
        page.keyboard.press("ArrowDown")
        assert radios.nth(1).is_checked(), "ArrowDown did not move to the next choice"
        assert page.evaluate(active) == cell, "ArrowDown moved to another cell"
        page.screenshot(path=str(SHOTS / "jupyterlab-keys.png"))
    assert not errors, errors
