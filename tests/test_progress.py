from lessonlib import progress as p


def test_static_build_prints_one_summary_line(monkeypatch, capsys):
    monkeypatch.setenv("LESSONLIB_STATIC_BUILD", "1")
    assert list(p.progress(range(5), desc="sweep")) == [0, 1, 2, 3, 4]
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("sweep: 5 steps in ")


def test_live_progress_yields_every_item(monkeypatch):
    monkeypatch.delenv("LESSONLIB_STATIC_BUILD", raising=False)
    assert not p.static_build()
    assert list(p.progress(iter("abc"), desc="x", total=3)) == ["a", "b", "c"]
