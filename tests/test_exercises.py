"""The graded exercises (exercises/) and their student copies.

Unit tests check each notebook's grading structure and its student copy. The
tests marked ``notebooks`` (the run's "exercises" phase, after nbval) share one
grading run through the sandboxed grader: every exercise's instructor version
must score full marks, its student copy must run up to its stubs and score
nothing; exercise 3c also gets a wrong answer and a redefined helper.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grading_toy import toy_exercise
from lessonlib.grading import Flag, autograde, handout, reference, sandbox

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "exercises"
EXERCISE_PATHS = sorted(handout.exercise_notebooks(EXERCISES).values())
NO_SANDBOX = sandbox.probe()


# --------------------------------------------------------------------------
# student copies and the authors' tools
# --------------------------------------------------------------------------

def test_student_copy_has_stubs_and_no_answers():
    student = handout.student_notebook(toy_exercise())
    text = nbformat.writes(student)
    assert "100 / base" not in text and "16 * 1000" not in text
    assert "check_close(" not in text and "@grader" not in text and "_KEY_POINTS" not in text
    assert text.count("raise NotImplementedError()") == 3
    assert handout.answer_leaks(student) == []
    # the visible part of each check (hand-in and shape checks) and the grading metadata stay
    assert "hand_in('toy-q1', speedup=speedup)" in text and "require_number('speedup'" in text
    assert [g for g, _, _ in handout.check_cells(student)] == ["toy-q1", "toy-q2", "toy-q3"]
    assert "the speedup was 2.5" not in text, "instructor-only cells stay out"


def test_mark_sets_the_metadata_an_author_would():
    nb = new_notebook(cells=[
        new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"),
        new_code_cell("# Check ex-q1 (2 points)\nfrom lessonlib.grading import hand_in\nhand_in('ex-q1', x=x)\n"
                      "### BEGIN HIDDEN TESTS\n@grader('ex-q1')\ndef _(got):\n    assert got['x'] == 1\n"
                      "### END HIDDEN TESTS"),
    ])
    nb.metadata[handout.META_KEY] = {"id": "ex", "objective": 1}
    handout.mark(nb)
    assert nb.cells[0].metadata["nbgrader"]["grade_id"] == "ex-a1"
    assert nb.cells[0].metadata["nbgrader"]["solution"] and "hide-cell" in nb.cells[0].metadata["tags"]
    assert handout.check_cells(nb) == [("ex-q1", 2.0, 1)]
    assert handout.lint(nb) == []
    nb.cells[1].metadata["nbgrader"]["points"] = 3
    assert any("disagrees" in p for p in handout.lint(nb))


def test_lint_wants_a_hand_in_and_a_grader_in_every_check():
    nb = toy_exercise()
    assert handout.lint(nb, "toy") == []
    nb.cells[4].source = nb.cells[4].source.replace("hand_in('toy-q1'", "print('toy-q1'")
    nb.cells[7].source = nb.cells[7].source.replace("@grader('toy-q2')", "@grader('toy-q9')")
    problems = handout.lint(nb, "toy")
    assert any("does not hand_in('toy-q1'" in p for p in problems), problems
    assert any("no @grader('toy-q2')" in p for p in problems), problems


def test_stub_keeps_indentation_and_unbalanced_markers_are_caught():
    src = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    out = handout._replace_regions(src, handout.BEGIN_SOLUTION, handout.END_SOLUTION, handout.CODE_STUB)
    assert out == "def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    nb = toy_exercise()
    nb.cells[3].source = "### BEGIN SOLUTION\nx = 1"
    assert any("without" in p for p in handout.lint(nb, "toy"))


# --------------------------------------------------------------------------
# the real exercises: structure
# --------------------------------------------------------------------------

def test_there_are_three_exercises_per_chapter_each_tied_to_an_objective():
    assert EXERCISE_PATHS, "no exercise notebooks in exercises/"
    per_chapter: dict[str, int] = {}
    for path in EXERCISE_PATHS:
        meta = nbformat.read(path, as_version=4).metadata[handout.META_KEY]
        assert meta["objective"] in range(1, 8), path.name  # the intro's seven outcomes
        per_chapter[meta["chapter"]] = per_chapter.get(meta["chapter"], 0) + 1
    assert sorted(per_chapter) == [1, 2, 3], per_chapter
    assert all(n >= 3 for n in per_chapter.values()), per_chapter


def test_every_objective_on_the_instructor_page_has_an_exercise_and_the_process_note_is_true():
    """Review I1: one objective had nothing behind it (recovery checkpointing), and the note on which
    exercises start processes named 3b only, while 3e starts two as well. An objective without a graded
    exercise is named on the page as practised by its pages alone."""
    text = (EXERCISES / "index.md").read_text()
    listed = {int(n) for n in re.findall(r"^(\d)\. \*\*", text, re.M)}
    used = {nbformat.read(p, as_version=4).metadata[handout.META_KEY]["objective"] for p in EXERCISE_PATHS}
    assert used <= listed, (listed, used)
    words = ['no', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight']
    assert f"the {words[len(listed)]} outcomes the introduction" in " ".join(text.split())
    without = " and ".join(str(n) for n in sorted(listed - used))  # named as practised by the pages alone
    assert not without or re.search(rf"objectives? {without} \([^)]*\) (is|are) practised by their pages'",
                                    " ".join(text.split())), without
    starts = {p.stem[:2] for p in EXERCISE_PATHS
              if re.search(r"run_data_parallel|run_sharding|\blaunch\(", p.with_suffix(".md").read_text())}
    note = text[text.index("Two exercises"):text.index("A test (`tests/test_exercises.py`) keeps this table")]
    assert starts == set(re.findall(r"\b(\d[a-f]) starts", note)), (starts, note)


def test_instructor_page_lists_every_exercise_as_it_is():
    """exercises/index.md: one table row per exercise, with its chapter, objective, points and time."""
    text = (EXERCISES / "index.md").read_text()
    for path in EXERCISE_PATHS:
        nb = nbformat.read(path, as_version=4)
        meta = nb.metadata[handout.META_KEY]
        checks = handout.check_cells(nb)
        row = next((line for line in text.splitlines() if f"]({path.name})" in line), None)
        assert row, f"exercises/index.md has no row linking {path.name}"
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert cells[0] == f"[{meta['title']}]({path.name})", cells[0]
        assert cells[1:5] == [str(meta["chapter"]), str(meta["objective"]),
                              f"{len(checks)} ({sum(p for _, p, _ in checks):g})", f"{meta['minutes']} min"], cells
    toc = (ROOT / "_toc.yml").read_text()
    for path in EXERCISE_PATHS:
        assert f"file: exercises/{path.stem}\n" in toc, f"{path.stem} is not under exercises/index in _toc.yml"


def test_the_instructor_overview_is_short_and_links_the_grader_page():
    """Readers found exercises/index.md too long: it is an overview per exercise, and how to hand out, grade and
    read flagged answers is on its own page, linked from it and listed in the book."""
    index = (EXERCISES / "index.md").read_text()
    assert "(grading.md)" in index and len(index.split()) < 2000
    for moved in ("## Handing out student copies", "## Grading what students hand in", "## The short path",
                  "## Reading a flagged answer", "## Reference", "nbgrader"):
        assert moved not in index and moved in (EXERCISES / "grading.md").read_text(), moved
    assert "file: exercises/grading\n" in (ROOT / "_toc.yml").read_text()


def test_the_minutes_an_exercise_states_are_its_metadata_s():
    """3e and 3f sent students to the instructors' table for their time, a page students are told not to see:
    an exercise that states its time states the one in its metadata (the instructors' table's)."""
    stated = {}
    for path in EXERCISE_PATHS:
        meta = nbformat.read(path, as_version=4).metadata[handout.META_KEY]
        text = " ".join(path.with_suffix(".md").read_text().split())
        assert "instructors' table" not in text, path.name
        for n in re.findall(r"\babout (\d+) minutes once", text):
            stated[path.stem] = int(n)
            assert int(n) == meta["minutes"], (path.name, n, meta["minutes"])
    assert {"3e-shard-the-state", "3f-choose-a-layout"} <= set(stated), stated


@pytest.mark.parametrize("path", EXERCISE_PATHS, ids=lambda p: p.stem)
def test_exercise_structure_and_student_copy(path):
    nb = nbformat.read(path, as_version=4)
    assert handout.lint(nb, path.name) == []
    assert nb.cells[0].source.startswith("# @title Setup"), "first cell must be the shared setup cell"
    student = handout.student_notebook(nb)
    assert handout.answer_leaks(student) == []
    text = nbformat.writes(student)
    assert "What this exercise showed" not in text, "the results summary leaks"
    assert "@grader" not in text and "check_close(" not in text, "a hidden test leaks"
    for cell in nb.cells:
        if handout.is_solution_cell(cell):
            solution = handout._replace_regions(cell.source, handout.BEGIN_SOLUTION, handout.END_SOLUTION, "")
            assert "hide-cell" in cell.metadata.get("tags", []) or not solution.strip(), \
                "solutions are hidden behind a toggle in the book"
        if handout.is_check_cell(cell):
            # the hidden part takes values only from instructor cells and the answers handed in
            hidden = handout.hidden_part(cell.source)
            assert "got[" in hidden, "a check reads the handed-in answers from got"
    remarked = handout.mark(nbformat.from_dict(nb))  # the metadata follows from what the cells say
    assert [c.metadata for c in remarked.cells] == [c.metadata for c in nb.cells]
    ids = [g for g, _, _ in handout.check_cells(nb)]
    assert len(ids) >= 2 and all(g.startswith(nb.metadata[handout.META_KEY]["id"] + "-") for g in ids)


def test_no_check_reads_a_name_that_a_solution_defines():
    """Hidden parts run in the reference process, where no solution ran: a solution's name there is a bug."""
    for path in EXERCISE_PATHS:
        nb = nbformat.read(path, as_version=4)
        solved: set[str] = set()
        for cell in nb.cells:
            if cell.cell_type == "code" and handout.is_solution_cell(cell):
                for node in ast.walk(ast.parse(cell.source)):
                    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                        solved.add(node.id)
                    elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                        solved.add(node.name)
        given: set[str] = set()
        for cell in nb.cells:
            if cell.cell_type != "code" or handout.is_solution_cell(cell):
                continue
            if handout.is_check_cell(cell):
                tree = ast.parse(handout.hidden_part(cell.source))
                local = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                local |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
                          for a in n.args + n.kwonlyargs}
                local |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                bad = (read & solved) - given - local
                assert not bad, f"{path.name}: a hidden test reads {sorted(bad)}, which only a solution defines"
            else:
                given |= {n.id for n in ast.walk(ast.parse(cell.source))
                          if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                given |= {n.name for n in ast.walk(ast.parse(cell.source))
                          if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


# --------------------------------------------------------------------------
# the free-text question of 2b, checked by its own reference check
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def check_2b_q5():
    # the check reads the given days and chapter 2's price of recomputation from the notebook's given cells
    return reference.load(EXERCISES / "2b-should-they-checkpoint.ipynb", questions=["2b-q5"])["2b-q5"]


# the arithmetic the question asks for, in a sentence that makes none of the key points: 20 days x 32/27
DAYS = " With early stop the run would take about 23.3 days, inside the 25 allowed."


GOOD_ANSWERS_WITHOUT_DAYS = [
    "Yes, I would turn it on here. Memory is what blocks us, and checkpointing keeps fewer activations, so the "
    "memory needed goes down. The price is extra compute, because the dropped activations are recomputed in "
    "backward, so each step takes longer.",
    "I would turn it on. Recomputing activations instead of storing them reduces activation memory a lot. "
    "It costs roughly a third more compute time per step, which is fine when memory is the only blocker.",
    # graded examples (review I1): ordinary right answers that the screen used to flag. A negation about
    # something else, "not storing" as the mechanism, a bare "Yes." first, an alternative that comes first
    "Yes, I would turn it on, since memory is the only blocker. Checkpointing stores fewer activations, so "
    "activation memory drops a lot. Recomputing them in backward adds roughly one extra forward pass, so each "
    "step takes more time. It does not change the gradients or the result.",
    "Yes, it is worth it here. Checkpointing reduces activation memory without changing the result. The price "
    "is extra compute: the discarded activations are recomputed during backward, so steps take longer.",
    "It is a good idea here because memory is the only bottleneck. Checkpointing reduces memory usage by not "
    "storing all the activations. The downside is that the step takes longer, since activations must be "
    "recomputed.",
    "Yes. Activation checkpointing throws away most intermediate activations in the forward pass and recomputes "
    "them during the backward pass. This lowers peak memory, often enough to make the model fit. The cost is "
    "roughly one extra forward pass per step, so training is about 20-30% slower.",
    "I would first cut the micro-batch and accumulate gradients, and use selective recomputation if that is not "
    "enough. Checkpointing keeps fewer activations, so memory goes down. The recomputation adds extra compute, "
    "so each step takes longer.",
    "Yes, I would. With checkpointing we only keep the activations at segment boundaries, so activation memory "
    "shrinks from O(n) to about O(sqrt n). The backward pass has to rerun the forward for each segment, so the "
    "step costs about one more forward pass of compute.",
]
# graded examples: verdicts in other words ("enable", "turn it on", "recommend", "use checkpointing"), and a
# sentence that sets the recovery checkpoint apart instead of confusing the two
GOOD_ANSWERS_WITHOUT_DAYS += [
    "I would enable it. Checkpointing keeps fewer activations, so the memory needed goes down. "
    "The recomputation adds extra compute, so each step takes longer.",
    "Turn it on. Checkpointing keeps fewer activations, so the memory needed goes down. "
    "The recomputation adds extra compute, so each step takes longer.",
    "I recommend activation checkpointing for this team. It keeps fewer activations, so the memory needed goes "
    "down. The recomputation adds extra compute, so each step takes longer.",
    "Use checkpointing here, since memory is the only blocker. It stores fewer activations, so the memory needed "
    "goes down. Recomputing them in backward adds extra compute, so each step takes longer.",
    "Yes, I would turn it on. This is not the recovery checkpoint that lets a job restart after a crash. "
    "Activation checkpointing keeps fewer activations, so memory goes down. Recomputing them in backward adds "
    "extra compute, so each step takes longer.",
    "I would enable it. Unlike a recovery checkpoint, which we recover from after a failure, it lives only "
    "inside one step. Checkpointing keeps fewer activations, so memory goes down. The recomputation adds extra "
    "compute, so each step takes longer.",
]
GOOD_ANSWERS = [text + DAYS for text in GOOD_ANSWERS_WITHOUT_DAYS]
FLAGGED_ANSWERS = {  # not failed: a person reads them (the screen names what it did not find)
    "Yes, it is reasonable because it reduces the memory we need, so the model finally fits.": "time",
    "Yes, it is reasonable here, but every step will take more time because of the recomputation.": "memory",
    "No. It would reduce memory, but the extra compute makes each step take longer, so it is not worth it.":
        "verdict",
    "Memory less, memory less. Time more, time more. Yes yes.": "did not find",  # no actor: not a claim
    "Yes yes. Checkpointing memory less, checkpointing memory less. Recomputing time more, recomputing time more.":
        "malformed or repeated",
    "Yes, it saves memory and costs extra compute time, a sensible trade.": "share sentences",
    # graded examples (review I1), borderline: a "no" may be argued well, or not; a person decides
    "Unlike saving the model to disk, which only protects against crashes, checkpointing activations reduces "
    "memory. Yes, it is sensible here. The recomputation adds extra compute, so steps take longer.":
        "misconception",
}
FAILED_ANSWERS = {"": "empty", "Yes.": "words", None: "empty"}
# Answers that use the key words without making the claims. The old
# screen gave each full marks; a screen that cannot tell a claim from its negation must flag them.
FORGED_ANSWERS = {
    # the misconception itself: a recovery checkpoint confused with an activation checkpoint
    "Saving the model to disk frees memory on the device. Writing the file takes extra time.": "misconception",
    "Yes, it is sensible. Writing a checkpoint file to disk frees the device memory we need. "
    "The recomputation adds extra compute, so each step takes more time.": "misconception",
    # negated claims
    "Yes, it is a sensible move. Checkpointing does not reduce the memory the activations need. "
    "The recomputation adds extra compute, so each step takes more time.": "negated",
    "Yes, it is worth it. Checkpointing keeps fewer activations, so memory goes down. "
    "The recomputation never adds compute, and each step takes no more time.": "negated",
    # the opposite claims
    "Yes, it is sensible. Checkpointing keeps fewer activations, so memory goes down. "
    "Recomputation makes every step faster than before.": "misconception",
    # the recovery checkpoint in other words (a save "every hour", "a checkpoint of the model", resuming)
    "Yes, it is sensible. Saving a checkpoint of the model every hour lowers the memory on the GPU. "
    "Writing it costs more time.": "misconception",
    "Yes, it is worth it. Checkpointing keeps fewer activations, so the memory goes down. "
    "It also means we can resume after a crash, which takes more time.": "recovery checkpoint",
    "Yes, I would enable it. Checkpointing keeps fewer activations, so the memory goes down. "
    "It also lets the job restart from the last step after a crash, which takes more time.": "recovery checkpoint",
    # a "no" in the new verdict words is no verdict
    "I would not enable it. Checkpointing keeps fewer activations, so memory goes down. "
    "The recomputation adds extra compute, so each step takes longer.": "verdict",
    "I would not turn it on. Checkpointing keeps fewer activations, so memory goes down. "
    "The recomputation adds extra compute, so each step takes longer.": "verdict",
    # the key words in the wrong relation: more activations kept cannot lower memory
    "Yes, it is sensible. Checkpointing keeps more activations, so memory is reduced. "
    "It adds extra compute, so each step takes more time.": "keeps more activations",
    # off-topic sentences that use the key words
    "Yes, I would turn it on. Memory prices are lower this year than last. "
    "My commute takes more time every morning now.": "did not find",
    # graded examples (review I1): wrong claims in the key words, which the screen used to pass
    "Yes, it is sensible. Checkpointing keeps fewer activations, so memory goes down. "
    "The gradients are recomputed in backward, which takes more time.": "gradients, weights or optimizer",
    "Yes, it is sensible. Checkpointing discards the weights of some layers, so memory goes down. "
    "Recomputing them takes more time.": "gradients, weights or optimizer",
    "Yes, it is sensible. Checkpointing keeps fewer activations, so memory goes down. "
    "But it doubles the step time because everything runs twice.": "doubles the step",
    "Yes, it is sensible. Checkpointing moves the activations to the CPU, so GPU memory goes down. "
    "Copying them back adds extra time.": "offloading",
    "Yes, it is sensible. Checkpointing compresses the activations, so memory goes down. "
    "Decompressing them adds extra time.": "compresses",
    "Yes, it is sensible. Checkpointing reduces the number of parameters, so memory goes down. "
    "It takes more time.": "model smaller",
    "Yes. Checkpointing makes the model smaller, so it fits in memory with less to store. "
    "The step takes more time.": "model smaller",
    "Yes, it is sensible. Checkpointing keeps fewer gradients, so memory goes down. "
    "The recomputation adds extra compute, so each step takes more time.": "gradients, weights or optimizer",
    # a negation in a clause of its own, about the point's subject, or an elliptical hedge
    "Yes, it is sensible. Checkpointing keeps fewer activations, so memory does not go down much. "
    "The recomputation adds extra compute, so each step takes more time.": "negated",
    "Yes, it is sensible. Checkpointing keeps fewer activations, so memory goes down, but not by much. "
    "The recomputation adds extra compute, so each step takes more time.": "negated",
    "Yes, it is sensible. Checkpointing keeps fewer activations, so memory goes down without any extra time. "
    "The recomputation runs the forward again.": "negated",
}


def _run(check, text):
    from lessonlib.grading.graders import Answers

    return check(Answers(reply=text))


@pytest.mark.parametrize("text", GOOD_ANSWERS)
def test_free_text_with_each_key_point_in_its_own_sentence_passes(check_2b_q5, text):
    _run(check_2b_q5, text)


# the run's length with checkpointing, in days, priced as question 3 prices the step (forward and backward, 0.9
# of it, grow by the FLOP ratio; the optimizer is not rerun): right within 3 % of 20 x (1 + 0.9 x 5/27) = 23.3
# (early stop on the notebook's blocks, whose last Linear does 4/9 of the work), which meets the 25-day deadline;
# each block rerun whole (20 x (1 + 0.9/3) = 26.0) misses it, so a reply giving only that length is flagged
RIGHT_DAYS = ["about 23.3 days", "23.5 days", "23 days", "a 23-day run", "roughly 23-24 days", "23.33 days"]
WRONG_DAYS = {"about 26.0 days": "whole-block recomputation's", "26 days": "whole-block recomputation's",
              "about 26.7 days": "whole-block recomputation's", "21 days": "check the arithmetic",
              "about 32 days": "check the arithmetic", "35 days": "check the arithmetic",
              "20 days": "no length of the checkpointed run", "a few more weeks": "no length of the checkpointed run"}


@pytest.mark.parametrize("days", RIGHT_DAYS)
def test_free_text_with_the_checkpointed_days_passes(check_2b_q5, days):
    _run(check_2b_q5, GOOD_ANSWERS_WITHOUT_DAYS[0] + f" With checkpointing it runs for {days}, inside the deadline.")


@pytest.mark.parametrize("days,why", WRONG_DAYS.items())
def test_free_text_without_the_right_days_is_flagged(check_2b_q5, days, why):
    with pytest.raises(Flag, match=why):
        _run(check_2b_q5, GOOD_ANSWERS_WITHOUT_DAYS[0] + f" With checkpointing it runs for {days}, inside the deadline.")


@pytest.mark.parametrize("text", GOOD_ANSWERS_WITHOUT_DAYS)
def test_free_text_with_every_key_point_but_no_days_is_flagged(check_2b_q5, text):
    with pytest.raises(Flag, match="no length of the checkpointed run"):
        _run(check_2b_q5, text)


@pytest.mark.parametrize("text,why", FLAGGED_ANSWERS.items())
def test_free_text_otherwise_is_flagged_for_the_instructor(check_2b_q5, text, why):
    with pytest.raises(Flag, match=why):
        _run(check_2b_q5, text)


@pytest.mark.parametrize("text,why", FORGED_ANSWERS.items())
def test_free_text_that_negates_or_misstates_a_key_point_is_flagged_not_passed(check_2b_q5, text, why):
    with pytest.raises(Flag, match=why):
        _run(check_2b_q5, text)


@pytest.mark.parametrize("text,why", FAILED_ANSWERS.items())
def test_free_text_that_is_empty_or_too_short_fails(check_2b_q5, text, why):
    with pytest.raises(AssertionError, match=why):
        _run(check_2b_q5, text)


def test_2b_summary_compares_the_slowdown_it_measured():
    """2b's summary said "the slowdown is smaller" beside a measured 1.42x: the comparison
    is made from this run's FLOP ratio and its timed steps, never typed."""
    nb = nbformat.read(EXERCISES / "2b-should-they-checkpoint.ipynb", as_version=4)
    summary = next(c.source for c in nb.cells if "What this exercise showed" in c.source)
    assert "time_ratios(" in summary and "step_flops(" in summary
    # the timed step is PyTorch's default (early stop on): compared with that configuration's FLOP ratio
    # a direction is claimed only outside the spread of the medians, and "more" is what chapter 2 explains
    assert "if _t > 1.05 * _r_timed:" in summary and "elif _t < _r_timed / 1.05:" in summary
    assert "early_stop=True" in summary and "Memory against compute" in summary
    assert "no more time per FLOP" not in summary and "pulls the other way" not in summary
    assert not re.search(r"slowdown is (smaller|larger|bigger)", summary)


# --------------------------------------------------------------------------
# grading the real exercises through the sandboxed grader
# --------------------------------------------------------------------------

def _answer(nb, grade_id: str, code: str, replace: bool = False):
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = code if replace else cell.source + "\n" + code
    return nb


@pytest.fixture(scope="module")
def graded_real(tmp_path_factory):
    """One grading run over every exercise: the instructor's notebook and an untouched student copy of
    each, and two more submissions of 3c (a wrong answer; a redefined helper)."""
    if NO_SANDBOX:
        pytest.skip(f"no sandbox here: {NO_SANDBOX}")
    sub = tmp_path_factory.mktemp("real") / "submitted"
    for path in EXERCISE_PATHS:
        src = nbformat.read(path, as_version=4)
        for who, nb in (("instructor", src), ("blank", handout.student_notebook(src))):
            (sub / who).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, sub / who / path.name)
    c3 = EXERCISES / "3c-bubbles-and-paid-capacity.ipynb"
    wrong = _answer(nbformat.read(c3, as_version=4), "3c-a2",
                    "schedule_idle = 3 / 8  # (p - 1) / (m + p - 1) with m = 4 by mistake")
    # the old hidden test computed its expected value with parallel.pipeline_bubble_fraction, in the
    # student's kernel: redefine it, answer to match, and the old grader gave full marks
    redefined = _answer(nbformat.read(c3, as_version=4), "3c-a1",
                        "parallel.pipeline_bubble_fraction = lambda p, m: 0.5\nbubble_4, min_microbatches = 0.5, 1",
                        replace=True)
    for who, nb in (("wrong", wrong), ("redefined", redefined)):
        (sub / who).mkdir(parents=True)
        nbformat.write(nb, sub / who / c3.name)
    results = autograde.grade_folder(sub, EXERCISES, cell_timeout=60, budget=150, jobs=2, progress=None)
    return {(r.student, r.exercise): r for r in results}, sub


@pytest.mark.notebooks
@pytest.mark.parametrize("path", EXERCISE_PATHS, ids=lambda p: p.stem)
def test_instructor_full_marks_student_copy_runs_to_stubs_and_scores_zero(graded_real, path):
    by, sub = graded_real
    full, empty = by[("instructor", path.stem)], by[("blank", path.stem)]
    assert full.score == full.max_score > 0, [q for q in full.questions if q.status != "passed"]
    assert all(status == "ok" for _, status, _ in full.cells), full.cells
    assert empty.score == 0, [q for q in empty.questions if q.points]
    nb = nbformat.read(sub / "blank" / path.name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    first_stub = min(i for i, c in enumerate(code) if "raise NotImplementedError()" in c.source)
    for i, status, msg in empty.cells:
        if i < first_stub:
            assert status == "ok", f"cell {i} fails before any stub: {msg}"


@pytest.mark.notebooks
def test_a_wrong_answer_in_a_real_exercise_loses_exactly_its_question(graded_real):
    by, _ = graded_real
    wrong = by[("wrong", "3c-bubbles-and-paid-capacity")]
    lost = {q.grade_id: q.max_points - q.points for q in wrong.questions}
    assert lost == {"3c-q1": 0, "3c-q1b": 0, "3c-q2": 3, "3c-q3": 0, "3c-q3b": 0}, wrong.questions
    assert "not right: it is too large" in next(q for q in wrong.questions if q.grade_id == "3c-q2").message


@pytest.mark.notebooks
def test_redefining_the_helper_an_old_hidden_test_used_earns_nothing(graded_real):
    by, _ = graded_real
    redefined = by[("redefined", "3c-bubbles-and-paid-capacity")]
    assert redefined.questions[0].points == 0, redefined.questions


# --------------------------------------------------------------------------
# answers that must agree (2a), and options the data can decide (1c)
# --------------------------------------------------------------------------

def _plan_answers(keep_q3, keep_q2, extra, extra_early=None):
    from lessonlib.grading.graders import decode_answers

    answers = {"keep": {"$set": keep_q3}, "extra_forward_calls": extra, "extra_gelu_calls_early": extra_early}
    if keep_q2 is not None:
        answers["@2a-q2"] = {"$dict": [["keep", {"$set": keep_q2}]]}
    return decode_answers(answers)


def test_2a_counts_the_recomputation_of_question_2s_plan_only():
    """Q3's plan was never compared with q2's; keep everything in q3 and 0 extra calls passed."""
    checks = reference.load(EXERCISES / "2a-place-the-checkpoints.ipynb", questions=["2a-q3", "2a-q3b"])
    whole, early = checks["2a-q3"], checks["2a-q3b"]
    whole(_plan_answers([2, 4], [2, 4], 4))
    early(_plan_answers([2, 4], [2, 4], None, 1))  # early stop: each segment's last GELU never finishes
    for check in (whole, early):
        with pytest.raises(AssertionError, match="your plan from question 2"):
            check(_plan_answers([1, 2, 3, 4, 5, 6], [2, 4], 0, 0))
        with pytest.raises(AssertionError, match="nothing was handed in to 2a-q2"):
            check(_plan_answers([1, 2, 3, 4, 5, 6], None, 0, 0))
    with pytest.raises(AssertionError, match="extra_gelu_calls_early"):  # the whole rerun's count, copied over
        early(_plan_answers([2, 4], [2, 4], 4, 4))
    # the two counts are scored on their own: a wrong early-stop count costs only its own point
    whole(_plan_answers([2, 4], [2, 4], 4, 4))


# --------------------------------------------------------------------------
# measurements taken on trust (3a): the times must hold together as measured times do
# --------------------------------------------------------------------------

def _timing_answers(seconds=None, rounds=None):
    import random
    import statistics

    from lessonlib.grading.graders import decode_answers

    rng = random.Random(0)
    if rounds is None:
        rounds = {k: [rng.uniform(1e-4, 1e-3) for _ in range(20)] for k in ("forward", "loss", "backward", "optimizer")}
        rounds["step"] = [sum(rounds[k][r] for k in ("forward", "loss", "backward", "optimizer")) for r in range(20)]
    if seconds is None:
        seconds = {k: statistics.median(v) for k, v in rounds.items()}
    share = seconds["optimizer"] / sum(seconds[k] for k in ("forward", "loss", "backward", "optimizer"))
    answers = {"measured": {"$dict": [[k, v] for k, v in seconds.items()]}, "serial_share": share,
               "predicted_speedup_4": 1 / (share + (1 - share) / 4)}
    if rounds is not False:
        answers["rounds"] = {"$dict": [[k, v] for k, v in rounds.items()]}
    return decode_answers(answers)


def test_3a_typed_in_times_are_flagged_measured_ones_pass():
    """Deleting the measuring cell and typing plausible times in got full marks."""
    check = reference.load(EXERCISES / "3a-amdahl-for-the-retailer.ipynb", questions=["3a-q4"], given=False)["3a-q4"]
    check(_timing_answers())
    typed = {"forward": 0.004, "loss": 0.0005, "backward": 0.008, "optimizer": 0.002}
    with pytest.raises(Flag, match="rounds is missing"):
        check(_timing_answers(seconds=typed, rounds=False))
    with pytest.raises(Flag, match="not the median of its rounds"):
        check(_timing_answers(seconds=dict(typed, step=sum(typed.values()))))
    good = _timing_answers()
    bad_step = {k: list(v) for k, v in good["rounds"].items()}
    bad_step["step"][3] *= 1.5
    with pytest.raises(Flag, match="sum of its phases"):
        check(_timing_answers(rounds=bad_step))


def test_the_measuring_cells_of_3a_and_3b_are_declared_for_the_grader():
    for stem, questions in (("3a-amdahl-for-the-retailer", {"3a-q4"}), ("3b-predict-the-two-process-step",
                                                                        {"3b-q2", "3b-q2b", "3b-q3", "3b-q3b", "3b-q4", "3b-q4b", "3b-q4c",
                                                                         "3b-q5", "3b-q5b", "3b-q5c"}),
                            ("3e-shard-the-state", {"3e-q2"})):
        ex = autograde.Exercise.load(EXERCISES / f"{stem}.ipynb")
        assert set(ex.measured) == questions, ex.measured


def _given_names(nb) -> dict:
    """What the given cell that states the job (it defines n_params) defines, run."""
    ns: dict = {}
    job = next(c for c in nb.cells if c.cell_type == "code" and "n_params =" in c.source
               and not handout.is_solution_cell(c) and not handout.is_check_cell(c))
    exec(compile(job.source, "given", "exec"), ns)
    return ns


def test_1c_offers_time_only_with_the_data_to_decide_it():
    """1c offered "time" as an answer without any compute data."""
    from lessonlib.calc import planner

    nb = nbformat.read(EXERCISES / "1c-will-it-fit.ipynb", as_version=4)
    check = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "1c-q2")
    offered = ast.literal_eval(next(line for line in check.source.splitlines()
                                    if line.startswith("check_one_of(\"failure\"")).split(", ", 2)[2].rstrip(")"))
    assert "time" in offered
    given = _given_names(nb)
    for name in ("train_tokens", "device_flops_per_s", "max_days"):
        assert name in given, f"1c offers 'time' but gives no {name}"
    kwargs = dict(seq_len=given["seq_len"], layers=given["layers"], hidden=given["hidden"], heads=given["heads"],
                  device_bytes=int(given["device_bytes"]), train_tokens=given["train_tokens"],
                  device_flops_per_s=given["device_flops_per_s"], max_days=given["max_days"],
                  attention="stored")  # 1c's model stores its attention scores, as its hidden tests count
    # each option is one the data can lead to: at this micro-batch the activations fail first; at one
    # sequence per device everything fits and only the time is too long
    assert planner.plan(given["n_params"], batch_per_device=given["micro_batch"], **kwargs).failure == "activations"
    assert planner.plan(given["n_params"], batch_per_device=1, **kwargs).failure == "time"
    question = next(c.source for c in nb.cells if c.cell_type == "markdown" and "name the failure" in c.source)
    assert "`max_days`" in question and "`train_tokens`" in question and "`device_flops_per_s`" in question


# --------------------------------------------------------------------------
# 2c: a save that is durable, and a run that leaves nothing behind
# --------------------------------------------------------------------------

def test_2c_checks_the_folder_fsync_after_the_rename():
    """2c's atomic save left out the folder fsync that chapter 2's "Recovery checkpoints" requires."""
    nb = nbformat.read(EXERCISES / "2c-how-often-to-save.ipynb", as_version=4)
    check = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "2c-q1")
    hidden = handout.hidden_part(check.source)
    assert '"fsync folder" in events[last + 1:]' in hidden and '"fsync file" in events[:last]' in hidden
    solution = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "2c-a1").source
    assert "os.O_DIRECTORY" in solution and solution.index("os.replace") < solution.index("os.fsync(folder)")
    question = next(c.source for c in nb.cells if c.cell_type == "markdown" and "## Question 1" in c.source)
    assert "O_DIRECTORY" in question and '"Recovery checkpoints"' in question  # the page, by its title


@pytest.mark.slow  # runs the notebook: about half a minute
def test_running_2c_leaves_no_files_in_the_temp_folder(tmp_path):
    """Seven exercise-2c-* folders were left by nbclient runs (a killed kernel runs no finaliser)."""
    import os
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = ("import nbformat, nbclient, sys\n"
            "nb = nbformat.read(sys.argv[1], as_version=4)\n"
            "nbclient.NotebookClient(nb, timeout=120, kernel_name='python3', shutdown_kernel='immediate',\n"
            "                        resources={'metadata': {'path': sys.argv[2]}}).execute()\n")
    # torch keeps its compile cache in the temp folder on purpose (it persists between runs): elsewhere here
    env = dict(os.environ, TMPDIR=str(tmp), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               OMP_NUM_THREADS="1", MPLBACKEND="agg")
    run = subprocess.run([sys.executable, "-c", code, str(EXERCISES / "2c-how-often-to-save.ipynb"), str(EXERCISES)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in tmp.iterdir()) == []


# --------------------------------------------------------------------------
# 1a: an answer the chapter has not printed, and a rule the student finds
# --------------------------------------------------------------------------

def test_1a_uses_a_model_no_chapter_prints_and_asks_for_the_first_layer_rule():
    """Review I1: chapter 1.1 printed 1a's answer (2.902 for ForecastMLP(28, 256, 2)), and 1a's question 3 handed
    over the first-layer rule it asked for: the student now predicts with the two-products rule, then finds
    which layer's product the counter leaves out, and why."""
    text = (EXERCISES / "1a-price-the-training-step.md").read_text()
    mine = re.search(r"window, hidden, batch = (\d+), (\d+), \d+\nmodel = ForecastMLP\(window=window, hidden=hidden, "
                     r"layers=(\d+)\)", text)
    assert mine, "1a builds its model from window, hidden and layers"
    config = tuple(int(v) for v in mine.groups())
    for page in sorted((ROOT / "chapters").glob("*/[0-9]*.md")):
        for m in re.finditer(r"ForecastMLP\(window=(\w+), hidden=(\d+), layers=(\d+)\)", page.read_text()):
            window = int(m.group(1)) if m.group(1).isdigit() else None
            assert (window, int(m.group(2)), int(m.group(3))) != config, f"{page.name} runs 1a's model"
    q2 = text[text.index("## Question 2"):text.index("## Question 3")]
    q3 = text[text.index("## Question 3"):text.index("## Question 4")]
    assert q2.index("rule_backward_flops") < q2.index("count_flops"), "predict before measuring"
    for giveaway in ("first layer is different", "needs no gradient.", "input is the data, which needs no gradient."):
        assert giveaway not in q2.split("```{code-cell}")[0], giveaway
    assert '"its input is the data, which needs no gradient"' in q3  # one of four choices, not the rule stated


def test_1b_names_the_step_counter_and_makes_the_bf16_rule_relative():
    """Review I1: Q1 was vague about Adam's step tensor (the ratio is 2.0001, not 2), and 'training stalls' held
    only for weights near 1: the rule is relative to the weight, and Q3 now measures it at two sizes."""
    text = (EXERCISES / "1b-count-the-training-state.md").read_text()
    q1 = text[text.index("## Question 1"):text.index("## Question 2")]
    q3 = text[text.index("## Question 3"):text.index("## What this exercise showed")]
    assert "`step`" in q1 and "counters included" in q1 and "rel=1e-3" not in q1
    assert "smallest_update_small" in q3 and "relative to the weight" in q3 and "training stalls" not in text


def test_1c_asks_for_the_time_failure_and_what_data_parallelism_fixes():
    """Review I1: the summary hid that the job also fails on time (68 days > 30), and micro-batch 5 was offered
    as a remedy without saying it makes no token faster: the days on one and on four devices are asked and
    checked, and the summary says both."""
    nb = nbformat.read(EXERCISES / "1c-will-it-fit.ipynb", as_version=4)
    hand = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade", False)}
    assert "days_one_device=days_one_device" in hand["1c-q2b"] and "days_on_4=days_on_4" in hand["1c-q3c"]
    summary = next(c.source for c in nb.cells if "What this exercise showed" in c.source)
    assert "fails on time too" in summary and "fixes the time, not the memory" in summary
    assert "no token faster" in summary and "after page 1.7's" in summary and "planner.RESERVE" in summary
    from lessonlib.calc import planner
    given = _given_names(nb)
    days = planner.single_device_seconds(planner.training_flops(given["n_params"], given["train_tokens"]),
                                         given["device_flops_per_s"]) / 86_400
    assert days > given["max_days"] > days / 4  # one device fails on time; four do not


def test_2a_q4_asks_for_the_derivation_not_a_min_over_a_given_formula():
    """Review I1: Q4 (2 points) was one `min` over a formula the question supplied (with a stray bracket)."""
    text = (EXERCISES / "2a-place-the-checkpoints.md").read_text()
    q4 = text[text.index("## Question 4"):text.index("# Check 2a-q4")]
    assert "chain_memory_units" not in q4 and "\\lceil" not in q4 and "computes it)." not in text
    given = text[:text.index("## Question 1")]
    assert "chain_memory_units" not in given, "the formula's function is not handed to the student"
    summary = text[text.index("# @title What this exercise showed"):]
    assert "_two[_low]" in summary and "_two[_high]" in summary  # the placement contrast, computed


def test_3a_summary_reports_the_measured_step_and_q4_says_plain_data_parallelism():
    """Review I1: the summary's '2.5x on this step' read as the measured step, whose result it never gave; Q4's
    serial update holds for plain data parallelism only; the printed step is not the sum of phase medians."""
    text = (EXERCISES / "3a-amdahl-for-the-retailer.md").read_text()
    q4 = text[text.index("## Question 4"):text.index("# Check 3a-q4")]
    assert "plain data parallelism" in q4 and "ZeRO" in q4 and "a median of sums is not a sum" in q4
    summary = text[text.index("# @title What this exercise showed"):]
    assert "timing.seconds" in summary and "speedup_from_share" in summary and "questions 2 and 3" in summary
    assert "{ex3a_ceiling_q1:.2f}" in summary  # question 1's job, read back from two runs, is reported too


def test_3c_says_how_the_losses_combine_and_that_the_schedule_is_a_simulation():
    """Review I1: Q3 could be read as subtracting the stall and the bubble; Q2 called a computed schedule a
    measurement; prices had no unit; 'never remove it' ignored zero-bubble schedules."""
    text = (EXERCISES / "3c-bubbles-and-paid-capacity.md").read_text()
    q2 = text[text.index("## Question 2"):text.index("## Question 3")]
    q3 = text[text.index("## Question 3"):text.index("# Check 3c-q3")]
    assert q2.startswith("## Question 2: count") and "measure the" not in q2.lower() and "not a measurement" in q2
    # the stall and the bubble are stated as facts (the bubble in the hours it runs); how they combine is the
    # question (a later review: "so the two losses multiply" gave it away)
    assert "multiply" not in q3 and "In the hours it runs" in q3 and "US dollars" in q3
    assert "zero-bubble" in text[text.index("## What this exercise showed"):]


def test_3d_defines_the_state_failure_and_says_the_price_is_an_h800_price():
    """Review I1: 'failure 1' was never defined on the page, and the A100 bill used an H800 rental price unsaid."""
    from lessonlib.calc import published

    text = (EXERCISES / "3d-price-a-published-run.md").read_text()
    assert "failure 1" not in text.lower() and "the state failure" in text
    assert "H800" in published.DEEPSEEK_V3["price_per_gpu_hour"].unit  # the cited assumption is an H800 price
    q4 = text[text.index("## Question 4"):text.index("# Check 3d-q4")]
    assert "*H800* hour" in q4 and "A100" in q4 and "KERNEL_EFFICIENCY" in text


def test_3e_held_follows_from_the_measurement_not_from_the_formula():
    """Review I1: 3e's 'measured' answer was checked only against the formula, so typing the formula's value
    passed. Now it must add up the measurement handed in, and a measurement that is not fully_shard's is flagged."""
    from lessonlib.grading.graders import decode_answers
    from lessonlib.measure.distributed.fsdp import MODEL
    from lessonlib.measure.models import TinyGPT

    check = reference.load(EXERCISES / "3e-shard-the-state.ipynb", questions=["3e-q2"], given=False)["3e-q2"]
    n = sum(p.numel() for p in TinyGPT(**MODEL).parameters())
    share = {"weights": 4 * n // 4, "gradients": 4 * n // 4, "optimizer_state": 8 * n // 4, "step_counters": 116}

    def answers(held, measured):
        return decode_answers({"held": held, "formula": 16 * n / 4,
                               "measured": [{"$dict": [[k, v] for k, v in m.items()]} for m in measured]})

    check(answers([16 * n // 4] * 4, [share] * 4))
    with pytest.raises(AssertionError, match="held\\[0\\]"):  # the formula typed in, against another measurement
        check(answers([16 * n // 4] * 4, [dict(share, weights=share["weights"] + 64)] + [share] * 3))
    with pytest.raises(Flag, match="not what fully_shard leaves"):  # a measurement made to match a typed answer
        typed = dict(share, weights=share["weights"] + 64)
        check(answers([sum(typed[k] for k in ("weights", "gradients", "optimizer_state"))] * 4, [typed] * 4))


def test_no_summary_reads_a_name_only_a_solution_or_a_hidden_check_defines():
    """A summary (instructor-only) that read 2a-q4's hidden `_k` failed in the sandboxed grading run, where hidden
    parts do not run in the notebook's kernel; one that reads a solution's name fails wherever it is not solved."""
    import builtins

    for path in EXERCISE_PATHS:
        nb = nbformat.read(path, as_version=4)
        given: set[str] = set(dir(builtins))
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            src = handout.visible_part(cell.source) if handout.is_check_cell(cell) else cell.source
            tree = ast.parse(src)
            defined = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            defined |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            defined |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                        if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
            defined |= {a.arg for n in ast.walk(tree) if isinstance(n, (ast.arguments,)) for a in n.args + n.kwonlyargs}
            defined |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
            if handout.INSTRUCTOR_ONLY in cell.metadata.get("tags", []):
                read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                missing = read - given - defined
                assert not missing, f"{path.name}: the summary reads {sorted(missing)}, which no given cell defines"
            elif not handout.is_solution_cell(cell):
                given |= defined


def _checks_without(stem: str, question: str, tmp_path, skip: str):
    """The reference check of ``question``, from a copy of exercise ``stem`` without the given cells holding
    ``skip`` (a measurement that starts processes and that the check does not read). ``question`` may name
    several checks, comma-separated (a question whose answers are checked one by one): all of them are run."""
    nb = nbformat.read(EXERCISES / f"{stem}.ipynb", as_version=4)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and skip in c.source)]
    copy = tmp_path / f"{stem}.ipynb"
    nbformat.write(nb, copy)
    ids = question.split(",")
    checks = reference.load(copy, questions=ids)
    return lambda got: [checks[q](got) for q in ids]


def test_3e_prices_the_collectives_over_all_of_a_nodes_ports_and_asks_for_work_not_a_constant(tmp_path):
    """3e's question 3 priced ZeRO-3's collectives through one port (the mistake page 3.10 lists, 8x too slow) and
    asked for a ratio to data parallelism's all-reduce that is 1.5 whatever the link."""
    from lessonlib.calc import hardware
    from lessonlib.calc.comm import LINKS, collective_seconds, multi_node_seconds
    from lessonlib.calc.planner import PRESETS
    from lessonlib.grading.graders import decode_answers

    text = (EXERCISES / "3e-shard-the-state.md").read_text()
    assert "ratio_to_ddp" not in text and "collective_seconds" not in text
    assert "not Llama 2 70B" in text
    check = _checks_without("3e-shard-the-state", "3e-q3,3e-q3b", tmp_path, skip="run_sharding(")
    n, devices, tokens = PRESETS["70B"]["n_params"], 64, 64 * 512
    nv, ib = LINKS["nvlink"], LINKS["infiniband"]
    ag, rs = (multi_node_seconds(k, 2 * n, devices, 8, nv, ib) for k in ("all_gather", "reduce_scatter"))
    # the collectives hide behind kernels while they run: compute at the kernels' share of the peak, not a
    # whole step's MFU (which already counts the waiting), as the layout search does
    fwd = 2 * n * tokens / (devices * hardware.sustained_flops_per_s(utilisation=hardware.KERNEL_EFFICIENCY))
    exposed = max(0.0, ag - fwd) + max(0.0, ag + rs - 2 * fwd)
    assert exposed > 0, "the given step is short enough that some traffic shows"
    check(decode_answers({"gather_seconds": ag, "zero3_seconds": 2 * ag + rs, "exposed_seconds": exposed}))
    one_port = sum(collective_seconds(k, 2 * n, devices, ib.alpha_s, ib.beta_bytes_per_s)
                   for k in ("all_gather", "all_gather", "reduce_scatter"))
    with pytest.raises(AssertionError, match="zero3_seconds"):
        check(decode_answers({"gather_seconds": ag, "zero3_seconds": one_port, "exposed_seconds": exposed}))
    with pytest.raises(AssertionError, match="exposed_seconds"):  # nothing hidden: the whole traffic exposed
        check(decode_answers({"gather_seconds": ag, "zero3_seconds": 2 * ag + rs, "exposed_seconds": 2 * ag + rs}))
    # review r20: the step across nodes is the student's, by hand (the library call only checks it): the all-gather
    # priced from the ring's steps passes within 1 %, one port's pace (8x slower) fails
    k_nodes = devices // 8
    by_hand = ((devices - k_nodes) * nv.alpha_s + (k_nodes - 1) * ib.alpha_s
               + (devices - 1) * 2 * n / (devices * min(nv.beta_bytes_per_s, 8 * ib.beta_bytes_per_s)))
    assert abs(by_hand / ag - 1) < 1e-9
    check(decode_answers({"gather_seconds": by_hand * 1.005, "zero3_seconds": 2 * ag + rs, "exposed_seconds": exposed}))
    with pytest.raises(AssertionError, match="gather_seconds"):
        slow = collective_seconds("all_gather", 2 * n, devices, ib.alpha_s, ib.beta_bytes_per_s)
        check(decode_answers({"gather_seconds": slow, "zero3_seconds": 2 * ag + rs, "exposed_seconds": exposed}))
    q3 = " ".join(text[text.index("## Question 3"):text.index("# Check 3e-q3 ")].split())
    assert "by hand, in `gather_seconds`" in q3 and "use it to check yours" in q3


def _words(text: str) -> str:
    return " ".join(re.sub(r"[*.,;:]", " ", text).lower().split())


def test_the_intro_the_instructor_page_and_each_exercise_state_the_same_objectives():
    """The intro's outcomes are the course's learning objectives: the instructor page lists the same, under
    the same numbers, and each exercise names its objective in the same words (the intro once listed three,
    the instructor page four, and 3d worded its objective its own way)."""
    index = (EXERCISES / "index.md").read_text()
    listed = dict(re.findall(r"^(\d)\. \*\*(.+?)\*\*", index, re.M | re.S))
    intro = (ROOT / "intro.md").read_text()
    intro = intro[intro.index("## What you will be able to do"):intro.index("## The map")]
    stated = dict(re.findall(r"^(\d)\. \*\*(.+?)\*\*", intro, re.M | re.S))
    assert {k: _words(v) for k, v in stated.items()} == {k: _words(v) for k, v in listed.items()}
    for path in EXERCISE_PATHS:
        text = path.with_suffix(".md").read_text()
        for n, words in re.findall(r"\*\*Learning objective (\d):\*\* (.+?)(?:\(|\n\n)", text, re.S):
            assert _words(words) == _words(listed[n]), (path.name, n, words)


def test_3a_and_3c_do_not_ask_the_worked_examples_their_chapters_print():
    """3a's questions 1 and 2 were chapter 3.1's worked 20/80 example, and 3c's question 2 (4 stages, 8
    micro-batches) the schedule chapter 3.4 draws: the answers were printed on the pages."""
    chapter = ROOT / "chapters" / "03-distributed-speedup"
    amdahl_page = next(chapter.glob("01-*.md")).read_text()
    worked = re.search(r"^serial, parallel, devices = (\d+), (\d+), \d+$", amdahl_page, re.M)
    ex3a = re.search(r"^serial_units, parallel_units = ([\d.]+), ([\d.]+)$",
                     (EXERCISES / "3a-amdahl-for-the-retailer.md").read_text(), re.M)
    assert worked and ex3a
    assert {float(ex3a.group(1)), float(ex3a.group(2))} != {float(worked.group(1)), float(worked.group(2))}
    pipeline_page = next(chapter.glob("04-*.md")).read_text()
    drawn = re.search(r"^stages, micro = (\d+), (\d+)$", pipeline_page, re.M)
    ex3c = (EXERCISES / "3c-bubbles-and-paid-capacity.md").read_text()
    stages = int(re.search(r"^stages = (\d+)$", ex3c, re.M).group(1))
    q2 = ex3c[ex3c.index("## Question 2"):ex3c.index("# Check 3c-q2")]
    micro = {int(m) for m in re.findall(r"\bschedule\(stages, (\d+),", q2)}
    assert drawn and len(micro) == 1, micro
    assert (stages, micro.pop()) != (int(drawn.group(1)), int(drawn.group(2)))


def test_1a_q3_asks_what_freezing_the_first_layer_saves_and_checks_the_count(tmp_path):
    """1a's question 3 asked for the reason chapter 1.1 states (the data needs no input gradient). It now asks
    what freezing the first layer saves against the unfrozen model's counted backward: the first layer's weight
    gradient and the second's input gradient (the first layer's input gradient was never computed)."""
    import torch

    from lessonlib.grading.graders import decode_answers
    from lessonlib.measure.models import ForecastMLP
    from lessonlib.measure.timing import count_flops

    text = (EXERCISES / "1a-price-the-training-step.md").read_text()
    q3 = text[text.index("## Question 3"):text.index("## Question 4")]
    assert "requires_grad_(False)" in q3
    for page in sorted((ROOT / "chapters" / "01-forward-vs-training").glob("[0-9]*.md")):
        assert "skips the gradient of its input" not in page.read_text(), page.name
    checks = reference.load(EXERCISES / "1a-price-the-training-step.ipynb", questions=["1a-q3", "1a-q3b", "1a-q3c"])

    def check(got):  # question 3's three answers, each checked on its own
        for q in ("1a-q3", "1a-q3b", "1a-q3c"):
            checks[q](got)
    window, hidden, batch = (int(v) for v in re.search(r"window, hidden, batch = (\d+), (\d+), (\d+)", text).groups())
    torch.manual_seed(0)
    model = ForecastMLP(window=window, hidden=hidden, layers=3)
    x, y = torch.randn(batch, window), torch.randn(batch, 1)
    full = count_flops(model, x, y, torch.nn.MSELoss())
    next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).requires_grad_(False)
    frozen = count_flops(model, x, y, torch.nn.MSELoss()).backward
    right = "the first layer skips its weight gradient, and the second skips the gradient of its input"
    check(decode_answers({"frozen_backward_flops": frozen, "skipped_flops": full.backward - frozen,
                          "reason": right}))
    with pytest.raises(AssertionError, match="reason"):
        check(decode_answers({"frozen_backward_flops": frozen, "skipped_flops": full.backward - frozen,
                              "reason": "its input is the data, which needs no gradient"}))
    with pytest.raises(AssertionError, match="skipped_flops"):  # against the two-products rule: overstated
        check(decode_answers({"frozen_backward_flops": frozen, "skipped_flops": 2 * full.forward - frozen,
                              "reason": right}))


def test_2b_q1_is_a_scenario_and_q3_does_not_give_the_direction_away():
    """2b's question 1 defined activation checkpointing in its own text ("keeps fewer tensors from the forward
    pass"), and the step-time question (then question 4, now 3) said the slowdown "is less than 4/3"."""
    text = (EXERCISES / "2b-should-they-checkpoint.md").read_text()
    q1 = text[text.index("## Question 1"):text.index("# Check 2b-q1")].split("```{code-cell}")[0]
    q4 = text[text.index("## Question 3"):text.index("# Check 2b-q3")].split("```{code-cell}")[0]
    assert "fewer" not in q1 and "tensors" not in q1 and "out of memory" in q1
    assert "4/3" not in q4 and "less than" not in q4


def test_2a_visible_and_hidden_checks_accept_the_same_kinds_of_plan():
    """2a's visible check accepted a tuple or a frozenset for keep, its hidden checks only a set or a list."""
    import itertools

    from lessonlib.grading.graders import Answers, decode_answers
    from lessonlib.grading.answers import to_plain

    nb = nbformat.read(EXERCISES / "2a-place-the-checkpoints.ipynb", as_version=4)
    visible = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "2a-q2").source
    accepted = re.search(r"assert isinstance\(keep, \(([^)]*)\)\)", visible).group(1)
    checks = reference.load(EXERCISES / "2a-place-the-checkpoints.ipynb", questions=["2a-q2", "2a-q3"])
    kinds = [set, frozenset, list, tuple]
    assert {k.__name__ for k in kinds} == {w.strip() for w in accepted.split(",")}
    for plan in (set(c) for r in range(7) for c in itertools.combinations(range(1, 7), r)):
        try:
            checks["2a-q2"](Answers(keep=sorted(plan)))
            break
        except AssertionError:
            continue
    for kind in kinds:
        keep = kind(sorted(plan))
        checks["2a-q2"](Answers(keep=keep))  # as the hidden part receives it in a direct call
        checks["2a-q2"](decode_answers({"keep": to_plain(keep)}))  # and through the hand-in


def test_2c_q2_needs_the_sweep_and_q1_tells_a_rename_from_replacing_a_file_with_itself():
    """2c's question 2 passed with Young's interval and a typed goodput, without any sweep; question 1 passed a
    save that wrote the file in place and then called os.replace(path, path)."""
    from lessonlib.calc import reliability
    from lessonlib.grading.graders import decode_answers

    text = (EXERCISES / "2c-how-often-to-save.md").read_text()
    q1_check = text[text.index("# Check 2c-q1"):text.index("### BEGIN HIDDEN TESTS", text.index("# Check 2c-q1"))]
    assert '"replace onto itself" if _same else "replace"' in q1_check
    check = reference.load(EXERCISES / "2c-how-often-to-save.ipynb", questions=["2c-q2"])["2c-q2"]
    nb = nbformat.read(EXERCISES / "2c-how-often-to-save.ipynb", as_version=4)
    job = next(cell for cell in nb.cells if cell.cell_type == "code" and "mtbf_one_s =" in cell.source
               and not handout.is_solution_cell(cell) and not handout.is_check_cell(cell))
    given: dict = {}
    exec(compile(job.source, "given", "exec"), given)  # the job's numbers, as the notebook computes them
    c, m, w = (given[n] for n in ("checkpoint_s", "mtbf_one_s", "work_s"))
    grid = [600 * 1.2 ** k for k in range(20)]
    lost = [reliability.simulate_overhead(t, c, m, w, trials=100, seed=0) for t in grid]
    i = min(range(len(grid)), key=lost.__getitem__)
    check(decode_answers({"intervals": grid, "overheads": lost, "best_interval_s": grid[i],
                          "best_goodput": 1 / (1 + lost[i])}))
    tau = reliability.young_daly_interval(c, m)
    typed = 1 / (1 + reliability.simulate_overhead(tau, c, m, w, trials=100, seed=0))
    with pytest.raises(AssertionError, match="grid you swept"):  # the formula and a typed goodput, no sweep
        check(decode_answers({"intervals": [], "overheads": [], "best_interval_s": tau, "best_goodput": typed}))
    with pytest.raises(AssertionError, match="overhead at"):  # a grid with made-up losses around the formula's
        check(decode_answers({"intervals": grid, "overheads": [abs(t - tau) / tau for t in grid],
                              "best_interval_s": grid[i], "best_goodput": 1 / (1 + lost[i])}))


@pytest.mark.parametrize("stem", ["3c-bubbles-and-paid-capacity", "3d-price-a-published-run", "3e-shard-the-state",
                                  "3f-choose-a-layout"])
def test_the_summaries_of_chapter_3_carry_computed_numbers(stem):
    """3c, 3d, 3e and 3f's instructor summaries were plain Markdown: no number the exercise computed."""
    nb = nbformat.read(EXERCISES / f"{stem}.ipynb", as_version=4)
    summary = [c for c in nb.cells if handout.INSTRUCTOR_ONLY in c.metadata.get("tags", [])
               and "What this exercise showed" in c.source]
    assert len(summary) == 1 and summary[0].cell_type == "code" and "say(f" in summary[0].source
    assert len(re.findall(r"\{[a-z_][^{}]*:[^{}]*\}", summary[0].source)) >= 3, "formatted numbers in the prose"


def test_the_summaries_are_folded_in_the_book():
    """An instructor's reading: the summaries ("What this exercise showed") printed their answers open in the book,
    where the solutions are folded; their output folds too (myst-nb's hide-output), and their code stays out."""
    for path in EXERCISE_PATHS:
        nb = nbformat.read(path, as_version=4)
        for c in nb.cells:
            tags = c.metadata.get("tags", [])
            if handout.INSTRUCTOR_ONLY in tags:
                assert {"remove-input", "hide-output"} <= set(tags), (path.name, tags)


def test_3d_says_whether_the_implied_utilisation_is_below_the_course_s():
    text = (EXERCISES / "3d-price-a-published-run.md").read_text()
    summary = text[text.index("# @title What this exercise showed"):]
    assert 'ex3d_side = "below" if ex3d_implied < hardware.UTILISATION else "above"' in summary


def test_3b_summary_reports_both_predictions_errors_not_which_is_closer():
    """3b's summary called a 52.2 ms prediction of a 28.8 ms step "closer": a miss must read as a miss."""
    text = (EXERCISES / "3b-predict-the-two-process-step.md").read_text()
    summary = text[text.index("# @title What this exercise showed"):]
    assert "closer to the prediction" not in summary
    assert "{ex3b_err_own:+.0f} %" in summary and "{ex3b_err_shared:+.0f} %" in summary
    assert "ex3b_err_own = 100 * (ex3b_own / ex3b_ddp4 - 1)" in summary


def test_1c_counts_against_page_1_7s_reserve():
    """Review r19: 1c counted all 80 GB as free while page 1.7 keeps planner.RESERVE back, so a student
    following 1.7 got micro-batch 4 where the check wanted 5. Every fit in 1c is now against usable_bytes,
    the device less the same constant, in solutions and hidden checks alike."""
    import math
    from lessonlib.calc import memory, planner
    text = (EXERCISES / "1c-will-it-fit.md").read_text()
    assert "usable_bytes = device_bytes - math.ceil(planner.RESERVE * device_bytes)" in text
    assert "idealised" not in text and "<= device_bytes" not in text and "> device_bytes" not in text
    given = _given_names(nbformat.read(EXERCISES / "1c-will-it-fit.ipynb", as_version=4))
    usable = given["device_bytes"] - math.ceil(planner.RESERVE * given["device_bytes"])
    state = memory.training_state_bytes(given["n_params"]).total
    per_seq = memory.activation_bytes(given["seq_len"], 1, given["hidden"], given["heads"], given["layers"],
                                      attention="stored")
    # the planner of page 1.7 gives the same largest micro-batch as the exercise's count
    p = planner.plan(given["n_params"], batch_per_device=1, seq_len=given["seq_len"], layers=given["layers"],
                     hidden=given["hidden"], heads=given["heads"], device_bytes=int(given["device_bytes"]),
                     attention="stored", dropout=True)  # 1c counts dropout's masks, as the paper does
    assert p.max_batch_that_fits == (usable - state) // per_seq


def test_1c_summary_states_the_selective_overhead_on_chapter_2s_basis():
    """1c's summary gave selective recomputation's extra compute on 6ND alone (5.2 %) where chapter 2's page
    gives it on the model FLOPs, attention's products included; both now count attention causal (lessonlib.calc.mfu)."""
    text = (EXERCISES / "1c-will-it-fit.md").read_text()
    summary = text[text.index("# @title What this exercise showed"):]
    assert "{ex1c_selective_all:.1%} more compute on the model FLOPs, causal attention included" in summary
    assert "ex1c_selective_all = _ex1c_flops.recomputed / _ex1c_flops.model" in summary
    page = next((ROOT / "chapters" / "02-two-checkpoints").glob("03-*.md")).read_text()
    # the basis the summary follows: the course's one count, lessonlib.calc.mfu (causal attention)
    assert "extra = {rc: 100 * added[rc] / big_flops[\"none\"].model" in page
    assert "model_hardware_flops(n7, tokens, L7, S7, H7, recompute=rc)" in page


def test_1b_summary_explains_round_half_to_even():
    """1b's two bf16 answers (the whole gap for 1.0, half of it for w_small) looked inconsistent, unexplained."""
    text = (EXERCISES / "1b-count-the-training-state.md").read_text()
    summary = text[text.index("# @title What this exercise showed"):]
    assert "rounds half to even" in summary and "{ex1b_ties}" in summary


def test_every_exercise_says_to_compute_from_the_variables():
    """An instructor's reading: a rounded value typed in from a print failed a tight tolerance, and no
    exercise said so. Every exercise states it once, beside its objective."""
    for path in EXERCISE_PATHS:
        text = " ".join(path.with_suffix(".md").read_text().split())
        assert "a rounded value typed in fails the check unless the question states a tolerance" in text, path.name


def test_2b_q5_accepts_the_early_stop_length_and_its_worked_examples_hold(check_2b_q5):
    """Question 4 shows PyTorch's default stops early (20 days x (1 + 0.9 x 5/27) = 23.3); a reply using it is right. The
    instructors' page's worked examples of a passing and a flagged sentence must be what the check does (the
    screen's mechanics moved there from the student's question, which keeps the key points and the form)."""
    _run(check_2b_q5, GOOD_ANSWERS_WITHOUT_DAYS[0] + " With PyTorch's early stop it runs for about 23 days.")
    question = " ".join((EXERCISES / "2b-should-they-checkpoint.md").read_text().split())
    question = question[question.index("## Question 5"):question.index("# Check 2b-q5")]
    assert "is read as" not in question and "price the time in FLOPs phase by phase, as in question 3" in question
    # review r19: Q5 priced the whole step by the FLOP ratio after Q3 taught that the optimizer is not rerun
    assert "and the optimizer is not rerun" in question
    assert '_SHARE = (phases["forward"] + phases["backward"])' in (EXERCISES / "2b-should-they-checkpoint.md").read_text()
    # one rule for half points, on this page and the grading page
    assert "three 1-point items, each of which your instructor may give in halves" in question
    grading = " ".join((EXERCISES / "grading.md").read_text().split())
    assert "three 1-point items, each of which you may give 0.5" in grading and "grade in halves" not in grading
    # the verdict weighs the memory saved against the time paid, and the deadline lies between the two prices
    assert "memory saved against the time paid" in question and "loses this point" not in question
    assert "deadline_days = 20, 25" in question
    text = " ".join((EXERCISES / "grading.md").read_text().split())
    read, hedged, wrong = re.findall(r'"([^"]+\.)" is (?:read as|flagged)', text)
    _run(check_2b_q5, GOOD_ANSWERS_WITHOUT_DAYS[0] + " " + read + DAYS)
    for bad, why in ((hedged, "negated or hedged"), (wrong, "misconception")):
        with pytest.raises(Flag, match=why):
            _run(check_2b_q5, GOOD_ANSWERS_WITHOUT_DAYS[0].replace(
                "The price is extra compute, because the dropped activations are recomputed in backward, so each "
                "step takes longer.", "") + " " + bad + DAYS)


def test_3f_q2_accepts_a_layout_within_2_percent_of_the_fastest():
    """The runner-up is a tie by the page's own words (within the exercise's 2 % tie): the check takes it, with its own step
    time, and still rejects a layout clearly slower (degrees no layout within 2 % has); can_gain's own check rejects a wrong one."""
    import math
    from lessonlib.calc.layout_search import search_layouts
    from lessonlib.grading.graders import Answers

    checks = reference.load(EXERCISES / "3f-choose-a-layout.ipynb", questions=["3f-q2", "3f-q2b"])
    check, check_gain = checks["3f-q2"], checks["3f-q2b"]
    src = (EXERCISES / "3f-choose-a-layout.md").read_text()
    given = src[src.index("from lessonlib.calc.planner import PRESETS"):]
    ns = {}
    exec(given[:given.index("```")], ns)
    model, cluster = ns["model"], ns["cluster"]
    ranked = search_layouts(model, cluster, top=50, max_virtual=8, zero_stages=(1,))
    gain = [p for p in (2, 4, 8, 16) if 2 ** int(math.log2(math.ceil(model.layers / p))) > 8]

    def answers(c):
        return Answers(best=(c.layout.tensor, c.layout.context, c.layout.pipeline, c.layout.data),
                       best_step_s=c.step_s)

    degrees = lambda c: (c.layout.tensor, c.layout.context, c.layout.pipeline, c.layout.data)  # noqa: E731
    tie = next(c for c in ranked[1:] if degrees(c) != degrees(ranked[0]))
    assert tie.step_s <= 1.02 * ranked[0].step_s, "the page's runner-up is a tie"
    check(answers(ranked[0]))
    check(answers(tie))
    ties = {degrees(c) for c in ranked if c.step_s <= 1.02 * ranked[0].step_s}  # every set of degrees accepted
    assert {degrees(ranked[0]), degrees(tie)} <= ties
    slow = next(c for c in ranked if c.step_s > 1.02 * ranked[0].step_s and degrees(c) not in ties)
    with pytest.raises(AssertionError, match="within 2 %"):
        check(answers(slow))
    assert gain and 8 not in gain  # a stage of ceil(L / 8) layers already takes its most chunks under the limit
    check_gain(Answers(can_gain=list(gain)))  # can_gain is its own check: a wrong one costs only its point
    with pytest.raises(AssertionError, match="can_gain"):
        check_gain(Answers(can_gain=[2, 4, 8, 16]))


def test_3e_q2_states_the_even_split_and_3f_words_save_matmuls_as_pages_2_3_and_3_11():
    """Review r19: 3e Q2's formula assumed an even split over eight processes without saying so (Q4 teaches
    padding); 3f said save_matmuls keeps "only the weight products' outputs" where 2.3 and 3.11 keep the input too."""
    e = " ".join((EXERCISES / "3e-shard-the-state.md").read_text().split())
    q2 = e[e.index("## Question 2"):e.index("# Check 3e-q2")]
    assert "Assume every tensor splits evenly over the eight processes, with no padding" in q2
    f = " ".join((EXERCISES / "3f-choose-a-layout.md").read_text().split())
    assert "only the weight products' outputs" not in f and "the layer's input and its weight products' outputs kept" in f
    for page, words in (("02-two-checkpoints/03-selective-recomputation.md", "the layer's input and the weight products' outputs"),
                        ("03-distributed-speedup/11-choose-a-layout.md", "layer's input and its weight products' outputs")):
        assert words in " ".join((ROOT / "chapters" / page).read_text().split())


def test_3b_grades_a_reasoning_choice_not_only_sums():
    """Review r19: about 9 of 3b's 13 points were sums and ratios of printed medians, its reasoning ungraded. Q2's
    sum dropped to 1 point and Q4's "what does such a step pay that no sum prices?" is a graded choice; the
    total stays 13, as the overview table says."""
    check = reference.load(EXERCISES / "3b-predict-the-two-process-step.ipynb", questions=["3b-q4d"], given=False)["3b-q4d"]
    check({"unpriced_4": "contention"})
    for wrong in ("latency", "bytes", "update"):
        with pytest.raises(AssertionError):
            check({"unpriced_4": wrong})
    nb = nbformat.read(EXERCISES / "3b-predict-the-two-process-step.ipynb", as_version=4)
    points = {grade_id: pts for grade_id, pts, _ in handout.check_cells(nb)}
    assert points["3b-q2"] == 1 and points["3b-q4d"] == 1 and sum(points.values()) == 13
    assert "| 3 | 7 | 13 (13) | 75 min |" in (EXERCISES / "index.md").read_text()


def test_3f_q3b_grades_a_prediction_not_the_search_output():
    """Review r19: 3f's ZeRO-2 part was read straight off search_layouts; it is now the saving predicted in bytes
    and whether the priced layout then fits, the search left as the student's own check."""
    check = reference.load(EXERCISES / "3f-choose-a-layout.ipynb", questions=["3f-q3b"])["3f-q3b"]
    import math
    from lessonlib.calc.planner import PRESETS
    saved = 2 * math.ceil(PRESETS["70B"]["n_params"] / 8) * (1 - 1 / 32)
    check({"zero2_saved_bytes": saved, "zero2_fits": True})
    for wrong in ({"zero2_saved_bytes": saved, "zero2_fits": False}, {"zero2_saved_bytes": 2 * saved, "zero2_fits": True}):
        with pytest.raises(AssertionError):
            check(wrong)
    text = (EXERCISES / "3f-choose-a-layout.md").read_text()
    assert "pipeline_with_zero2" not in text and "zero2_faster" not in text and "zero2_saved_bytes=zero2_saved_bytes" in text


def test_3f_q2_grades_the_decision_about_the_layout_that_moved_up():
    """Review r19: 2 of Q2's points were the search's output; one moved to the discussion's decision (what the
    model leaves out of a many-chunk layout's step time, as the summary says: it prices only the send)."""
    check = reference.load(EXERCISES / "3f-choose-a-layout.ipynb", questions=["3f-q2c"], given=False)["3f-q2c"]
    check({"left_out": "kernels"})
    for wrong in ("bubble", "sends"):
        with pytest.raises(AssertionError):
            check({"left_out": wrong})
    nb = nbformat.read(EXERCISES / "3f-choose-a-layout.ipynb", as_version=4)
    points = {grade_id: pts for grade_id, pts, _ in handout.check_cells(nb)}
    assert points["3f-q2"] == 1 and points["3f-q2c"] == 1 and sum(points.values()) == 11
    text = (EXERCISES / "3f-choose-a-layout.md").read_text()
    assert "of which the model prices only the send" in text
    assert "| 3 | 7 | 11 (11) | 45 min |" in (EXERCISES / "index.md").read_text()
    # review r20: page 3.11 once called the sends "a fixed cost the model does not price" while its table priced
    # them, so "sends" was a careful answer. Review r22: saying in the question that the model prices them let
    # `left_out` be found by elimination; the question now sends the student to the layout's step time by part,
    # where the sends are priced (alpha and bytes, layout_cost's pipeline_comm_s), the per-call kernel costs not
    q2 = " ".join(text[text.index("## Question 2"):text.index("# Check 3f-q2 ")].split())
    assert "prices its sends" not in q2 and "`pipeline_comm_s`" not in q2
    assert "grows with the number of chunks in a real run but has no part in the model's step time" in q2
    assert "Read that layout's step time by part" in q2
    from lessonlib.calc.layout import Layout, layout_cost
    from lessonlib.calc.layout_search import search_layouts  # noqa: F401  (the question's search)
    src = text[text.index("from lessonlib.calc.planner import PRESETS"):]
    ns = {}
    exec(src[:src.index("```")], ns)
    piped = layout_cost(ns["model"], ns["cluster"], Layout(tensor=8, pipeline=4, data=16, zero=1, virtual=4))
    assert piped.pipeline_comm_s > 0  # the sends are in the step time


def test_3c_names_no_chunk_count_for_3f_s_search():
    """Review r20: 3c's summary said 3f's search picks "v 2" where it picks v 4; it now names no count."""
    text = (EXERCISES / "3c-bubbles-and-paid-capacity.md").read_text()
    assert '"v 2"' not in text and "exercise 3f's layout search picks" in text


def test_3b_q3_states_its_baseline_and_a_split_above_one():
    """Review r20: compute_split came out 1.07, outside the 0.5-1.0 scale the question gave, and the run's
    `single` (56.5 ms) differed from question 5's `alone` (27.6 ms) with no word on which one Q3 uses."""
    text = " ".join((EXERCISES / "3b-predict-the-two-process-step.md").read_text().split())
    q3 = text[text.index("## Question 3"):text.index("# Check 3b-q3 ")]
    assert "The baseline is this run's `single`" in q3 and "It is not question 5's `alone`" in q3 and "above 1.0" in q3
    assert 'if ex3b_split > 1 else' in text
    # review r20 (again): the page says how each is timed, and the summary prints both, each named with its questions
    assert "timed inside the two-process run" in q3 and "the same step timed in this notebook" in q3
    q5 = text[text.index("## Question 5"):text.index("# Check 3b-q5 ")]
    assert "(`alone`, not the run's `single`: see question 3)" in q5
    assert "inside the two-process run (`single`, questions 2 to 4)" in text and "(`alone`, question 5)" in text


def test_r20_instructor_findings_on_1b_2b_3a_and_the_overview():
    """Review r20 (instructor): 1b Q3's hint gave the last-bit rule away; 2b Q5 priced time in FLOPs while the
    summary's own timing can put early stop past the deadline; 3a Q5's wording hid its definition; the overview's
    list ran to a paragraph per exercise and did not mark 3b as the long one."""
    b1 = " ".join((EXERCISES / "1b-count-the-training-state.md").read_text().split())
    q3 = b1[b1.index("## Question 3"):b1.index("# Check 1b-q3 ")]
    assert "Mind the ties" in q3 and "half to even" in q3
    assert "last bit" not in q3 and "needs the whole gap" not in q3
    # review r21 (instructor): the gap after w, and what the tie means for u, were worked for the student
    assert "largest power of two" not in q3 and "Work out what that means" not in q3
    b2 = " ".join((EXERCISES / "2b-should-they-checkpoint.md").read_text().split())
    q5 = b2[b2.index("## Question 5"):b2.index("# Check 2b-q5")]
    assert "FLOPs are not seconds (page 2.2)" in q5 and "whether that leaves room before the deadline" in q5
    assert "priced by a measured slowdown" in " ".join((EXERCISES / "grading.md").read_text().split())
    assert "A reply that also prices by a measured slowdown" in b2  # the rubric beside the check
    assert "_days_timed = days_at_todays_speed * (1 + _share5 * (_t - 1))" in b2  # the summary prices both ways
    a3 = " ".join((EXERCISES / "3a-amdahl-for-the-retailer.md").read_text().split())
    q5a = a3[a3.index("## Question 5"):a3.index("# Check 3a-q5")]
    assert "*scaled speedup*" in q5a and "serial share that matters" not in q5a
    index = (EXERCISES / "index.md").read_text()
    lines = [l for l in index.splitlines() if re.match(r"- \*\*\d[a-f]", l)]
    assert len(lines) == len(EXERCISE_PATHS) and all(len(l) < 300 for l in lines), [len(l) for l in lines]
    assert any(l.startswith("- **3b** (the long one") for l in lines)


def test_r21_hidden_hints_nudge_without_the_formula():
    """Review r21 (instructor): a failed check's hint printed the formula itself ("(p - 1) / (m + p - 1)",
    "FLOPs / (GPU-hours x 3600 x peak)", "count_flops(frozen, x, y, loss_fn).backward"), so a wrong answer
    got the key back. A hint in a hidden check names a page, a quantity to reconsider or a unit: no
    arithmetic, no call."""
    arithmetic = re.compile(r"[×=]|\bx\b|\s[/*+]\s|\s-\s\d|\w\(|\)\s*/|\bsqrt\b|\d\s*/\s*\w")
    bad = []
    for path in EXERCISE_PATHS:
        text = path.with_suffix(".md").read_text()
        for hidden in re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", text, re.S):
            for hint in re.findall(r'hint=f?"((?:[^"\\]|"\s*\n\s*f?")*)"', hidden):
                if arithmetic.search(hint):
                    bad.append(f"{path.stem}: {hint}")
    assert not bad, "\n".join(bad)
    # the grader's own messages after a check fails say no formula either
    assert "summed over every Linear layer" not in (EXERCISES / "1a-price-the-training-step.md").read_text()
    assert "(p - 1) / (m + p - 1)" not in (EXERCISES / "3c-bubbles-and-paid-capacity.md").read_text().split(
        "### BEGIN HIDDEN TESTS", 1)[1]


def test_r22_hidden_feedback_nudges_without_the_decision_the_call_or_the_value():
    """Review r22 (instructor): 1c's hint sent students to page 1.7's count (no dropout) for a count with dropout;
    3e's Graded line named the link that paces a step, and its exact `formula` check needed an even parameter
    count; 2b Q1's hint decided the two-way choice; 2c's message named the call to add; 2a's printed the peak."""
    def hidden(stem, grade_id):
        text = (EXERCISES / f"{stem}.md").read_text()
        cell = text[text.index(f"# Check {grade_id} "):]
        return cell[cell.index("### BEGIN HIDDEN TESTS"):cell.index("### END HIDDEN TESTS")]

    c1 = hidden("1c-will-it-fit", "1c-q1b")
    assert "Page 1.7" not in c1 and "Page 1.3's section 'The formula'" in c1
    assert "## The formula" in (ROOT / "chapters/01-forward-vs-training/03-activations.md").read_text()
    e3 = " ".join((EXERCISES / "3e-shard-the-state.md").read_text().split())
    assert "one port's pace does not" not in e3[e3.index("## Question 3"):e3.index("# Check 3e-q3 ")]
    assert "abs_tol=0.5" in hidden("3e-shard-the-state", "3e-q2b")  # floor or ceiling of 12 n / 8 passes
    from lessonlib.measure.distributed.fsdp import MODEL
    from lessonlib.measure.models import TinyGPT
    n = sum(p.numel() for p in TinyGPT(**MODEL).parameters())
    check = reference.load(EXERCISES / "3e-shard-the-state.ipynb", questions=["3e-q2b"], given=False)["3e-q2b"]
    check({"formula": 12 * n // 8})
    with pytest.raises(AssertionError, match="formula"):
        check({"formula": 16 * n // 8})
    b1 = hidden("2b-should-they-checkpoint", "2b-q1")
    assert "does not change what the step keeps in memory" not in b1 and "Pages 2.1 and 2.4" in b1
    c2 = hidden("2c-how-often-to-save", "2c-q1")
    assert "O_DIRECTORY" not in c2 and "os.open" not in c2 and "what makes the rename itself durable?" in c2
    a2 = hidden("2a-place-the-checkpoints", "2a-q2")
    assert "MiB" not in a2 and "the peak is over the budget" in a2
