"""Every example in lessonlib's docstrings runs and prints what it says."""
import doctest
import importlib
import pkgutil

import pytest

import lessonlib


def _modules():
    names = ["lessonlib"]
    for info in pkgutil.walk_packages(lessonlib.__path__, prefix="lessonlib."):
        names.append(info.name)
    return sorted(names)


MODULES = _modules()


def test_modules_were_found():
    assert "lessonlib.calc.memory" in MODULES and "lessonlib.measure.timing" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
