"""lessonlib.book.say: a paragraph with computed numbers, as Markdown output."""
import pytest

from lessonlib.book import say
from lessonlib.book.prose import Prose


def test_say_displays_markdown(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    say("""
        It took {x} s.
        """.format(x=2.5))
    assert isinstance(shown[0], Prose)
    assert shown[0]._repr_markdown_() == "It took 2.5 s."


def test_say_rejects_non_text():
    with pytest.raises(TypeError, match="markdown"):
        say(2.5)
