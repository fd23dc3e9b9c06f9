"""The report's document model: a list of blocks (headings, paragraphs, tables, images) rendered twice, as
Markdown and as self-contained HTML, from the same data. The report and the sections built in their own modules
(render/capacity.py) add blocks to one Report; the plots' figures are made and turned into an Image's PNG here."""
from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from typing import Any

@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    name: str          # file name under report/
    title: str
    png: bytes


@dataclass
class Report:
    title: str
    blocks: list[Any] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def add(self, *blocks: Any) -> None:
        self.blocks.extend(blocks)


def subplots(figsize: tuple[float, float] = (8, 4)) -> Any:
    """(figure, axes) of a new plot, drawn by matplotlib's Agg backend (no display)."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=figsize)


def fig_png(fig: Any) -> bytes:
    """The figure as PNG (100 dpi, tight), the figure closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return buf.getvalue()


def legend_outside(ax: Any, **kw: Any) -> None:
    """The legend to the right of the plot, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=7, **kw)


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(rep: Report, image_dir: str = "report") -> str:
    out = [f"# {rep.title}", ""]
    if rep.summary:
        out += ["## Summary", ""] + [f"- {s}" for s in rep.summary] + [""]
    for b in rep.blocks:
        if isinstance(b, Heading):
            out += [f"{'#' * b.level} {b.text}", ""]
        elif isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {i}" for i in b.items] + [""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            out.append("|" + "---|" * len(b.header))
            out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.title}]({image_dir}/{b.name})", ""]
    return "\n".join(out)


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1b1f23;line-height:1.45}table{border-collapse:collapse;margin:.5em 0 1.2em}
td,th{border:1px solid #d0d7de;padding:.3em .6em;text-align:left;font-size:.92em}th{background:#f6f8fa}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:.85em}img{max-width:100%;border:1px solid #eee}
h1{border-bottom:2px solid #d0d7de}.summary{background:#eef6ff;border-left:4px solid #0969da;padding:.6em 1em}"""


def to_html(rep: Report) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>{e(rep.title)}</title><style>{_CSS}</style></head><body>", f"<h1>{e(rep.title)}</h1>"]
    if rep.summary:
        out.append("<div class=\"summary\"><ul>" + "".join(f"<li>{e(s)}</li>" for s in rep.summary) + "</ul></div>")
    for b in rep.blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            out.append(f"<p>{e(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            out.append("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in b.header) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in b.rows)
                       + "</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode("ascii")
            out.append(f"<figure><img alt=\"{e(b.title)}\" title=\"{e(b.title)}\" "
                       f"src=\"data:image/png;base64,{data}\"><figcaption>{e(b.title)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)
