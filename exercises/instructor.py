"""The instructor's command: student copies of the exercises, and grading.

    python exercises/instructor.py student OUT [--colab github/ORG/REPO/blob/main/OUT]
    python exercises/instructor.py solutions OUT
    python exercises/instructor.py grade SUBMISSIONS [--csv grades.csv] [--jobs 2] [--exercise STEM]
                                         [--cell-timeout 60] [--budget 300] [--memory 2G]
    python exercises/instructor.py verify grades.csv [--submissions SUBMISSIONS] [--key FILE]
    python exercises/instructor.py check
    python exercises/instructor.py mark NOTEBOOK...

(``python -m exercises.instructor ...`` from the repository root does the same.)
``student`` writes a copy of every exercise notebook in this folder with the
solutions replaced by ``raise NotImplementedError()`` and the hidden tests and
outputs removed; ``solutions``, for after the deadline, keeps the solutions and
each exercise's closing summary and removes the hidden tests and outputs. ``grade`` runs every ``SUBMISSIONS/STUDENT/*.ipynb`` (or
``SUBMISSIONS/STUDENT.ipynb``) in a sandbox, checks the answers it hands in
against expected values computed by the instructor's notebook in a separate
process, prints a score table per student and question and writes it as CSV
with a manifest signed by a key kept outside the results folder
(``~/.config/lessonlib/grading.key`` by default, made on the first run);
``verify`` checks the signature, the CSV files and (with ``--submissions``)
every graded notebook against it: it says nothing changed since grading, not
that the grades are right. ``check`` lints the
grading metadata of the instructor notebooks; ``mark`` writes that metadata
from each check cell's first line (``# Check 2a-q2 (3 points)``) and the
solution markers. The logic is in
``lessonlib.grading`` (``cli``, ``autograde``, ``sandbox``, ``reference``, ``handout``).
"""
import sys
from pathlib import Path

try:
    from lessonlib.grading.cli import main
except ImportError:  # run from a checkout without lessonlib installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lessonlib.grading.cli import main

if __name__ == "__main__":
    sys.exit(main(default_source=Path(__file__).resolve().parent))
