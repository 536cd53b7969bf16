"""nbgrader configuration for the exercises of *What Training Costs*.

Copy this file to the root of your nbgrader course (beside ``source/``), or
merge it into your own ``nbgrader_config.py``, and copy the instructor
notebooks into ``source/<assignment>/``. Then ``nbgrader generate_assignment``
and ``nbgrader autograde`` work as usual, with one addition: the release
step first removes the cells tagged ``instructor-only`` (the summary of
results that closes each exercise in the book, and the hidden cell that
computes its numbers), which nbgrader would otherwise hand out.

nbgrader runs each submission's checks in the student's own kernel, without
a sandbox: the expected values in the hidden tests come from that kernel's
names, which a student can redefine. For grades that students cannot forge,
grade with ``python exercises/instructor.py grade`` instead (see the "For
instructors" page). Tested by tests/test_grading_nbgrader.py.
"""
from nbconvert.preprocessors import TagRemovePreprocessor
from nbgrader.preprocessors import (CheckCellMetadata, ClearHiddenTests, ClearMarkScheme, ClearOutput,
                                    ClearSolutions, ComputeChecksums, IncludeHeaderFooter, InstantiateTests,
                                    LockCells, SaveCells)

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.TagRemovePreprocessor.enabled = True
c.TagRemovePreprocessor.remove_cell_tags = {"instructor-only"}

# nbgrader's own release steps (nbgrader 0.9), with the instructor-only cells removed first,
# before nbgrader records the cells and their checksums
c.GenerateAssignment.preprocessors = [
    TagRemovePreprocessor,
    IncludeHeaderFooter,
    InstantiateTests,
    LockCells,
    ClearSolutions,
    ClearOutput,
    CheckCellMetadata,
    ComputeChecksums,
    SaveCells,
    ClearHiddenTests,
    ClearMarkScheme,
    ComputeChecksums,
    CheckCellMetadata,
]
