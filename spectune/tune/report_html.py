"""The HTML shell every ``spectune report`` page shares: one self-contained file (styles inline, images as base64
PNG data URIs, no script, nothing loaded from the network) that opens with the answer.

Layout rules the browser test (tests/tune/test_report_browser.py) holds the page to: the answer's element has
``id="answer"`` and comes first, the sweep page's heatmap (``id="heatmap"``) follows it inside the first screen at
1280x800, images scale down to the viewport and wide tables scroll inside their own box, so nothing is wider than a
390 px phone screen.
"""

from __future__ import annotations

import base64
import html
import math
import os
from pathlib import Path
from typing import Sequence

import pandas as pd

STYLE = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1a202c;line-height:1.4;margin:0 auto;
  padding:10px 16px 24px;max-width:1200px}
h1{font-size:1.35em;margin:.1em 0}
h2{font-size:1.15em;margin:1.1em 0 .4em}
.meta{color:#4a5568;font-size:.88em;margin:.15em 0 .6em}
code{font-size:.92em;overflow-wrap:anywhere}
.answer{border-left:6px solid #2b6cb0;background:#ebf4ff;padding:6px 14px 8px;margin:0 0 10px}
.answer.pass{border-color:#2f855a;background:#f0fff4}
.answer.fail{border-color:#c53030;background:#fff5f5}
.answer.inconclusive{border-color:#b7791f;background:#fffff0}
.answer .lead{font-size:1.08em;margin:.2em 0 .3em}
.answer ul{margin:.2em 0;padding-left:1.2em}
.answer li{margin:.1em 0}
.verdict{font-weight:700}
.nw{white-space:nowrap}
figure{margin:0 0 12px}
figcaption{color:#4a5568;font-size:.85em}
img{display:block;max-width:100%;height:auto}
#heatmap img{max-height:430px;width:auto}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,460px),1fr));gap:14px}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:13px;margin:.2em 0 .6em}
td,th{border:1px solid #cbd5e0;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f7fafc}
td.text,th.text{text-align:left}
.fail-cell{color:#c53030;font-weight:700}
.pass-cell{color:#2f855a}
details summary{cursor:pointer;margin:.4em 0}
ul.files{padding-left:1.2em}
"""


def esc(x: object) -> str:
    """``x`` as HTML text (quotes escaped)."""
    return html.escape(str(x))


def num(x: object, spec: str = ".4g") -> str:
    """A number for a table cell; ``-`` for None and non-finite floats."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def nowrap_words(text: str) -> str:
    """``text`` as HTML whose lines break only between words (a flag such as ``--speculative-num-steps`` stays
    whole on a narrow screen)."""
    return " ".join(f'<span class="nw">{esc(w)}</span>' for w in text.split(" "))


def image(path: Path, alt: str, element_id: str | None = None, caption: str | None = None,
          caption_html: str | None = None) -> str:
    """A ``<figure>`` holding the PNG at ``path`` as a data URI, with ``caption`` (text) or ``caption_html`` under
    it (raises OSError when the PNG cannot be read)."""
    data = base64.b64encode(path.read_bytes()).decode()
    ident = f' id="{esc(element_id)}"' if element_id else ""
    cap = f"<figcaption>{caption_html or esc(caption)}</figcaption>" if caption or caption_html else ""
    return f'<figure{ident}><img alt="{esc(alt)}" src="data:image/png;base64,{data}">{cap}</figure>'


def table(header: Sequence[str], rows: Sequence[Sequence[str]], text_cols: Sequence[int] = (),
          cell_class: dict[tuple[int, int], str] | None = None) -> str:
    """An HTML table in a box that scrolls sideways on a narrow screen. Cells are escaped; ``text_cols`` (column
    indexes) are left-aligned (numbers are right-aligned); ``cell_class`` maps (row, column) to a CSS class."""
    def cls(i: int, j: int) -> str:
        names = (["text"] if j in text_cols else []) + ([cell_class[(i, j)]] if cell_class and (i, j) in cell_class
                                                         else [])
        return f' class="{" ".join(names)}"' if names else ""

    head = "".join(f"<th{cls(-1, j)}>{esc(h)}</th>" for j, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(i, j)}>{esc(v)}</td>" for j, v in enumerate(r)) + "</tr>"
                   for i, r in enumerate(rows))
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def frame_table(df: pd.DataFrame) -> str:
    """A pandas DataFrame as a scrolling HTML table (4 significant digits, ``-`` for NaN)."""
    return ('<div class="scroll">' + df.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="-", border=0)
            + "</div>")


def file_links(folder: Path | None, out: Path, names: Sequence[str]) -> str:
    """A list of links, relative to the page in ``out``, to the files of ``names`` that exist in ``folder`` (the
    raw results the page is drawn from); empty when none does."""
    if folder is None:
        return ""
    items = []
    for name in names:
        p = folder / name
        if p.is_file():
            href = Path(os.path.relpath(p, out)).as_posix()
            items.append(f'<li><a href="{esc(href)}">{esc(name)}</a></li>')
    return f'<h2>Files</h2><ul class="files">{"".join(items)}</ul>' if items else ""


def page(title: str, meta: str, answer: str, body: str) -> str:
    """The whole document: ``title`` as the page's heading, ``meta`` (HTML) under it, then ``answer`` (HTML, the
    element with ``id="answer"``) and ``body`` (HTML)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title><style>{STYLE}</style></head><body>
<h1>{esc(title)}</h1><p class="meta">{meta}</p>
{answer}
{body}
</body></html>
"""
