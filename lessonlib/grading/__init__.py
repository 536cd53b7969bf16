"""Graded exercises: hand-in, checks, student copies, and a sandboxed autograder.

What a student notebook uses (pure Python, nothing else from lessonlib):

* :mod:`.answers`: :func:`hand_in` (answers out of the kernel as plain data),
  :func:`require_number` and :func:`check_one_of` (the shape of an answer);
* :mod:`.checks`: :func:`grader`, :func:`check_close`, :func:`check_choice`,
  :func:`check_key_points` and :class:`Flag`, which the hidden part of a check
  cell uses; they decide grades only in the autograder's reference process.

What the instructor uses (``python exercises/instructor.py``, i.e. :mod:`.cli`):
:mod:`.handout` (student copies, lint), :mod:`.autograde` (grading a folder),
:mod:`.sandbox` (bubblewrap isolation), :mod:`.reference` (the process that
holds the expected values), :mod:`.provenance` (were the measurements an
answer rests on measured in this run?), :mod:`.results` (the score table, made
safe for files and spreadsheets) and :mod:`.manifest` (the signed manifest, and
what ``verify`` guarantees). Those import nbformat, nbclient and friends; this
package's ``__init__`` does not.
"""
from .answers import check_one_of, hand_in, hand_in_folder, require_number
from .graders import Flag, check_choice, check_close, check_key_points, grader, key_points_found

__all__ = ["Flag", "check_choice", "check_close", "check_key_points", "check_one_of", "grader",
           "hand_in", "hand_in_folder", "key_points_found", "require_number"]
