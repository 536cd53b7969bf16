"""A Colab-like runtime for the tests: a clean venv, a local stand-in for the repository, plain Jupyter rendering.

* :func:`make_venv` - a fresh venv with only torch (the local CPU wheel),
  ipykernel, matplotlib and one ipywidgets version, and a kernelspec for it;
* :func:`bare_repository` - a bare git repository holding the working tree
  (uncommitted changes included), which ``LESSONLIB_SOURCE=git+file://...``
  makes the setup cell install from, as Colab installs from GitHub;
* :func:`execute` - run a notebook in that venv's kernel with nbclient, from a
  folder outside the checkout, as Colab would;
* :func:`visible_text` - the text a reader sees in the notebook rendered by
  nbconvert (no myst-nb), with cells whose input JupyterLab hides
  (``jupyter.source_hidden``) shown without their input.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
IPYWIDGETS = {"7": "ipywidgets==7.7.5", "8": "ipywidgets==8.1.9"}
#: The ipywidgets Colab ships: the notebooks run under it.
COLAB_WIDGETS = "7"
#: The kernelspec of a Colab-like venv (:func:`make_venv`).
KERNEL = "colablike"


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def pip_settings() -> dict[str, list[str]]:
    """This machine's pip settings that say where packages come from (index, extra indexes, wheel
    folders, constraints, certificate): the environment's first, then the configuration files'."""
    listing = run([sys.executable, "-m", "pip", "config", "list"])
    found: dict[str, list[str]] = {}
    for scope in (":env:", "global"):
        for key, value in re.findall(rf"^{re.escape(scope)}\.([\w-]+)='(.*)'$", listing, re.M):
            found.setdefault(key, value.split())
    return found


def install(python: Path, *requirements: str, timeout: float = 1200, compile_bytecode: bool = False) -> None:
    """Install ``requirements`` into the venv of ``python``.

    ``compile_bytecode``: also write the packages' bytecode (``.pyc``) now, as pip always does and uv
    does only when asked. Worth it for a venv that starts many processes: a process that imports a
    package with no bytecode compiles it first, and where bytecode is never written
    (``PYTHONDONTWRITEBYTECODE``, set on some machines, this one included) it does so every time.

    With uv where the course's venv has it (``scripts/setup.sh`` installs it there): the same
    versions as pip in seconds instead of minutes, since uv links the files from its cache. uv
    reads none of pip's configuration, so the machine's pip settings are handed to it, as
    ``scripts/setup.sh`` does. Without uv, pip.
    """
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        run([str(python), "-m", "pip", "install", "-q", *requirements], timeout=timeout)
        return
    settings, args = pip_settings(), []
    args += [a for v in settings.get("index-url", []) for a in ("--index-url", v)]
    args += [a for v in settings.get("extra-index-url", [])
             if not (v.startswith("file://") and not Path(v[len("file://"):]).is_dir())  # as pip skips it
             for a in ("--extra-index-url", v)]
    args += [a for v in settings.get("find-links", []) for a in ("--find-links", v)]
    args += [a for v in settings.get("constraint", []) for a in ("-c", v)]
    env = dict(os.environ)
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"][0]
    args += ["--compile-bytecode"] if compile_bytecode else []
    run([str(uv), "pip", "install", "-q", "--python", str(python), "--index-strategy", "unsafe-best-match",
         *args, *requirements], timeout=timeout, env=env)


def make_venv(where: Path, widgets: str, extra: tuple[str, ...] = (), torch: bool = True,
              compile_bytecode: bool = False) -> Path:
    """A fresh venv (no system site-packages) with one ``widgets`` version of ipywidgets.

    With ``torch`` (the default) it is a Colab-like runtime: torch, ipykernel and matplotlib too,
    and a kernelspec named ``colablike``. Without, it holds ipywidgets and what it needs only.
    ``compile_bytecode``: see :func:`install`.
    """
    run([sys.executable, "-m", "venv", str(where)])
    py = where / "bin" / "python"
    runtime = (TORCH, "ipykernel", "matplotlib") if torch else ()
    install(py, *runtime, IPYWIDGETS[widgets], *extra, compile_bytecode=compile_bytecode)
    if torch:
        run([str(py), "-m", "ipykernel", "install", "--prefix", str(where), "--name", KERNEL])
    return where


def runtime() -> tuple[Path, dict]:
    """The Colab-like runtime every notebook runs in under nbval: ``(venv, its versions)``.

    Built on first use inside the environment that runs the tests (``.venv/colab-like``) and kept:
    later runs reuse it while what it should hold is unchanged (a stamp). pytest's workers share it
    behind a file lock. Nothing ever installs lessonlib into it: a notebook run from the checkout
    imports the checkout's (its setup cell's first branch), and the test of the Colab branch,
    which installs lessonlib, builds a venv of its own.

    Its bytecode is compiled as it is installed (as Colab's packages come): every notebook starts a
    kernel here, and without it each kernel compiled torch, numpy, matplotlib and ipykernel anew on
    a machine that never writes bytecode (``PYTHONDONTWRITEBYTECODE``), about 3 s of a page's 4-s start.
    """
    import fcntl

    where = Path(sys.prefix) / "colab-like"
    stamp = json.dumps([sys.version, TORCH, "ipykernel", "matplotlib", IPYWIDGETS[COLAB_WIDGETS], "bytecode"])
    with open(f"{where}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = where / "versions.json"
        if known.exists() and (where / "stamp.json").exists() and (where / "stamp.json").read_text() == stamp:
            return where, json.loads(known.read_text())
        shutil.rmtree(where, ignore_errors=True)
        make_venv(where, COLAB_WIDGETS, compile_bytecode=True)
        found = versions(where)
        known.write_text(json.dumps(found))
        (where / "stamp.json").write_text(stamp)
        return where, found


def kernel_environment(venv: Path) -> tuple[dict, tuple[str, ...]]:
    """``(set, unset)``: the environment a kernel of ``venv`` starts with, as on Colab: that venv's
    commands first on PATH, its kernelspec findable, and no PYTHONPATH or VIRTUAL_ENV of the tests'."""
    return ({"PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}", "JUPYTER_PATH": str(venv / "share" / "jupyter")},
            ("PYTHONPATH", "VIRTUAL_ENV"))


def versions(venv: Path) -> dict:
    """torch and ipywidgets versions installed in ``venv``, and whether lessonlib is there."""
    code = ("import json, importlib.util, torch, ipywidgets; print(json.dumps({'torch': torch.__version__, "
            "'ipywidgets': ipywidgets.__version__, 'lessonlib': importlib.util.find_spec('lessonlib') is not None}))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return json.loads(run([str(venv / "bin" / "python"), "-c", code], cwd="/", env=env))


def bare_repository(where: Path) -> str:
    """A bare repository of the working tree; returns the pip requirement for it."""
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    sha = run(["git", "stash", "create"], cwd=ROOT, env=env).strip() or run(["git", "rev-parse", "HEAD"], cwd=ROOT).strip()
    run(["git", "init", "-q", "--bare", str(where)])
    run(["git", "push", "-q", str(where), f"{sha}:refs/heads/main"], cwd=ROOT)
    run(["git", "--git-dir", str(where), "symbolic-ref", "HEAD", "refs/heads/main"])
    return f"git+file://{where}"


def execute(path: Path, venv: Path, workdir: Path, source: str, timeout: int = 600):
    """Execute a copy of the notebook in ``workdir`` (outside the checkout) in the venv's kernel."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    workdir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    ksm = KernelSpecManager(kernel_dirs=[str(venv / "share" / "jupyter" / "kernels")])
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=ksm)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LESSONLIB_STATIC_BUILD")}
    env.update(LESSONLIB_SOURCE=source, PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    client = NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(workdir)}})
    client.execute(env=env, cwd=str(workdir))
    return nb


def render_html(nb) -> str:
    """nbconvert's HTML, with inputs JupyterLab collapses (jupyter.source_hidden) left out."""
    import copy

    from nbconvert import HTMLExporter

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
            cell.metadata.setdefault("transient", {})["remove_source"] = True
    html, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    return html


def visible_text(html: str) -> str:
    """The text a reader sees: no scripts or styles, no hidden elements, no closed <details> body."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "head", "template"]):
        tag.decompose()
    for tag in soup.select("[hidden]"):
        tag.decompose()
    for det in soup.find_all("details"):
        if not det.has_attr("open"):
            for child in list(det.children):
                if getattr(child, "name", None) != "summary":
                    child.extract()
    return re.sub(r"\s+", " ", soup.get_text(" "))


def answer_texts(nb) -> list[str]:
    """Texts that give a quiz's answer away: explanations, revealed answers, per-choice feedback.

    Taken from the quizzes' own HTML in the executed notebook's outputs.
    """
    from bs4 import BeautifulSoup

    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            html = out.get("data", {}).get("text/html", "")
            if "wtc-quiz" not in html and "wtc-prediction" not in html:
                continue
            soup = BeautifulSoup(html, "html.parser")
            found += [e.get_text(" ") for e in soup.select(".wtc-explanation")]
            for data in soup.select("script.wtc-data"):  # base64 JSON (lessonlib.book.quiz._encode)
                d = json.loads(base64.b64decode(data.string or "e30="))
                found += [BeautifulSoup(d.get(k) or "", "html.parser").get_text(" ") for k in ("answer", "explanation")]
                for verdict in d.get("verdicts", []):
                    found.append(re.sub(r"^(Correct\.|Not quite\.)\s*", "", verdict[1]))
    return sorted({re.sub(r"\s+", " ", t).strip() for t in found if len(t.strip()) >= 25})


def output_numbers(nb, kinds=("text/markdown",)) -> list[str]:
    """Numbers in the outputs of code cells of the given kinds, setup cell excluded.

    ``text/markdown`` outputs are the sentences a page writes from its run;
    ``stream`` adds what cells print (an exercise's measured results).
    """
    nums = []
    for cell in nb.cells[1:]:  # the setup cell prints versions, not measurements
        for out in cell.get("outputs", []):
            texts = [out.get("data", {}).get(k, "") for k in kinds if k != "stream"]
            if "stream" in kinds and out.get("output_type") == "stream":
                text = out.get("text", "")  # less progress bars ("41%|####  | 7/17 [...]")
                texts.append("\n".join(l for l in re.split(r"[\r\n]", text) if not re.search(r"\d+%\|", l)))
            for t in texts:
                nums += re.findall(r"\d+(?:[.,]\d+)?", t if isinstance(t, str) else "".join(t))
    return nums


if __name__ == "__main__":  # scripts/test.sh builds the runtime here while pytest starts (see runtime())
    runtime()
