"""A Sphinx extension for the book: no launch button on the exercise pages.

sphinx-book-theme adds a "launch" group (Colab) to every notebook page and has
no per-page switch (``header_buttons/launch.py``). Its Colab button opens the
page's notebook from the repository, and the repository's exercise notebooks
are the instructor copies, solutions included (the public book's pages and
download buttons carry the student copies: scripts/student_pages.py), so a
Colab button there would open the solutions. This extension runs after the theme's ``html-page-context``
handler and removes the launch group from pages whose name starts with one of
``lessonlib_no_launch`` (default: ``exercises/``); the exercises' index page
says where student copies come from.
"""
from __future__ import annotations


def _check_app(app):
    if not callable(getattr(app, "add_config_value", None)) or not hasattr(app, "config"):
        raise TypeError(f"app must be the Sphinx application, got {type(app).__name__}")


def drop_launch_buttons(app, pagename, templatename, context, doctree):
    """Remove the launch buttons from the pages whose name starts with a prefix in ``lessonlib_no_launch``."""
    _check_app(app)
    if not isinstance(pagename, str):
        raise TypeError(f"pagename must be a page name (str), got {type(pagename).__name__}")
    if not isinstance(context, dict):
        raise TypeError(f"context must be the page's template context (dict), got {type(context).__name__}")
    prefixes = tuple(app.config.lessonlib_no_launch)
    if not pagename.startswith(prefixes) or "header_buttons" not in context:
        return
    context["header_buttons"] = [b for b in context["header_buttons"] if b.get("label") != "launch-buttons"]


def setup(app):
    """Register the extension with Sphinx (``app`` is the Sphinx application)."""
    _check_app(app)
    app.add_config_value("lessonlib_no_launch", ["exercises/"], "html")
    # sphinx-book-theme adds its launch buttons at priority 501; run after it.
    app.connect("html-page-context", drop_launch_buttons, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
