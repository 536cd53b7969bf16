"""The kernel a submission runs in: IPython's, with its printed output capped.

    python -m lessonlib.grading.kernel -f CONNECTION_FILE

The grader keeps nothing a submission prints (answers come through
:func:`lessonlib.grading.answers.hand_in`), so this kernel sends at most
:data:`LIMIT` characters of stdout and of stderr each, then drops the rest. A
notebook that prints 500 MB by accident then costs seconds, not minutes. It
is a courtesy to honest notebooks, not a defence: the kernel runs the
student's code, which can undo it. The defences are on the grader's side
(a size limit per message, a queue limit, timeouts, the sandbox).
"""
from __future__ import annotations

import sys

from ipykernel.iostream import OutStream

LIMIT = 1_000_000


class CappedOutStream(OutStream):
    """An OutStream that forwards the first :data:`LIMIT` characters and drops the rest."""

    _sent = 0

    def write(self, string):
        if not isinstance(string, str):
            return super().write(string)
        room = LIMIT - self._sent
        if room <= 0:
            return len(string)
        self._sent += min(len(string), room)
        if len(string) > room:
            super().write(string[:room] + "\n[output cut here by the grader]\n")
            return len(string)
        return super().write(string)


def main() -> None:
    """Start an IPython kernel whose output is capped (``CappedOutStream``), for grading untrusted notebooks."""
    from ipykernel import kernelapp

    kernelapp.launch_new_instance(argv=sys.argv[1:] + [
        "--IPKernelApp.outstream_class=lessonlib.grading.kernel.CappedOutStream"])


if __name__ == "__main__":  # pragma: no cover
    main()
