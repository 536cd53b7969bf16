from lessonlib import progress as p


def test_static_build_is_silent(monkeypatch, capsys):
    # "sweep: 5 steps in 0.0 s" is plumbing: the static page shows nothing for a loop.
    monkeypatch.setenv("LESSONLIB_STATIC_BUILD", "1")
    assert list(p.progress(range(5), desc="sweep")) == [0, 1, 2, 3, 4]
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_live_progress_yields_every_item(monkeypatch):
    monkeypatch.delenv("LESSONLIB_STATIC_BUILD", raising=False)
    assert not p.static_build()
    assert list(p.progress(iter("abc"), desc="x", total=3)) == ["a", "b", "c"]


def test_live_bar_is_text_not_a_widget(monkeypatch, capsys):
    # A widget bar leaves "model not found" in a notebook reopened without its kernel.
    monkeypatch.delenv("LESSONLIB_STATIC_BUILD", raising=False)
    b = p.bar(total=2, desc="workers")
    b.update(2)
    b.close()
    assert type(b).__module__.startswith("tqdm.std") or type(b).__module__ == "tqdm"
    assert "workers" in capsys.readouterr().out
