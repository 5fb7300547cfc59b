"""Static HTML reports: one page per experiment (tables, figures, image grids) and an index page.

Pages use relative links only and inline CSS, no scripts, so the output folder opens from disk
(file://) or from any static host, and can be moved or archived as a whole.
"""
from __future__ import annotations

import html
import os
from urllib.parse import quote
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from harness.store.samples import write_atomic

PAGE = "index.html"
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 80rem; padding: 0 1rem; color: #222; }
table.results { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
table.results caption { font-weight: bold; text-align: left; padding-bottom: 0.4rem; }
table.results th, table.results td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.6rem; }
table.results td { text-align: right; white-space: nowrap; }
table.results td:first-child, table.results td:nth-child(2) { text-align: left; }
td.missing { color: #aaa; } td.paper { color: #555; } td.better { color: #176f2c; } td.worse { color: #a11; }
p.note { font-size: 0.85rem; color: #444; max-width: 60rem; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9rem; color: #333; }
code { background: #f4f4f4; padding: 0 0.2rem; }
dl.legend { font-size: 0.8rem; color: #444; max-width: 60rem; display: grid; grid-template-columns: max-content 1fr;
  gap: 0.15rem 0.8rem; margin: 0.5rem 0 1rem; } dl.legend dt { font-weight: bold; } dl.legend dd { margin: 0; }
th[title] { cursor: help; text-decoration: underline dotted; }
"""


@dataclass(slots=True)
class Section:
    """Part of a page: a heading, ready HTML (a table), figures (caption, PNG path) and downloads."""

    heading: str
    table_html: str = ""
    figures: list[tuple[str, Path]] = field(default_factory=list)
    downloads: list[Path] = field(default_factory=list)


def write_page(path: Path, title: str, sections: Sequence[Section], runs: Sequence[str] = ()) -> Path:
    """Write one experiment's page at `path`; every file link is made relative to its folder."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    for section in sections:
        body.append(f"<h2>{html.escape(section.heading)}</h2>")
        if section.table_html:
            body.append(section.table_html)
        if section.downloads:
            links = ", ".join(_link(path, p, p.name) for p in section.downloads)
            body.append(f'<p class="note">Download: {links}</p>')
        for caption, image in section.figures:
            body.append(_figure(path, caption, image))
    if runs:
        items = "".join(f"<li><code>{html.escape(run)}</code></li>" for run in runs)
        body.append(f"<h2>Runs</h2><ul>{items}</ul>")
    return _write(path, title, body)


def _figure(page: Path, caption: str, image: Path) -> str:
    """A <figure>: the image, its caption and links to its PDF and to its points in words (<stem>.txt,
    also the image's alt text) where they were written beside it."""
    pdf, words = image.with_suffix(".pdf"), image.with_suffix(".txt")
    links = [_link(page, pdf, "PDF")] if pdf.is_file() else []
    alt = caption
    if words.is_file():  # the figure in words: what its bars mean, then every point with its intervals
        links.append(_link(page, words, "points"))
        alt = "; ".join(line for line in words.read_text(encoding="utf-8").splitlines() if line)
    extra = f" ({', '.join(links)})" if links else ""
    return (f'<figure><img src="{html.escape(_relative(page, image))}" alt="{html.escape(alt.strip())}">'
            f"<figcaption>{html.escape(caption)}{extra}</figcaption></figure>")


def write_index(path: Path, pages: Sequence[tuple[str, Path]], tables: Sequence[Path] = ()) -> Path:
    """Write the index page linking every experiment page (title, path) and table file."""
    body = ["<h1>Regenerated paper tables and figures</h1>", "<h2>Experiments</h2><ul>"]
    body += [f"<li>{_link(path, page, title)}</li>" for title, page in pages]
    body.append("</ul>")
    if tables:
        body.append("<h2>Tables</h2><ul>")
        body += [f"<li>{_link(path, table, table.name)}</li>" for table in tables]
        body.append("</ul>")
    return _write(path, "Regenerated paper tables and figures", body)


def _write(path: Path, title: str, body: list[str]) -> Path:
    """A complete HTML5 document, written atomically."""
    document = "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                          f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
                          *body, "</body></html>", ""])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, document.encode("utf-8"))
    return path


def _relative(page: Path, target: Path) -> str:
    """`target` relative to the page's folder, as a URL path (forward slashes, percent-encoded)."""
    return quote(Path(os.path.relpath(target.resolve(), page.parent.resolve())).as_posix())


def _link(page: Path, target: Path, text: str) -> str:
    return f'<a href="{html.escape(_relative(page, target))}">{html.escape(text)}</a>'


__all__ = ["PAGE", "Section", "write_index", "write_page"]
