"""MkDocs hooks of the documentation site (named in mkdocs.yml under `hooks:`; not a page).

The raw results pages (docs/results/*.md, the files the benchmarks write) start with lines such as
`Machine: ...` and `Command: ...`. Read as they are, MkDocs would take those first lines for page
metadata and drop them. Here each results page gets, before it is parsed:
- front matter that leaves it out of the site search (the technique cards and the benchmarks page,
  which quote these results with context, are what a search should find);
- a title, when the file has none;
- a blank line after each leading `Key: value` line, so each shows as its own visible paragraph.
"""

from __future__ import annotations

import re

_LEADING_FIELD = re.compile(r"^[A-Z][A-Za-z ]{0,30}: \S")


def results_page_source(name: str, text: str) -> str:
    """The Markdown a raw results file is rendered from (pure: tested in tests/test_docs.py)."""
    lines = text.splitlines()
    body: list[str] = []
    i = 0
    while i < len(lines) and _LEADING_FIELD.match(lines[i]):
        body += [lines[i], ""]
        i += 1
    body += lines[i:]
    title = [] if lines and lines[0].startswith("# ") else [f"# Raw results: {name}", ""]
    return "---\nsearch:\n  exclude: true\n---\n\n" + "\n".join(title + body) + "\n"


def on_page_read_source(page, config):
    src = page.file.src_uri
    if not (src.startswith("results/") and src.endswith(".md")):
        return None
    with open(page.file.abs_src_path, encoding="utf-8") as f:
        text = f.read()
    return results_page_source(src.removeprefix("results/").removesuffix(".md"), text)
