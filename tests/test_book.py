"""The book builds with warnings as errors, and every page it should have exists."""
import re

from conftest import ROOT


def test_book_builds_with_zero_warnings(built_book):
    log = (built_book.parents[1] / "build.log").read_text() if (built_book.parents[1] / "build.log").exists() else ""
    assert (built_book / "index.html").exists()
    assert not re.search(r"\bWARNING\b(?!.*Kernel is running over TCP)", log), log[-3000:]


def test_every_toc_entry_became_a_page(built_book):
    toc = (ROOT / "_toc.yml").read_text()
    for entry in re.findall(r"file:\s*(\S+)", toc):
        assert (built_book / f"{entry}.html").exists(), entry


def test_no_page_references_a_cdn(built_book):
    pages = sorted(built_book.rglob("*.html"))
    assert pages, f"no pages in {built_book}"
    for page in pages:
        text = page.read_text(errors="replace")
        for m in re.finditer(r"""<script[^>]+src=["'](https?:)?//""", text):
            raise AssertionError(f"{page.name} loads a remote script: {text[m.start():m.start()+160]}")


#: What a cell's stray last expression prints when it returns a matplotlib object instead of nothing.
MATPLOTLIB_REPR = re.compile(r"&lt;(matplotlib\.[\w.]+|Figure size [^&]*) at 0x[0-9a-f]+&gt;|&lt;Figure size [^&]*&gt;"
                             r"|\bText\(-?[\d.]+, -?[\d.]+, ('|&#39;|&#x27;).*?('|&#39;|&#x27;)\)|\[&lt;matplotlib\.")


def figure_faults(html: str) -> list[str]:
    """Stray matplotlib reprs, and any image shown twice, on one built page (``[]``: none)."""
    faults = [f"matplotlib repr: {m.group(0)[:80]}" for m in MATPLOTLIB_REPR.finditer(html)]
    srcs = re.findall(r"""<img[^>]+src=["'](data:image/[^"']+|[^"']*_images/[^"']+)["']""", html)
    seen = set()
    for src in srcs:
        if src in seen:
            faults.append(f"an image shown twice: {src[:60]}…")
        seen.add(src)
    return faults


def test_the_figure_check_finds_a_stray_repr_and_a_figure_shown_twice():
    img = '<img src="data:image/png;base64,AAAA" alt="x">'
    assert figure_faults(f"<p>{img}</p>") == []
    assert len(figure_faults(f"{img}<pre>&lt;matplotlib.legend.Legend at 0x7f3a2c&gt;</pre>")) == 1
    assert len(figure_faults("<pre>Text(0.5, 0, 'optimizer')</pre>")) == 1
    assert len(figure_faults("<pre>Text(0.5, 0, &#39;optimizer&#39;)</pre>")) == 1
    assert len(figure_faults(img + img)) == 1


def test_no_page_shows_a_matplotlib_repr_or_a_figure_twice(built_book):
    """Issue 23's rendering item: a figure appeared twice (drawn, then displayed again) and cells printed
    'Text(0.5, 0, ...)' or '<matplotlib.legend.Legend at 0x...>'."""
    pages = sorted((built_book / "chapters").rglob("*.html")) + sorted((built_book / "exercises").rglob("*.html"))
    assert pages, f"no pages in {built_book}"
    faults = {p.name: f for p in pages if (f := figure_faults(p.read_text(errors="replace")))}
    assert not faults, faults
