"""Checks of a built book's pages, shared by the tests (tests/test_book.py runs them on the build)."""
import re


#: What a cell's stray last expression prints when it returns a matplotlib object instead of nothing.
MATPLOTLIB_REPR = re.compile(r"&lt;(matplotlib\.[\w.]+|Figure size [^&]*) at 0x[0-9a-f]+&gt;|&lt;Figure size [^&]*&gt;"
                             r"|\bText\(-?[\d.]+, -?[\d.]+, ('|&#39;|&#x27;).*?('|&#39;|&#x27;)\)|\[&lt;matplotlib\.")


#: A cell output that is only the repr of None (or of several: a tuple or list of them), as a cell prints when its
#: last line is a call that returns nothing (``shutil.rmtree(...)``, ``fig.savefig(...)``); myst-nb writes it in a
#: <pre>, after an empty <span> for its highlighter.
NONE_REPR = re.compile(r"<pre>(?:<span></span>)?\s*(?:None|[(\[]\s*None(?:\s*,\s*None)*\s*,?\s*[)\]])\s*</pre>")
#: A Python warning shown on a page (the cell's stderr, rendered by myst-nb): "SomeWarning: message".
WARNING_TEXT = re.compile(r"\b[A-Z]\w*Warning: [^<\n]{0,80}")


def figure_faults(html: str) -> list[str]:
    """Stray reprs (matplotlib objects, a lone None), a leaked Python warning, and any image shown twice, on one
    built page (``[]``: none)."""
    faults = [f"matplotlib repr: {m.group(0)[:80]}" for m in MATPLOTLIB_REPR.finditer(html)]
    faults += [f"a stray None output: {m.group(0)[:80]}" for m in NONE_REPR.finditer(html)]
    faults += [f"a warning shown on the page: {m.group(0)[:120]}" for m in WARNING_TEXT.finditer(html)
               if "stderr" in html[max(0, m.start() - 400):m.start()]]
    srcs = re.findall(r"""<img[^>]+src=["'](data:image/[^"']+|[^"']*_images/[^"']+)["']""", html)
    seen = set()
    for src in srcs:
        if src in seen:
            faults.append(f"an image shown twice: {src[:60]}…")
        seen.add(src)
    return faults


#: A control character in shown text (tab, form feed, backspace, bell, vertical tab): what a LaTeX command such as
#: ``\tfrac`` or ``\frac`` becomes in a Python string that is not raw (``"\t"`` is a tab, ``"\f"`` a form feed).
CONTROL_CHARACTER = re.compile("[\t\f\b\a\v]")


def control_character_faults(text: str) -> list[str]:
    """Each control character in ``text`` (a built page, or an executed notebook's output) with its neighbours
    (``[]``: none)."""
    return [f"{m.group(0)!r} in …{text[max(0, m.start() - 40):m.end() + 20]!r}…"
            for m in CONTROL_CHARACTER.finditer(text)]


#: Maths the build did not pair up: a ``$$`` display equation that did not start its own paragraph was read as
#: a ``$`` and inline maths, so every ``$…$`` after it swapped text and maths (3.7's ring fold did). Its traces: a
#: ``$`` right beside a rendered maths span, or a ``\(``/``\)``/``$$`` left in the prose outside maths and code.
MATH_SPAN = re.compile(r'<(span|div) class="math[^"]*">.*?</\1>', re.S)
CODE = re.compile(r"<(pre|code)\b.*?</\1>", re.S)


def math_faults(html: str) -> list[str]:
    """Signs of maths the build did not pair up on one built page (``[]``: none)."""
    faults = [f"a $ beside rendered maths: …{html[max(0, m.start() - 60):m.end() + 60]!r}…"
              for m in re.finditer(r'\$<span class="math|\\\)</span>\$', html)]
    prose = CODE.sub(" ", MATH_SPAN.sub(" ", html))
    faults += [f"a maths delimiter in the prose: …{prose[max(0, m.start() - 60):m.end() + 20]!r}…"
               for m in re.finditer(r"\\\(|\\\)|\$\$", prose)]
    return faults
