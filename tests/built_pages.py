"""Checks of a built book's pages, shared by the tests (tests/test_book.py runs them on the build)."""
import re


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
