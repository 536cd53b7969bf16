"""Book rendering: prose with computed numbers, quizzes, calculators, figures and reports.

``from lessonlib.book import say`` is what a page calls to show a paragraph
that carries computed numbers (:mod:`.prose`); the submodules hold the quizzes (:mod:`.quiz`), the
calculators (:mod:`.interactive`), the figures (:mod:`.plots`) and the small
HTML/text reports (:mod:`.reports`). CSS and JS ship as files in ``static/``.
"""
from .prose import say

__all__ = ["say"]
