"""The instructor's command line (``python exercises/instructor.py ...``).

    student OUT [--colab PATH]        student copies of every exercise
    grade SUBMISSIONS [--csv grades.csv] [--jobs N] [--exercise STEM]
                      [--cell-timeout S] [--budget S] [--memory SIZE] [--no-sandbox] [--key FILE]
    verify grades.csv [--submissions SUBMISSIONS] [--key FILE]
                                      were the results (and the submissions) changed since grading?
    check                             lint the instructor notebooks
    mark NOTEBOOK...                  set nbgrader metadata from "# Check ID (N points)" lines

A bad option is rejected with one line (``instructor.py: error: ...``) and
exit status 2; nothing is graded.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Iterable

PROG = "instructor.py"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, without the usage block."""

    def error(self, message):  # noqa: D401 - argparse's hook
        self.exit(2, f"{PROG}: error: {message}\n")


def _whole(name, low, high):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be between {low} and {high}, got {value}")
        return value
    return parse


def _seconds(name):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds, got {text!r}") from None
        if not math.isfinite(value) or value <= 0 or value > 86400:
            raise argparse.ArgumentTypeError(f"{name} must be more than 0 and at most 86400 seconds, "
                                             f"got {text!r}")
        return value
    return parse


def _size(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"--memory must be a size such as 2G or 512M, got {text!r}")
    value = float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())
    if not 256 * 1024 ** 2 <= value <= 1024 ** 4:
        raise argparse.ArgumentTypeError(f"--memory must be between 256M and 1T, got {text!r}")
    return int(value)


def build_parser(default_source: Path) -> argparse.ArgumentParser:
    """The command line's parser: its commands and options, notebooks read from ``default_source`` unless told."""
    from .manifest import default_key_path

    p = _Parser(prog=PROG, description="Student copies of the exercises, and grading of what students hand in.")
    p.add_argument("--source", type=Path, default=default_source,
                   help="folder of instructor notebooks (default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser("student", help="write student copies (no solutions, no hidden tests)")
    s.add_argument("out", type=Path, help="folder to write the copies to")
    s.add_argument("--colab", metavar="PATH",
                   help="where you will publish the copies, as Colab sees it, e.g. "
                        "github/ORG/REPO/blob/main/student: writes Colab links into OUT/index.md")
    so = sub.add_parser("solutions", help="write the copies to hand out after the deadline (solutions and "
                                          "each exercise's summary; no hidden tests, no outputs)")
    so.add_argument("out", type=Path, help="folder to write the copies to")
    g = sub.add_parser("grade", help="grade a folder of submissions")
    g.add_argument("submissions", type=Path,
                   help="folder: SUBMISSIONS/STUDENT/EXERCISE.ipynb or SUBMISSIONS/STUDENT.ipynb")
    g.add_argument("--csv", type=Path, default=Path("grades.csv"), help="score table (default: %(default)s)")
    g.add_argument("--exercise", help="exercise stem for files that do not say which they are")
    g.add_argument("--cell-timeout", type=_seconds("--cell-timeout"), default=60.0,
                   help="seconds per cell (default: %(default)s)")
    g.add_argument("--budget", type=_seconds("--budget"), default=300.0,
                   help="seconds per notebook in all (default: %(default)s)")
    g.add_argument("--jobs", type=_whole("--jobs", 1, 256), default=1,
                   help="notebooks graded at once, one sandboxed kernel each (default: %(default)s)")
    g.add_argument("--memory", type=_size, default="2G",
                   help="memory cap for all of a submission's processes and its /tmp together, where a cgroup "
                        "can be made; else per process (default: %(default)s)")
    g.add_argument("--no-sandbox", action="store_true",
                   help="run submissions without isolation (only inside a container you throw away)")
    key_help = ("the key that signs the manifest, outside the results folder (default: %(default)s; "
                "grading makes it if it is missing)")
    g.add_argument("--key", type=Path, default=default_key_path(), help=key_help)
    verify_says = ("check the signed manifest: that it was written with your key, that the CSV files (and, with "
                   "--submissions, every graded notebook, and no other) are byte for byte what the grader wrote and "
                   "graded; it says nothing about whether the grades are right")
    v = sub.add_parser("verify", help=verify_says, description=verify_says[0].upper() + verify_says[1:] + ".")
    v.add_argument("csv", type=Path)
    v.add_argument("--submissions", type=Path,
                   help="the folder that was graded: check each notebook against the SHA-256 in the manifest")
    v.add_argument("--key", type=Path, default=default_key_path(), help="the key used for grading (default: %(default)s)")
    sub.add_parser("check", help="lint the instructor notebooks' grading metadata")
    mk = sub.add_parser("mark", help="set nbgrader metadata from '# Check ID (N points)' lines "
                                     "and solution markers (for authors)")
    mk.add_argument("notebooks", type=Path, nargs="+")
    return p


def main(argv: Iterable[str] | None = None, default_source: Path | str | None = None) -> int:
    """Run one command of the instructor's command line; returns the process's exit status (0 when all went well)."""
    from . import handout

    default_source = Path(default_source or Path.cwd() / "exercises")
    p = build_parser(default_source)
    a = p.parse_args(list(argv) if argv is not None else None)
    if a.command != "verify" and not a.source.is_dir():
        p.error(f"--source {a.source} is not a folder")

    if a.command == "student":
        try:
            paths = handout.write_student_copies(a.source, a.out, a.colab)
        except ValueError as exc:  # an instructor notebook fails the lint: say which, write nothing more
            print(f"not written:\n{exc}", file=sys.stderr)
            return 1
        for path in paths:
            print(f"wrote {path}")
        print(f"{len(paths)} student copies in {a.out} (index: {a.out / 'index.md'})")
        return 0
    if a.command == "solutions":
        try:
            paths = handout.write_solution_copies(a.source, a.out)
        except ValueError as exc:
            print(f"not written:\n{exc}", file=sys.stderr)
            return 1
        print(f"{len(paths)} solution copies in {a.out}: hand them out after the deadline")
        return 0
    if a.command == "mark":
        import nbformat

        for path in a.notebooks:
            nb = handout.mark(nbformat.read(path, as_version=4))
            nbformat.write(nb, path)
            print(f"{path}: {len(handout.check_cells(nb))} checks, "
                  f"{sum(1 for c in nb.cells if handout.cell_meta(c).get('solution'))} solution cells")
        return 0
    if a.command == "check":
        import nbformat

        problems = []
        for stem, path in handout.exercise_notebooks(a.source).items():
            nb = nbformat.read(path, as_version=4)
            problems += handout.lint(nb, path.name)
            problems += [f"{path.name} (student copy): {x}" for x in handout.answer_leaks(handout.student_notebook(nb))]
            total = sum(pts for _, pts, _ in handout.check_cells(nb))
            print(f"{path.name}: {len(handout.check_cells(nb))} checks, {total:g} points")
        print("\n".join(problems) or "no problems")
        return 1 if problems else 0
    if a.command == "verify":
        from .manifest import verify

        if a.submissions is not None and not a.submissions.is_dir():
            p.error(f"--submissions {a.submissions} is not a folder")
        problems = verify(a.csv, key_path=a.key, submissions=a.submissions)
        what = " and the submissions in " + str(a.submissions) if a.submissions is not None else ""
        print("\n".join(problems) or f"{a.csv}, its details{what} match the manifest signed with {a.key}")
        return 1 if problems else 0

    # grade
    from . import autograde, sandbox

    if not a.submissions.is_dir():
        p.error(f"{a.submissions} is not a folder")
    stems = sorted(handout.exercise_notebooks(a.source))
    if not stems:
        p.error(f"no exercise notebooks in {a.source}")
    if a.exercise is not None and a.exercise not in stems:
        p.error(f"--exercise must be one of {', '.join(stems)}; got {a.exercise!r}")
    if a.csv.resolve().is_relative_to(a.submissions.resolve()):
        p.error("--csv must not lie inside the submissions folder")
    if a.key.resolve().is_relative_to(a.csv.resolve().parent):
        p.error("--key must not lie in the results folder: whoever can edit the results could sign them")
    try:
        from .manifest import load_key

        key = load_key(a.key, create=True)  # before grading: a bad key stops the run, not its end
    except (OSError, ValueError) as exc:
        p.error(f"--key: {exc}")
    if a.no_sandbox:
        box = None
        print("warning: grading WITHOUT isolation (--no-sandbox)", file=sys.stderr)
    else:
        why = sandbox.probe()
        if why:
            p.error(f"the sandbox does not work here ({why.splitlines()[0]}); "
                    f"install bubblewrap, or grade in a container with --no-sandbox")
        box = "auto"
    try:
        results = autograde.grade_folder(a.submissions, a.source, exercise=a.exercise,
                                         cell_timeout=a.cell_timeout, budget=a.budget, jobs=a.jobs,
                                         sandbox=box, memory_bytes=a.memory)
    except (ValueError, sandbox.SandboxError, autograde.ReferenceError_) as exc:
        print(f"{PROG}: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    if not results:
        print(f"no *.ipynb files under {a.submissions}", file=sys.stderr)
        return 1
    # every kernel has stopped: write the files once, then print the same rows
    manifest = autograde.write_results(results, a.csv, key=key)
    print(autograde.format_table(results))
    details = a.csv.with_name(a.csv.stem + "-details.csv")
    print(f"\nwrote {a.csv} (sha256 {manifest['files'][a.csv.name][:16]}…), {details.name} and "
          f"{autograde.manifest_path(a.csv).name} (signed with {a.key}); check them later with: "
          f"{PROG} verify {a.csv} --submissions {a.submissions}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
