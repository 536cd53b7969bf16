"""One Python object, one HTML rendering that works in every place the course runs.

An :class:`Interactive` object (a quiz, a calculator) displays as a
self-contained HTML + inline-JS page fragment (``text/html``), with no external
script and deterministic element ids. The same fragment works

* in the built book (myst-nb copies it into the page);
* in JupyterLab 4 and Notebook 7, which run the inline script of a trusted
  output, and show it again, still working, when the notebook is reopened
  without a kernel. An untrusted notebook (one executed elsewhere: downloaded
  from Colab, shared by a classmate) is shown without its outputs' scripts and
  with their ``hidden`` attributes stripped, so nothing secret may sit in the
  HTML, hidden or not: a quiz carries its answers encoded and shows a "run this
  cell" line there (see :mod:`lessonlib.book.quiz`);
* in Colab, which runs each output's scripts in its own frame.

Why not a live ipywidget by default: a saved ipywidget output carries only a
model id. Reopened without that model (a new kernel, or none), JupyterLab's
widget renderer, which outranks ``text/html`` for trusted outputs, shows
"Error displaying widget: model not found" instead of any other rendering in
the bundle (``@jupyter-widgets/jupyterlab-manager``, ``WidgetRenderer``).
:meth:`Interactive.widget` still builds the live ipywidgets version
(ipywidgets 7.7 or 8) for ``display(quiz.widget())``.

The static version never re-implements the Python logic in JavaScript: every
answer it can show is computed in Python when the cell runs and embedded as
data, and the script only looks answers up.

:class:`Explorer` applies this to calculators: a function of a few discrete
inputs is evaluated on the whole grid of inputs when the cell runs.
"""
from __future__ import annotations

import hashlib
import html
import itertools
import json
from importlib import resources
from typing import Any, Callable, Mapping, Sequence

from ..checks import count, function, mapping, sequence, text

#: The most input combinations an Explorer precomputes for the static page.
MAX_COMBINATIONS = 2000



def static_text(name: str) -> str:
    """The text of ``lessonlib/book/static/<name>`` (CSS and JS ship as package files)."""
    text("name", name)
    folder = resources.files("lessonlib.book").joinpath("static")
    if "/" in name or "\\" in name or not folder.joinpath(name).is_file():
        raise ValueError(f"name must be one of the files in lessonlib/book/static, got {name!r:.80}")
    return resources.files("lessonlib.book").joinpath("static", name).read_text(encoding="utf-8")


def script_text(name: str) -> str:
    """The script ``lessonlib/book/static/<name>`` without its ``//`` comment lines (they stay in the file)."""
    return "".join(line for line in static_text(name).splitlines(keepends=True) if not line.startswith("//"))


_STYLE = "<style>\n" + static_text("widgets.css") + "</style>\n"


def stable_id(*parts: Any) -> str:
    """A deterministic HTML element id built from the object's content."""
    digest = hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return "wtc-" + digest[:12]


def script_json(data: Any) -> str:
    """JSON that is safe to embed inside a ``<script>`` element.

    numpy numbers are written as plain numbers; NaN and infinity, which JSON
    does not have, and objects JSON cannot hold are a ``ValueError``/``TypeError`` naming ``data``.
    """
    def plain(obj):
        if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "shape", None) == ():
            return obj.item()  # a numpy scalar
        raise TypeError(f"data holds a {type(obj).__name__}, which JSON cannot store")

    try:
        return json.dumps(data, default=plain, allow_nan=False).replace("</", "<\\/")
    except ValueError:
        raise ValueError("data holds NaN or infinity, which JSON cannot store") from None
    except RecursionError:
        raise ValueError("data refers to itself, which JSON cannot store") from None


#: The Explorer's script (``static/explorer.js``, then ``static/keys.js``), embedded in each
#: output like the quiz's: the fragment stays self-contained for the book, JupyterLab, Colab
#: and a notebook reopened without a kernel.
_EXPLORER_SCRIPT = "<script>" + script_text("explorer.js") + script_text("keys.js") + "</script>"


class Interactive:
    """Base class: subclasses give :meth:`widget` (live) and :meth:`static_html`."""

    def widget(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def static_html(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _repr_mimebundle_(self, include=None, exclude=None):
        # text/html only (see the module docstring): it works live, in the
        # book, and in a reopened notebook; text/plain is for terminals.
        return {"text/html": _STYLE + self.static_html(), "text/plain": repr(self)}


class Explorer(Interactive):
    """A calculator over a small grid of inputs, live and static.

    Parameters
    ----------
    fn:
        Called as ``fn(**inputs)``; returns an HTML string (plain text is fine).
    controls:
        Maps each keyword argument of ``fn`` to the list of values a reader can
        choose. Numbers get a slider, anything else a drop-down.
    title, description:
        Shown above the controls.
    labels:
        Optional display names for the controls (defaults to the keyword).
    max_combinations:
        The static page precomputes every combination; more than this raises
        ``ValueError`` so a page cannot silently grow to megabytes.
    """

    def __init__(
        self,
        fn: Callable[..., str],
        controls: Mapping[str, Sequence[Any]],
        title: str = "",
        description: str = "",
        labels: Mapping[str, str] | None = None,
        initial: Mapping[str, Any] | None = None,
        max_combinations: int = MAX_COMBINATIONS,
    ):
        function("fn", fn)
        mapping("controls", controls)
        text("title", title, allow_empty=True)
        text("description", description, allow_empty=True)
        if labels is not None:
            mapping("labels", labels, allow_empty=True)
        if initial is not None:
            mapping("initial", initial, allow_empty=True)
        max_combinations = count("max_combinations", max_combinations)
        self.fn = fn
        self.controls = {}
        for name, values in controls.items():
            text("controls' names", name)
            values = sequence(f"controls[{name!r}]", values, allow_empty=True)
            if not values:
                raise ValueError(f"controls[{name!r}] has no values to choose from")
            if len(set(map(repr, values))) != len(values):
                raise ValueError(f"controls[{name!r}] lists a value twice")
            self.controls[name] = values
        n = 1
        for values in self.controls.values():
            n *= len(values)
        if n > max_combinations:
            raise ValueError(
                f"controls give {n} combinations, more than max_combinations={max_combinations}; "
                "offer fewer values per control"
            )
        self.title = title
        self.description = description
        self.labels = {k: (labels or {}).get(k, k) for k in self.controls}
        self.initial = {}
        for name, values in self.controls.items():
            value = (initial or {}).get(name, values[0])
            if value not in values:
                raise ValueError(f"initial[{name!r}]={value!r} is not one of the offered values")
            self.initial[name] = value

    def __repr__(self) -> str:
        return f"Explorer({self.title or self.fn.__name__!s}, controls={list(self.controls)})"

    def __call__(self, **inputs) -> str:
        """The output for one combination of inputs (the same text both versions show)."""
        return str(self.fn(**inputs))

    @staticmethod
    def _is_number(values: Sequence[Any]) -> bool:
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)

    def _fmt(self, v: Any) -> str:
        """A value as a reader reads it: integers with thousands separators, floats to four significant
        figures (a fitted share is 9.897e-06, not 9.897494944029668e-06), whole floats as integers."""
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, int) or (v.is_integer() and abs(v) < 1e15):
            return f"{int(v):,}"
        return f"{v:.4g}"

    # ----- live -----------------------------------------------------------
    def widget(self):
        import ipywidgets as w

        inputs = {}
        for name, values in self.controls.items():
            options = [(self._fmt(v), v) for v in values]
            cls = w.SelectionSlider if self._is_number(values) and len(values) > 2 else w.Dropdown
            inputs[name] = cls(
                options=options,
                value=self.initial[name],
                description=self.labels[name],
                style={"description_width": "initial"},
                layout=w.Layout(width="28em"),
            )
        out = w.HTML(self(**self.initial))

        def update(_change=None):
            out.value = self(**{k: c.value for k, c in inputs.items()})

        for c in inputs.values():
            c.observe(update, names="value")
        head = []
        if self.title:
            head.append(w.HTML(f"<b>{self.title}</b>"))
        if self.description:
            head.append(w.HTML(self.description))
        box = w.VBox(head + list(inputs.values()) + [out])
        box.inputs, box.output = inputs, out  # handles for tests and readers
        return box

    # ----- static ---------------------------------------------------------
    def table(self) -> tuple[list[str], list[int]]:
        """Every output, de-duplicated, and the index of each combination's output.

        Combinations are enumerated in row-major order of ``controls``.
        """
        outputs: list[str] = []
        seen: dict[str, int] = {}
        index: list[int] = []
        names = list(self.controls)
        for combo in itertools.product(*self.controls.values()):
            text = self(**dict(zip(names, combo)))
            if text not in seen:
                seen[text] = len(outputs)
                outputs.append(text)
            index.append(seen[text])
        return outputs, index

    def static_html(self) -> str:
        names = list(self.controls)
        uid = stable_id("explorer", self.title, {k: list(map(repr, v)) for k, v in self.controls.items()})
        outputs, index = self.table()
        sizes = [len(self.controls[k]) for k in names]
        rows = []
        for i, name in enumerate(names):
            values = self.controls[name]
            start = values.index(self.initial[name])
            cid = f"{uid}-c{i}"
            if self._is_number(values) and len(values) > 2:
                ctl = (
                    f'<input type="range" id="{cid}" min="0" max="{len(values) - 1}" step="1" '
                    f'value="{start}" aria-label="{html.escape(self.labels[name])}">'
                    f'<output id="{cid}-v">{html.escape(self._fmt(values[start]))}</output>'
                )
            else:
                opts = "".join(
                    f'<option value="{j}"{" selected" if j == start else ""}>{html.escape(self._fmt(v))}</option>'
                    for j, v in enumerate(values)
                )
                ctl = f'<select id="{cid}" aria-label="{html.escape(self.labels[name])}">{opts}</select>'
            rows.append(
                f'<div class="wtc-control"><span class="wtc-name">{html.escape(self.labels[name])}</span>{ctl}</div>'
            )
        start_idx = 0
        for i, name in enumerate(names):
            start_idx = start_idx * sizes[i] + self.controls[name].index(self.initial[name])
        data = {
            "sizes": sizes,
            "labels": [[self._fmt(v) for v in self.controls[k]] for k in names],
            "outputs": outputs,
            "index": index,
        }
        title = f'<div class="wtc-title">{self.title}</div>' if self.title else ""
        desc = f"<div>{self.description}</div>" if self.description else ""
        return f"""<div class="wtc-box wtc-explorer" id="{uid}">{title}{desc}{''.join(rows)}
<div class="wtc-output" id="{uid}-out" aria-live="polite">{outputs[index[start_idx]]}</div>
<script type="application/json" id="{uid}-data">{script_json(data)}</script>
{_EXPLORER_SCRIPT % {"uid": uid}}</div>"""
