"""``hpcnb site``: a static, offline HTML site of a run folder, checked as files and in Chromium.

A tiny run folder is made once with :func:`hpcnb.runner.run_notebooks` from two throw-away
notebooks: one with a matplotlib figure, a record and a claim, one that fails at its second
cell. The site is then built from it without executing anything again.
"""

from __future__ import annotations

import base64
import os
import shutil
import struct
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from _nbutil import chromium, make_notebook
from hpcnb.cli import main
from hpcnb.runner import run_notebooks
from hpcnb.site import SiteError, build_site

PARAMS = "SMOKE: bool = False  # tiny\nSEED: int = 0  # seed\n"
FIGURE_CELL = (
    "%matplotlib inline\n"
    "import matplotlib.pyplot as plt\n"
    "fig, ax = plt.subplots(figsize=(3, 2))\n"
    "ax.plot([0, 1, 2], [0, 1, 4])\n"
    "ax.set_xlabel('step')\n"
    "plt.show()"
)
CLAIM_CELL = (
    "from hpcnb import claim, claims_table, record\n"
    "record('t.speedup', samples=[1.4, 1.5, 1.45, 1.55, 1.5, 1.52, 1.48], target='> 1')\n"
    "claim('the fused loop beats the plain one', records=['t.speedup'], kind='own design')\n"
    "claims_table()"
)
CLAIM_TEXT = "the fused loop beats the plain one"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Refs(HTMLParser):
    """Collect what a page references: links, images, scripts, stylesheets, style text."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []
        self.scripts: list[str] = []
        self.stylesheets: list[str] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag == "a" and "href" in values:
            self.links.append(values["href"])
        elif tag == "img":
            self.images.append(values.get("src", ""))
        elif tag == "script" and "src" in values:
            self.scripts.append(values["src"])
        elif tag == "link":
            self.stylesheets.append(values.get("href", ""))
        elif tag == "style":
            self._in_style = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)


def _refs(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a run folder holding one notebook with a figure and a claim, and one failure."""
    root = tmp_path_factory.mktemp("site")
    good = make_notebook(root / "a_figure.ipynb", PARAMS, FIGURE_CELL, CLAIM_CELL)
    bad = make_notebook(root / "b_broken.ipynb", PARAMS, "x = 1", "raise ValueError('no good')")
    out = root / "runs" / "one"
    results = run_notebooks([good, bad], {}, out=out, progress=False, timeout=120)
    by_name = {r.notebook: r for r in results}
    assert by_name["a_figure"].ok, by_name["a_figure"].error
    assert by_name["b_broken"].status == "failed"
    return out


@pytest.fixture(scope="module")
def site(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the folder of a site built through the command line with ``--out``."""
    out = tmp_path_factory.mktemp("built") / "site"
    assert main(["site", str(run_dir), "--out", str(out)]) == 0
    return out


def test_site_has_an_index_and_a_page_per_executed_notebook(site: Path) -> None:
    assert sorted(p.name for p in site.iterdir()) == [
        "a_figure.html",
        "b_broken.html",
        "index.html",
    ]
    index = (site / "index.html").read_text(encoding="utf-8")
    assert '<a href="a_figure.html">a_figure</a>' in index
    assert '<td class="ok">ok</td>' in index and '<td class="bad">failed</td>' in index
    assert "no good" in index  # the failing notebook's error is shown
    assert CLAIM_TEXT in index and "<td>1 met</td>" in index
    assert "Claims overall (1): 1 met." in index
    assert " s</td>" in index  # a duration in seconds
    thumbs = [src for src in _refs(site / "index.html").images if src]
    assert len(thumbs) == 1 and thumbs[0].startswith("data:image/png;base64,")


def test_every_link_resolves_and_pages_link_back_to_the_index(site: Path) -> None:
    for page in site.glob("*.html"):
        refs = _refs(page)
        local = [h for h in refs.links if not urlsplit(h).scheme and not h.startswith("#")]
        for href in local:
            target = site / unquote(urlsplit(href).path)
            assert target.is_file(), f"{page.name}: link {href!r} resolves to nothing"
        if page.name != "index.html":
            assert "index.html" in local, f"{page.name} has no link back to the index"
    index_links = _refs(site / "index.html").links
    assert {"a_figure.html", "b_broken.html"} <= set(index_links)


def test_no_script_or_stylesheet_comes_from_the_network(site: Path) -> None:
    for page in site.glob("*.html"):
        refs = _refs(page)
        remote = [
            ref
            for ref in refs.scripts + refs.stylesheets
            if ref.startswith(("http://", "https://", "//"))
        ]
        assert not remote, f"{page.name} loads {remote}"
        css = "".join(refs.styles)
        for marker in ("@import", "url(http", "url('http", 'url("http', "url(//"):
            assert marker not in css, f"{page.name}: stylesheet has {marker!r}"
        text = page.read_text(encoding="utf-8")
        assert "cdnjs" not in text and "require.min.js" not in text and "mathjax" not in text


def test_the_figure_is_an_embedded_png(site: Path) -> None:
    images = _refs(site / "a_figure.html").images
    assert images, "no img element on the figure page"
    prefix = "data:image/png;base64,"
    assert all(src.startswith(prefix) for src in images), images
    data = base64.b64decode(images[0][len(prefix) :])
    assert data[:8] == PNG_MAGIC
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width > 0 and height > 0


def test_default_out_is_the_run_folders_site(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copied-run"
    shutil.copytree(run_dir, copy)
    index = build_site(copy)
    assert index == copy / "site" / "index.html" and index.is_file()
    assert (copy / "site" / "a_figure.html").is_file()
    before = sorted(p.name for p in copy.iterdir())
    build_site(copy)  # building again replaces the pages
    assert sorted(p.name for p in copy.iterdir()) == before


def test_an_unreadable_notebook_is_noted_and_the_rest_still_built(
    run_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "damaged-run"
    shutil.copytree(run_dir, copy)
    (copy / "b_broken.ipynb").write_text("{ not json", encoding="utf-8")
    index = build_site(copy, tmp_path / "out")
    text = index.read_text(encoding="utf-8")
    assert "page not rendered" in text and '<a href="a_figure.html">' in text
    assert not (tmp_path / "out" / "b_broken.html").exists()
    assert (tmp_path / "out" / "a_figure.html").is_file()


def test_bad_input_is_one_line_and_exit_2(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "plain.txt"
    a_file.write_text("not a run\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["site", str(tmp_path / "missing")], "no such folder"),
        (["site", str(a_file)], "is a file"),
        (["site", str(empty)], "no run.json"),
        (["site", str(run_dir), "--out", str(a_file)], "is a file, not a folder"),
        (["site", str(run_dir), "--out", str(a_file / "sub")], "cannot write there"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (argv, captured.err)
        assert lines[0].startswith("hpcnb site: ")
    (empty / "run.json").write_text("[1, 2]")
    with pytest.raises(SiteError, match="expected a JSON object"):
        build_site(empty)
    (empty / "run.json").write_text('{"x": 3}')
    with pytest.raises(SiteError, match="entry 'x': expected a JSON object"):
        build_site(empty)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_is_refused(run_dir: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(SiteError, match="cannot write there"):
            build_site(run_dir, locked)
    finally:
        locked.chmod(0o700)


# --- in a real browser, from file:// ---------------------------------------------------


NO_CHROMIUM = (
    "chromium not found: `make system-deps` installs Debian's chromium (as root), or set "
    "HPCNB_CHROMIUM to a Chromium/Chrome binary; the site browser test needs one"
)


@pytest.fixture
def browser_page() -> Iterator[tuple[Any, list[str], list[str]]]:
    """Return a headless Chromium page, its console errors and any network request it tried."""
    pytest.importorskip(
        "playwright.sync_api",
        reason="Playwright's Python package is not installed (it is in the test extra)",
    )
    path = chromium()
    if path is None:
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    errors: list[str] = []
    remote: list[str] = []

    def _route(route: Any) -> None:
        url = route.request.url
        if url.startswith(("file:", "data:")):
            route.continue_()
        else:
            remote.append(url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=path,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 900})
            context.set_default_timeout(30_000)
            context.route("**/*", _route)
            page = context.new_page()
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page, errors, remote
        finally:
            browser.close()


@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_index_and_a_notebook_page_render_offline_in_chromium(
    browser_page: tuple[Any, list[str], list[str]], site: Path
) -> None:
    page, errors, remote = browser_page
    page.goto((site / "index.html").as_uri())
    assert page.title().startswith("hpcnb run ")
    assert page.locator("table tr").count() >= 3  # header and one row per notebook
    assert page.locator("text=" + CLAIM_TEXT).count() >= 1
    thumb = page.locator("img.thumb").first
    thumb.wait_for()
    assert thumb.evaluate("img => img.complete ? img.naturalWidth : 0") > 0
    page.locator("a", has_text="a_figure").first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/a_figure.html")
    image = page.locator("img").first
    image.wait_for()
    width = image.evaluate("img => img.complete ? img.naturalWidth : 0")
    assert width > 0, "the figure did not decode"
    page.screenshot(path=str(site.parent / "a_figure.png"))
    page.locator("nav a", has_text="index").first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/index.html")
    assert not errors, f"console errors: {errors}"
    assert not remote, f"the site asked the network for {remote}"
