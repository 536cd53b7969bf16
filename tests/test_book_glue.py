from lessonlib.book import Text, glue


def test_glue_returns_nothing_and_strings_show_without_quotes():
    assert glue("lesson_test_value", 2.5) is None  # a last-line glue adds no output
    assert repr(Text("2.5×")) == "2.5×"
