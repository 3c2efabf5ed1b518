"""Static HTML site of a run folder: an index page and one page per executed notebook.

``hpcnb site RUN_DIR`` turns a folder written by ``hpcnb run`` into plain HTML files that open
from disk without a network::

    site/index.html        each notebook's status, duration, claims with verdict counts
                           and its first figure as a thumbnail
    site/<stem>.html       the executed notebook with its outputs and figures

Nothing is executed: the pages are rendered from the executed notebooks with nbconvert's
``lab`` template, minus every script it would load from a CDN (require.js, MathJax, Mermaid,
the widget manager). Figures are already ``data:`` images inside the notebooks and stay
embedded; the template's stylesheets are inlined. Without MathJax, TeX in markdown cells shows
as its source text.

Claims come from ``claims.json``; a notebook missing there is read with
:func:`hpcnb.claims.read_claims` from its executed file.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hpcnb.claims import VERDICTS, read_claims
from hpcnb.errors import HpcnbError
from hpcnb.runfolder import RunFolderError, read_run_tables

__all__ = ["SiteError", "build_site", "first_figure", "page_name"]

#: The nbconvert template of a notebook page: ``lab`` without any script from a CDN.
_PAGE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block extra_css %}<style type="text/css">{{ resources.hpcnb_css }}</style>
{% endblock extra_css %}
{%- block body_header -%}{{ super() }}{{ resources.hpcnb_nav }}{%- endblock body_header -%}
{% block body_footer %}{{ resources.hpcnb_nav }}{{ super() }}{% endblock body_footer %}
"""
_TEMPLATE_NAME = "hpcnb_site_page.html.j2"

_NAV_CSS = """
nav.hpcnb-nav { font-family: sans-serif; padding: 0.6em 1em; margin: 0 0 0.5em 0;
  background: #f3f3f3; border-bottom: 1px solid #ddd; }
nav.hpcnb-nav a { margin-right: 1em; }
nav.hpcnb-nav .status { color: #555; }
"""

_INDEX_CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 80em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; white-space: nowrap; }
img.thumb { max-width: 12em; max-height: 8em; }
.ok { color: #1a7f37; }
.bad { color: #b42318; font-weight: bold; }
.note { color: #555; }
"""

#: A notebook stem that is safe as a file name inside the site.
_STEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SiteError(HpcnbError):
    """The run folder or the site's destination cannot be used; the message names it."""


def page_name(stem: str) -> str:
    """Return the file name of a notebook's page in the site.

    >>> page_name("00_tour")
    '00_tour.html'
    """
    return f"{stem}.html"


def _duration(seconds: object) -> str:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{counter[v]} {v}" for v in VERDICTS if counter[v]) or "none"


def _check_run_dir(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Return the run folder's tables, or raise a :class:`SiteError` naming the problem."""
    if not run_dir.exists():
        raise SiteError(f"{run_dir}: no such folder")
    if not run_dir.is_dir():
        raise SiteError(f"{run_dir}: is a file, not a run folder written by 'hpcnb run'")
    if not (run_dir / "run.json").is_file():
        raise SiteError(f"{run_dir}: no run.json (not a folder written by 'hpcnb run')")
    tables = read_run_tables(run_dir)
    for stem, info in tables["run.json"].items():
        if not isinstance(info, dict) or not {"status", "seconds", "output"} <= set(info):
            raise SiteError(f"{run_dir / 'run.json'}: entry {stem!r} is not a notebook result")
        if not _STEM.match(stem):
            raise SiteError(f"{run_dir / 'run.json'}: entry {stem!r} is not a notebook name")
    return tables


def _prepare_out(out: Path) -> None:
    """Create ``out`` and check that files can be written there."""
    if out.exists() and not out.is_dir():
        raise SiteError(f"site folder {out}: is a file, not a folder")
    probe = out / ".hpcnb-site-write-test"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise SiteError(f"site folder {out}: cannot write there ({exc.strerror or exc})") from None


def _output_path(run_dir: Path, info: Mapping[str, Any]) -> Path:
    """Return the executed notebook of a run entry (paths in run.json are relative)."""
    output = Path(str(info["output"]))
    if not output.is_absolute():
        output = run_dir / output
    if not output.is_file():
        output = run_dir / output.name
    return output


def _claims_of(
    stem: str, output: Path, table: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], str]:
    """Return a notebook's claims rows and a note when they could not be read."""
    rows = table.get(stem)
    if isinstance(rows, list) and all(isinstance(row, dict) for row in rows):
        return list(rows), ""
    if not output.is_file():
        return [], ""
    try:
        return read_claims(output), ""
    except (HpcnbError, ValueError, OSError) as exc:
        return [], f"claims unreadable: {exc}"


def _exporter() -> Any:
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(
        template_name="lab",
        extra_loaders=[DictLoader({_TEMPLATE_NAME: _PAGE_TEMPLATE})],
        template_file=_TEMPLATE_NAME,
    )


def _status_text(info: Mapping[str, Any]) -> str:
    parts = [str(info.get("status", "")), _duration(info.get("seconds"))]
    if info.get("cached_from"):
        parts.append(f"cached from {info['cached_from']}")
    if info.get("error"):
        cell = info.get("cell")
        where = f"cell {cell}: " if cell is not None else ""
        parts.append(f"{where}{info['error']}")
    return " · ".join(p for p in parts if p)


def first_figure(nb: Mapping[str, Any]) -> str | None:
    """Return the first figure of a notebook's outputs as a ``data:`` URI, or ``None``.

    >>> cell = {"cell_type": "code", "outputs": [{"data": {"image/png": "iVBORw0K"}}]}
    >>> first_figure({"cells": [cell]})
    'data:image/png;base64,iVBORw0K'
    """
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) or []:
            data = output.get("data", {}) if isinstance(output, Mapping) else {}
            for mime in ("image/png", "image/jpeg", "image/svg+xml"):
                value = data.get(mime)
                if isinstance(value, list):
                    value = "".join(value)
                if not isinstance(value, str) or not value:
                    continue
                if mime == "image/svg+xml":
                    value = base64.b64encode(value.encode("utf-8")).decode("ascii")
                return f"data:{mime};base64,{''.join(value.split())}"
    return None


def _render_page(
    exporter: Any, stem: str, output: Path, info: Mapping[str, Any]
) -> tuple[str, str | None]:
    """Return a notebook's page and its first figure (a ``data:`` URI or ``None``)."""
    import nbformat

    nb = nbformat.read(output, as_version=4)
    nav = (
        '<nav class="hpcnb-nav"><a href="index.html">&larr; index of the run</a>'
        f"<strong>{html.escape(stem)}</strong> "
        f'<span class="status">{html.escape(_status_text(info))}</span></nav>'
    )
    resources = {
        "metadata": {"name": stem, "path": str(output.parent)},
        "hpcnb_nav": nav,
        "hpcnb_css": _NAV_CSS,
    }
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    return str(body), first_figure(nb)


def _thumbnail(stem: str, page: str | None, figure: str | None) -> str:
    """Return the index's thumbnail of a notebook's first figure, linked to its page."""
    if figure is None:
        return ""
    alt = f"first figure of {html.escape(stem)}"
    img = f'<img class="thumb" src="{html.escape(figure)}" alt="{alt}">'
    return f'<a href="{quote(page)}">{img}</a>' if page else img


def _index_html(
    run_dir: Path,
    run: Mapping[str, Mapping[str, Any]],
    pages: Mapping[str, str],
    figures: Mapping[str, str | None],
    claims: Mapping[str, list[dict[str, Any]]],
    notes: Mapping[str, str],
) -> str:
    esc = html.escape
    overall: Counter[str] = Counter()
    rows: list[str] = []
    sections: list[str] = []
    for stem in sorted(run):
        info = run[stem]
        counter = Counter(str(row.get("verdict", "")) for row in claims[stem])
        overall.update(counter)
        status = str(info.get("status", ""))
        css = "ok" if status == "ok" else "bad"
        name = esc(stem)
        if stem in pages:
            name = f'<a href="{quote(pages[stem])}">{name}</a>'
        error = str(info.get("error") or "")
        if error and info.get("cell") is not None:
            error = f"cell {info['cell']}: {error}"
        extra = [esc(error)] if error else []
        if info.get("cached_from"):
            extra.append(esc(f"cached from {info['cached_from']}"))
        if notes.get(stem):
            extra.append(esc(notes[stem]))
        rows.append(
            f'<tr><td>{name}</td><td class="{css}">{esc(status)}</td>'
            f'<td class="num">{esc(_duration(info.get("seconds")))}</td>'
            f"<td>{esc(_counts(counter))}</td><td>{'<br>'.join(extra)}</td>"
            f"<td>{_thumbnail(stem, pages.get(stem), figures.get(stem))}</td></tr>"
        )
        if claims[stem]:
            sections.append(f'<h2 id="claims-{esc(stem)}">{name}</h2>')
            sections.append(
                "<table><tr><th>claim</th><th>kind</th><th>paper</th><th>measured</th>"
                "<th>verdict</th></tr>"
            )
            for row in claims[stem]:
                paper = row.get("paper")
                sections.append(
                    f"<tr><td>{esc(str(row.get('claim', '')))}</td>"
                    f"<td>{esc(str(row.get('kind') or ''))}</td>"
                    f"<td>{esc('' if paper is None else str(paper))}</td>"
                    f"<td>{esc(str(row.get('measured') or ''))}</td>"
                    f"<td>{esc(str(row.get('verdict', '')))}</td></tr>"
                )
            sections.append(f"</table><p>Claims: {esc(_counts(counter))}.</p>")
    ok = sum(info.get("status") == "ok" for info in run.values())
    title = f"hpcnb run {run_dir.resolve().name}"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1.0">',
            f"<title>{esc(title)}</title>",
            f'<style type="text/css">{_INDEX_CSS}</style></head><body><main>',
            f"<h1>{esc(title)}</h1>",
            f"<p>{ok}/{len(run)} notebooks completed. "
            f"Claims overall ({sum(overall.values())}): {esc(_counts(overall))}.</p>",
            "<table><tr><th>notebook</th><th>status</th><th>duration</th>"
            "<th>claims</th><th>notes</th><th>first figure</th></tr>",
            *rows,
            "</table>",
            *sections,
            "</main></body></html>",
            "",
        ]
    )


def build_site(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a static HTML site of a run folder; return the path of its index page.

    The site has ``index.html`` (each notebook's status, duration, claims with verdict
    counts and first figure, linked to its page) and ``<stem>.html`` per executed notebook
    (its outputs and embedded figures, linked back to the index). Pages load nothing from
    the network.

    Args:
        run_dir: A folder written by ``hpcnb run`` (holding ``run.json``).
        out: Where to write the site (created when missing); default ``RUN_DIR/site``.

    Raises:
        SiteError: ``run_dir`` is missing, a file or has no (or a malformed) ``run.json``,
            or ``out`` is a file or cannot be written.
    """
    run_dir = Path(run_dir)
    try:
        tables = _check_run_dir(run_dir)
    except RunFolderError as exc:
        raise SiteError(str(exc)) from None
    out_dir = run_dir / "site" if out is None else Path(out)
    _prepare_out(out_dir)
    run = tables["run.json"]
    exporter = _exporter() if run else None
    pages: dict[str, str] = {}
    figures: dict[str, str | None] = {}
    claims: dict[str, list[dict[str, Any]]] = {}
    notes: dict[str, str] = {}
    for stem, info in sorted(run.items()):
        output = _output_path(run_dir, info)
        claims[stem], notes[stem] = _claims_of(stem, output, tables["claims.json"])
        if not output.is_file():
            continue
        try:
            page, figures[stem] = _render_page(exporter, stem, output, info)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # one bad file, not the site
            failed = f"page not rendered: {type(exc).__name__}: {exc}"
            notes[stem] = "; ".join(n for n in (notes[stem], failed) if n)
            continue
        _write(out_dir / page_name(stem), page)
        pages[stem] = page_name(stem)
    index = out_dir / "index.html"
    _write(index, _index_html(run_dir, run, pages, figures, claims, notes))
    return index


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so a reader never sees half."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SiteError(f"{path}: cannot write ({exc.strerror or exc})") from None
