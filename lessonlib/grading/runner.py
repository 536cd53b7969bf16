"""Running a notebook's cells one at a time in a (sandboxed) kernel.

The kernel is :mod:`lessonlib.grading.kernel` (IPython's, output capped),
started through :mod:`lessonlib.grading.sandbox` and reached over Unix
sockets in a folder bound into the sandbox. The grader keeps nothing the
kernel prints; each kernel message is capped in size and in number queued.
Around every check cell the runner empties and then reads the kernel's
hand-in log with its own request (:data:`lessonlib.grading.answers.TAKE`).
A cell that times out or kills the kernel leads to a fresh kernel with the
cells that had worked replayed.

Every wait has a bound: a send to the kernel gives up after
:data:`SEND_TIMEOUT` seconds (ZeroMQ drops a connection whose peer sends a
message over :data:`MAX_MESSAGE_BYTES`, and a send without a peer would wait
for ever), a reply after the cell's timeout, a kernel start and every restart
within the notebook's budget. A kernel that stops answering the grader's own
requests is replaced; the student's row says why. :func:`grading_folder`
(:mod:`lessonlib.grading.runs`) holds a run's scratch folders and
removes them however the run ends, and stops every kernel at once on an
interrupt.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

from .answers import MAX_HANDIN_BYTES, MAX_LOG, TAKE
from .results import clean

# Kernel messages the grader accepts: at most 4 MiB each (ZeroMQ drops the connection for a
# larger one, and reconnects), at most 64 queued: a flood of output costs time, not memory.
MAX_MESSAGE_BYTES = 4 * 1024 ** 2
MAX_QUEUED_MESSAGES = 64
#: Seconds a message to the kernel may wait to be sent (no peer: a dropped connection).
SEND_TIMEOUT = 10
#: Seconds the grader waits for the kernel's answer to its own request (the hand-in log).
TAKE_TIMEOUT = 10
MAX_HANDIN_LOG_BYTES = MAX_LOG * MAX_HANDIN_BYTES


def error_line(exc) -> str:
    """One clean line naming an error raised in a kernel or here: its name and message."""
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    return clean(f"{ename}: {evalue}".strip().rstrip(":"))


def _client_class():
    from jupyter_core.utils import ensure_async, run_sync
    from nbclient import NotebookClient

    class AnswerClient(NotebookClient):
        """Keeps nothing a cell prints (memory stays flat); errors come with the execute reply."""

        def output(self, outs, msg, display_id, cell_index):
            return None

        def clear_output(self, outs, msg, cell_index):
            return None

        def handle_comm_msg(self, outs, msg, cell_index):
            return None

        async def async_take(self, timeout: float) -> list | None:
            """The kernel's hand-in log (emptied), asked for on the shell channel; None if no answer."""
            try:
                msg_id = self.kc.execute("", silent=True, store_history=False, allow_stdin=False,
                                         user_expressions={"take": TAKE})
            except Exception:  # noqa: BLE001 - zmq.Again after SEND_TIMEOUT: no connection to the kernel
                return None
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                try:
                    reply = await ensure_async(self.kc.get_shell_msg(timeout=remaining))
                except Exception:  # noqa: BLE001 - no reply in time (queue.Empty) or a dead kernel
                    return None
                if reply.get("parent_header", {}).get("msg_id") == msg_id:
                    break
            value = reply.get("content", {}).get("user_expressions", {}).get("take", {})
            text = (value.get("data") or {}).get("text/plain") if value.get("status") == "ok" else None
            if not isinstance(text, str) or len(text) > 2 * MAX_HANDIN_LOG_BYTES:
                return None
            try:
                entries = json.loads(ast.literal_eval(text))
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                return None
            return entries if isinstance(entries, list) else None

        take = run_sync(async_take)

        async def async_start_new_kernel_client(self):
            import zmq

            self.kc = self.km.client()
            # before the channels connect: the limits apply to new sockets. A send without a peer
            # (ZeroMQ dropped the connection for a message over the cap) fails after SEND_TIMEOUT
            # instead of blocking for ever; nothing lingers at close.
            self.kc.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            self.kc.context.setsockopt(zmq.RCVHWM, MAX_QUEUED_MESSAGES)
            self.kc.context.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT * 1000)
            self.kc.context.setsockopt(zmq.LINGER, 0)
            try:
                await ensure_async(self.kc.start_channels())
                await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))
            except Exception:
                await self._async_cleanup_kernel()
                raise
            self.kc.allow_stdin = False
            return self.kc

        start_new_kernel_client = run_sync(async_start_new_kernel_client)

    return AnswerClient


INSIDE_CONNECTION_FILE = "kernel-inside.json"


def _kernel_manager(argv: list[str], conn: Path, inside: str | None = None):
    """A kernel manager on Unix sockets in ``conn``; ``inside``: where the sandbox sees ``conn``."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class Specs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name, *args, **kwargs):
            return KernelSpec(argv=argv, display_name="Python 3", language="python", resource_dir="")

    class Manager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            cmd = super().format_kernel_cmd(extra_arguments)
            if inside is not None:  # the same sockets, named by their path inside the sandbox
                info = json.loads(Path(self.connection_file).read_text())
                info["ip"] = f"{inside}/k"
                path = conn / INSIDE_CONNECTION_FILE
                path.write_text(json.dumps(info))
                os.chmod(path, 0o444)  # the sandbox's user reads it, and cannot change it
            return cmd

    km = Manager(kernel_spec_manager=Specs(), kernel_name="python3", transport="ipc", ip=str(conn / "k"))
    km.connection_file = str(conn / "kernel.json")
    return km


#: Runners with a kernel: stopped all at once by :func:`run_all` on an interrupt.
_live: "weakref.WeakSet[Runner]" = weakref.WeakSet()
#: Set on an interrupt: no kernel starts or restarts any more.
STOPPING = threading.Event()


def kill_live() -> None:
    """Kill every running kernel (from any thread); their threads then find them dead."""
    for runner in list(_live):
        runner.kill()


class Runner:
    """Run code cells one at a time; survive errors, timeouts, a dead or deaf kernel."""

    def __init__(self, nb, check_indices: set, scratch: Path, conn: Path, sandbox, cell_timeout: float,
                 budget: float, max_restarts: int = 5):
        self.nb, self.check_indices = nb, check_indices
        self.scratch, self.conn, self.sandbox = scratch, conn, sandbox
        self.cell_timeout, self.deadline = cell_timeout, time.monotonic() + budget
        self.max_restarts, self.restarts = max_restarts, 0
        self.client = None
        self.proc = None  # the kernel's process (the caps' wrapper, then bwrap, when sandboxed)
        self.cgroups: list[Path] = []
        self.handed: dict[int, list] = {}
        self.ok_cells: list[int] = []  # cells that ran cleanly: replayed after a restart

    def _argv(self) -> list[str]:
        if self.sandbox is None:
            return [sys.executable, "-m", "lessonlib.grading.kernel", "-f", "{connection_file}",
                    "--IPKernelApp.parent_handle=0"]
        from .sandbox import CONN_MOUNT

        kernel = [sys.executable, "-m", "lessonlib.grading.kernel", "-f", f"{CONN_MOUNT}/{INSIDE_CONNECTION_FILE}",
                  "--IPKernelApp.parent_handle=0"]
        return self.sandbox.command(kernel, self.scratch, shared=self.conn, cgroups=self.cgroups)

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def start(self):
        if STOPPING.is_set():
            raise RuntimeError("grading was interrupted")
        startup = max(1, min(60, int(self._left())))
        Client = _client_class()
        self.client = Client(self.nb, timeout=int(self.cell_timeout), kernel_name="python3",
                             interrupt_on_timeout=False, allow_errors=False, startup_timeout=startup,
                             shutdown_kernel="immediate", iopub_timeout=4)
        kwargs = {}
        if self.sandbox is None:  # no sandbox: the kernel still gets its own folder and hand-in folder
            kwargs["env"] = dict(os.environ, LESSONLIB_HANDIN=str(self.scratch / "handin"), MPLBACKEND="agg",
                                 HOME=str(self.scratch))
            self.client.km = _kernel_manager(self._argv(), self.conn)
        else:
            from . import sandbox as sb

            sb.unseal(self.conn)
            for f in self.conn.iterdir():  # the last kernel's sockets and files
                f.unlink()
            sb.prepare(self.scratch, self.conn)
            self.cgroups = self.sandbox.new_cgroups()
            self.client.km = _kernel_manager(self._argv(), self.conn, inside=sb.CONN_MOUNT)
        _live.add(self)
        self.client.start_new_kernel(cwd=str(self.scratch), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     **kwargs)
        self.proc = getattr(self.client.km.provisioner, "process", None)
        self.client.start_new_kernel_client()
        if self.sandbox is not None:
            from . import sandbox as sb

            sb.seal(self.conn)  # the sockets exist: nothing more to make there

    def kill(self):
        """Kill the kernel's process now (from any thread); its own thread then finds it dead."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass

    def stop(self):
        """Kill the kernel (and with it the sandbox and every process in it) and wait for it."""
        client, self.client = self.client, None
        proc, self.proc = self.proc, None
        if client is not None and client.km is not None:
            self._shutdown(client)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait()
        if self.cgroups:
            from .limits import remove_cgroups

            remove_cgroups(self.cgroups)
            self.cgroups = []
        if self.sandbox is not None:
            from .sandbox import unseal

            unseal(self.conn)
        _live.discard(self)

    @staticmethod
    def _shutdown(client):
        try:
            client._cleanup_kernel()
        except Exception:  # noqa: BLE001 - a kernel we cannot stop cleanly is killed below
            pass
        km = client.km
        try:
            if km.has_kernel:
                from jupyter_core.utils import run_sync

                run_sync(km.shutdown_kernel)(now=True)
        except Exception:  # noqa: BLE001
            pass

    def _restart(self) -> bool:
        self.stop()
        if self.restarts >= self.max_restarts or self._left() <= 2 or STOPPING.is_set():
            return False
        self.restarts += 1
        try:
            self.start()
        except Exception:  # noqa: BLE001 - no kernel: the remaining cells are not run
            self.stop()
            return False
        for i in list(self.ok_cells):  # a replayed check cell hands in again: the log is emptied
            status, _ = self._execute(i, replay=True)  # before the next check, so it does not count
            if status != "ok":
                return False
        return True

    def _execute(self, index: int, replay: bool = False) -> tuple[str, str]:
        from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

        remaining = self._left()
        if remaining <= 1:
            return "not run", "time budget for the notebook used up"
        self.client.timeout = int(max(1, min(self.cell_timeout, remaining)))
        cell = self.nb.cells[index]
        try:
            self.client.execute_cell(cell, index)
            if not replay:
                self.ok_cells.append(index)
            return "ok", ""
        except CellExecutionError as exc:
            return "error", error_line(exc)
        except CellTimeoutError:
            return "timeout-dead", f"timed out after {self.client.timeout} s"
        except DeadKernelError:
            return "dead", "the kernel died while running this cell"
        except Exception as exc:  # noqa: BLE001 - whatever the kernel does, the grader goes on
            return "dead", f"execution failed: {error_line(exc)}"

    def _take(self) -> list | None:
        return self.client.take(max(1.0, min(TAKE_TIMEOUT, self._left())))

    def _fresh(self, status: str, msg: str) -> tuple[str, str]:
        """A new kernel after ``status`` (the cells that worked replayed): ``(status, msg + what happened)``."""
        if not self._restart():
            self.stop()
            return status, msg + " (kernel not restarted)"
        return status, msg + " (kernel restarted)"

    def run(self, index: int) -> tuple[str, str]:
        """Execute cell ``index``: ``("ok"|"error"|"timeout"|"dead"|"not run", message)``.

        Around a check cell, the kernel's hand-in log is emptied before and read
        after (:attr:`handed`), through the grader's own requests. A kernel that
        does not answer them (a reply over the size cap drops the connection)
        is replaced, and that check counts as ``"dead"``.
        """
        if self.client is None or STOPPING.is_set():
            return "not run", "kernel could not be restarted"
        check = index in self.check_indices
        deaf = "the kernel does not answer the grader's requests (a reply over the size limit, or a dead kernel)"
        if check and self._take() is None:
            return self._fresh("dead", deaf)
        status, msg = self._execute(index)
        if check and status in ("ok", "error"):
            got = self._take()
            if got is None:
                return self._fresh("dead", deaf)
            self.handed[index] = got
        if status in ("timeout-dead", "dead"):
            return self._fresh("timeout" if status == "timeout-dead" else "dead", msg)
        return status, msg
