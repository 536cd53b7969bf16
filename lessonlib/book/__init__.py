"""Book rendering: numbers glued into prose, quizzes, calculators, figures and reports.

``from lessonlib.book import glue`` is what a page calls to put a computed
number into its prose; the submodules hold the quizzes (:mod:`.quiz`), the
calculators (:mod:`.interactive`), the figures (:mod:`.plots`) and the small
HTML/text reports (:mod:`.reports`). CSS and JS ship as files in ``static/``.
"""
from .glue import Text, glue

__all__ = ["Text", "glue"]
