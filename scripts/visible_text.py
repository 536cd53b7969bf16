"""The text a reader sees on each page of a built book, to compare two builds.

    python scripts/visible_text.py _build/html OUT          # one OUT/<page>.txt per page
    python scripts/visible_text.py --numbers _build/html OUT  # keep the digits
    diff -r BEFORE OUT                                      # what a change did to the words

For every page of the book (the HTML files that have the theme's article) it
writes the article's text, one block (paragraph, heading, list item, table
cell, output line) a line, with runs of white space made one space. Script and
style elements are left out, and so is code a reader has to click to see
(``hide-input`` cells keep their input in a closed ``<details>``). By default
each run of digits becomes ``#``: the numbers are this machine's measurements
and change from build to build, while the words should not.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from bs4 import BeautifulSoup

BLOCKS = ("p", "li", "h1", "h2", "h3", "h4", "h5", "h6", "td", "th", "pre", "dt", "dd", "figcaption",
          "caption", "summary", "div", "tr", "blockquote", "table", "section", "details")


def page_text(html: str, numbers: bool = False) -> str:
    """The visible text of one built page (its article), one block a line."""
    soup = BeautifulSoup(html, "html.parser")
    article = soup.find("article") or soup.body
    if article is None:
        return ""
    for tag in article.find_all(["script", "style", "template", "noscript"]):
        tag.decompose()
    for details in article.find_all("details"):  # a closed hide-input: only its summary is in sight
        if "hide" in (details.get("class") or []):
            for child in list(details.children):
                if getattr(child, "name", None) != "summary":
                    child.extract()
    for tag in article.find_all(BLOCKS):
        tag.insert_before("\n")
        tag.insert_after("\n")
    for br in article.find_all("br"):
        br.replace_with("\n")
    lines = [re.sub(r"\s+", " ", line).strip() for line in article.get_text().split("\n")]
    text = "\n".join(line for line in lines if line)
    if not numbers:
        text = re.sub(r"\d+", "#", text)
    return text + "\n"


def main(argv: list[str]) -> int:
    numbers = "--numbers" in argv
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        print(__doc__)
        return 2
    html_dir, out = Path(args[0]), Path(args[1])
    n = 0
    for page in sorted(html_dir.rglob("*.html")):
        rel = page.relative_to(html_dir)
        if rel.parts[0].startswith("_") or rel.name in ("genindex.html", "search.html"):
            continue
        dest = (out / rel).with_suffix(".txt")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(page_text(page.read_text(errors="replace"), numbers))
        n += 1
    print(f"wrote the visible text of {n} pages to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
