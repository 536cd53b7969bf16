"""The sandbox a submission runs in, tested on this machine without a kernel.

Each test runs a short Python program through ``Sandbox.command`` (bubblewrap)
and checks what it could see, write, reach and leave behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lessonlib
from lessonlib.grading import sandbox
from procs import processes_with

ROOT = Path(__file__).resolve().parents[1]
WHY = sandbox.probe()
pytestmark = [pytest.mark.slow,  # starts processes
              pytest.mark.skipif(bool(WHY), reason=f"no sandbox here: {WHY}")]


@pytest.fixture
def box(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "scratch").mkdir()
    sandbox.plain_lessonlib(tmp_path / "runtime")
    sandbox.prepare(tmp_path / "scratch")  # the sandbox's user (nobody, under a root grader) owns it
    return sandbox.Sandbox(runtime=tmp_path / "runtime", memory_bytes=512 * 1024 ** 2, cpu_seconds=60,
                           protected=[ROOT / "exercises", tmp_path / "secret"])


def run_inside(box, tmp_path, code, timeout=60):
    cmd = box.command([sys.executable, "-c", code], tmp_path / "scratch")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_a_submission_sees_no_instructor_material_and_writes_only_its_scratch(box, tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "answers.ipynb").write_text("{}")
    probe = {
        "read": [str(ROOT / "exercises" / "1a-price-the-training-step.ipynb"), str(ROOT / "lessonlib" / "__init__.py"),
                 str(tmp_path / "secret" / "answers.ipynb"), str(Path.home() / ".bash_history"),
                 "/etc/shadow", "/etc/ssh/ssh_host_rsa_key"],
        "write": [str(Path(lessonlib.__file__)), "/opt/lessonlib/lessonlib/__init__.py", sys.prefix + "/evil.py",
                  "/usr/evil.py", "/etc/evil", str(tmp_path / "evil")],
    }
    code = f"""
import json, os, lessonlib, pathlib
p = json.loads({json.dumps(json.dumps(probe))})
out = {{"uid": os.getuid(), "cwd": os.getcwd(), "lessonlib": lessonlib.__file__,
       "beside": sorted(os.listdir(pathlib.Path(lessonlib.__file__).parents[1])), "read": [], "write": []}}
for f in p["read"]:
    try:
        open(f).read(1); out["read"].append(f)
    except OSError:
        pass
for f in p["write"]:
    try:
        open(f, "w").write("x"); out["write"].append(f)
    except OSError:
        pass
open("mine.txt", "w").write("ok")
print(json.dumps(out))
"""
    run = run_inside(box, tmp_path, code)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["read"] == [] and seen["write"] == [], seen
    assert Path("/etc/shadow").exists()  # on this machine it is there, and hidden inside
    assert seen["uid"] == sandbox.SANDBOX_UID and seen["cwd"] == "/scratch"
    assert seen["lessonlib"] == "/opt/lessonlib/lessonlib/__init__.py" and seen["beside"] == ["lessonlib"]
    assert (tmp_path / "scratch" / "mine.txt").read_text() == "ok"
    assert not (tmp_path / "evil").exists()


def test_no_network(box, tmp_path):
    code = """
import socket
for addr in (("1.1.1.1", 53), ("10.0.0.1", 80)):
    try:
        socket.create_connection(addr, timeout=2); print("reached", addr)
    except OSError:
        pass
try:
    socket.getaddrinfo("pypi.org", 443); print("resolved")
except OSError:
    pass
s = socket.socket(); s.bind(("127.0.0.1", 0)); print("loopback ok")
"""
    run = run_inside(box, tmp_path, code)
    assert run.stdout.split() == ["loopback", "ok"], run.stdout + run.stderr


def test_no_process_outlives_the_sandbox(box, tmp_path):
    marker = f"sandbox-daemon-{os.getpid()}"
    code = f"""
import os, subprocess, sys, time
marker = "sandbox-" + "daemon-{os.getpid()}"  # built here: this program's own command line lacks it
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker], start_new_session=True)
if os.fork() == 0:  # a double fork, detached from the session
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", marker])
    os._exit(0)
print("started", flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen(box.command([sys.executable, "-c", code], tmp_path / "scratch"),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 10
    while len(processes_with(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(processes_with(marker)) == 2, "the detached processes did not start"
    proc.send_signal(signal.SIGKILL)  # what the grader does to a kernel it stops
    proc.wait()
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []


def test_memory_and_cpu_are_capped(box, tmp_path):
    run = run_inside(box, tmp_path, "b = bytearray(1024 ** 3)")
    assert run.returncode != 0 and "MemoryError" in run.stderr
    box.cpu_seconds = 1
    t0 = time.monotonic()
    run = run_inside(box, tmp_path, "while True: pass", timeout=30)
    # bwrap reports a child killed by a signal as 128 + the signal
    assert run.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL), run.returncode
    assert time.monotonic() - t0 < 20


def test_the_grader_refuses_a_layout_that_would_show_the_exercises(tmp_path):
    (tmp_path / "runtime").mkdir()
    inside_env = Path(sys.prefix) / "exercises"
    with pytest.raises(sandbox.SandboxError, match="visible to submissions"):
        sandbox.Sandbox(runtime=tmp_path / "runtime", protected=[inside_env])


def test_a_grader_that_dies_takes_the_sandbox_with_it(box, tmp_path):
    """--die-with-parent: kill the process that started bwrap (the grader), not bwrap itself."""
    marker = f"orphan-daemon-{os.getpid()}"
    inner = f"""
import os, subprocess, sys, time
marker = "orphan-" + "daemon-{os.getpid()}"
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker], start_new_session=True)
print("started", flush=True)
time.sleep(60)
"""
    cmd = box.command([sys.executable, "-c", inner], tmp_path / "scratch")
    grader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "p = subprocess.Popen(sys.argv[1:])\ntime.sleep(60)", *cmd])
    deadline = time.monotonic() + 20
    while not processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker), "the daemon did not start"
    grader.kill()  # the grader dies without cleaning up
    grader.wait()
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []
