"""End-to-end: JupyterLab in a real (headless, system) Chromium runs the tour notebook.

The test starts ``jupyter lab`` from this environment on a free localhost port with a random
token, in a temporary folder holding a copy of ``00_tour.ipynb`` whose parameters cell says
``SMOKE: bool = True`` and a tiny notebook with a ``tqdm.auto`` loop. Playwright drives Debian's
``chromium`` (``executable_path``; Playwright never downloads a browser here). For each notebook
it clicks Run > Run All Cells, waits (bounded) until every cell has run and the kernel is idle,
saves the notebook through the UI and checks what a student would see: no error output, the
records' readable lines, a plot image, and tqdm's bar rendered as an ipywidgets progress widget
(not the ``IProgress not found`` fallback). Screenshots go to the test's temporary folder.

JupyterLab, its kernels, the Playwright driver and Chromium are all stopped at the end, whatever
happens, and the test fails if any process it started is still alive.

Without Playwright's Python package or a Chromium binary the test skips and says how to get
them (``make system-deps`` installs Debian's ``chromium``; ``HPCNB_CHROMIUM`` names another).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest

from _nbutil import chromium
from conftest import NOTEBOOKS

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 180.0  # a whole notebook, Run All to kernel idle (the tour takes < 60 s in SMOKE)
START_TIMEOUT_S = 60.0  # jupyter lab answering on its port
UI_TIMEOUT_MS = 60_000  # one browser action (JupyterLab's first load is slow on a busy machine)
RECORD_LINE = "tour.numba_vs_numpy = "
PROGRESS_SOURCE = "from tqdm.auto import tqdm\n\ntotal = sum(x for x in tqdm(range(50)))\ntotal"

# User-level JupyterLab settings for the test server: every cell stays in the DOM (no
# windowing), and no news / update check (no network, no notification over the notebook).
LAB_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "checkForUpdates": False,
        "fetchNews": "false",
    },
}


def _free_port() -> int:
    """Return a localhost TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ProcessTree:
    """Every process seen below the tracked roots, so that all of them can be ended at the end.

    Kernels run in a session of their own, so killing a process group is not enough; psutil
    objects (pid + creation time) keep a re-used pid from being mistaken for ours. pytest's
    own process is never tracked: only the children it starts after :meth:`watch_own_children`
    (the Playwright driver and, below it, Chromium), never ones it had before.
    """

    roots: list[int] = field(default_factory=list)
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    own_baseline: set[int] | None = None

    def add_root(self, pid: int) -> None:
        """Track ``pid`` and, from now on, its descendants."""
        self.roots.append(pid)
        self.snapshot()

    def watch_own_children(self) -> None:
        """Track the children this process starts from now on (and their descendants)."""
        self.own_baseline = {p.pid for p in psutil.Process().children()}

    def _add_tree(self, root: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            self.seen.setdefault(root.pid, root)
            for child in root.children(recursive=True):
                self.seen.setdefault(child.pid, child)

    def snapshot(self) -> None:
        """Remember every live descendant of the roots (call it while they are running)."""
        for pid in self.roots:
            with contextlib.suppress(psutil.Error):
                self._add_tree(psutil.Process(pid))
        if self.own_baseline is not None:
            for child in psutil.Process().children():
                if child.pid not in self.own_baseline:
                    self._add_tree(child)

    def alive(self) -> list[psutil.Process]:
        """Return the remembered processes still running (zombies count as ended)."""
        out = []
        for proc in self.seen.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
        return out

    def end_all(self, grace_s: float = 5.0) -> None:
        """SIGTERM every remembered process still alive, then SIGKILL what is left."""
        self.snapshot()
        for sig in ("terminate", "kill"):
            procs = self.alive()
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    getattr(proc, sig)()
            psutil.wait_procs(procs, timeout=grace_s)


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab server."""

    base_url: str
    token: str
    root: Path
    log: Path

    def api(self, path: str, method: str = "GET", timeout: float = 5.0) -> Any:
        """Call the server's REST API with the token and return the decoded JSON (or None)."""
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
            data=b"" if method == "POST" else None,
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def url(self, notebook: str) -> str:
        """Return the URL opening ``notebook`` alone, in a fresh workspace of its own."""
        workspace = Path(notebook).stem.replace("_", "-")
        return (
            f"{self.base_url}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}"
        )

    def kernel_states(self) -> dict[str, str]:
        """Return ``{notebook path: kernel execution state}`` for every open session."""
        return {
            s["path"]: s["kernel"]["execution_state"]
            for s in self.api("/api/sessions")
            if s.get("kernel")
        }


def _smoke_tour(folder: Path) -> Path:
    """Copy the tour into ``folder`` with ``SMOKE: bool = True`` in its parameters cell."""
    nb = nbformat.read(NOTEBOOKS / "00_tour.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    source, n = re.subn(r"^SMOKE: bool = False\b", "SMOKE: bool = True", cell.source, flags=re.M)
    assert n == 1, f"00_tour.ipynb: no 'SMOKE: bool = False' line in its parameters cell:\n{source}"
    cell.source = source
    path = folder / "00_tour.ipynb"  # same name: the tour reads its own parameters cell
    nbformat.write(nb, path)
    return path


def _progress_notebook(folder: Path) -> Path:
    """Write a one-cell notebook whose loop shows a ``tqdm.auto`` progress bar."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(PROGRESS_SOURCE)]
    path = folder / "progress_bar.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def chromium_path() -> str:
    """Return the system Chromium, skipping the test (with the reason) when it is missing."""
    pytest.importorskip(
        "playwright.sync_api",
        reason="Playwright's Python package is not installed (it is in the test extra)",
    )
    path = chromium()
    if path is None:
        pytest.skip(
            "chromium not found: `make system-deps` installs Debian's chromium (as root), or set "
            "HPCNB_CHROMIUM to a Chromium/Chrome binary; the JupyterLab browser test needs one"
        )
    return path


@pytest.fixture
def processes() -> Iterator[ProcessTree]:
    """Track the processes the test starts; end them and fail if any survives."""
    tree = ProcessTree()
    try:
        yield tree
    finally:
        # The server's shutdown and browser.close() should have ended everything; give them a
        # moment, name what they left, then end it ourselves and check that nothing survives.
        psutil.wait_procs(tree.alive(), timeout=10)
        stragglers = [(p.pid, p.name()) for p in tree.alive()]
        tree.end_all()
        left = [(p.pid, p.name()) for p in tree.alive()]
        assert not left, f"processes left behind even after SIGKILL: {left}"
        if stragglers:
            warnings.warn(f"ended by the test, not by their shutdown: {stragglers}", stacklevel=1)


@pytest.fixture
def lab(tmp_path: Path, processes: ProcessTree) -> Iterator[Lab]:
    """Start ``jupyter lab`` on a temporary folder; shut it and its kernels down afterwards."""
    root = tmp_path / "notebooks"
    root.mkdir()
    _smoke_tour(root)
    _progress_notebook(root)
    home = tmp_path / "jupyter"
    settings = home / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        target = settings / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    port, token = _free_port(), secrets.token_hex(24)
    args = [
        str(Path(sys.executable).with_name("jupyter")),
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.geteuid() == 0:
        args.append("--allow-root")
    log = tmp_path / "jupyter-lab.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            args, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    processes.add_root(proc.pid)
    server = Lab(f"http://127.0.0.1:{port}", token, root, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            with contextlib.suppress(OSError):
                server.api("/api/status", timeout=2)
                break
            if time.monotonic() > deadline:
                tail = log.read_text()[-3000:]
                pytest.fail(f"jupyter lab not answering after {START_TIMEOUT_S:.0f} s:\n{tail}")
            time.sleep(0.5)
        yield server
    finally:
        processes.snapshot()  # the kernels, before the server lets go of them
        with contextlib.suppress(OSError, urllib.error.URLError):
            server.api("/api/shutdown", method="POST")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        # `processes` then ends whatever did not stop (kernels included) and checks the pids.


@pytest.fixture
def page(chromium_path: str, lab: Lab, processes: ProcessTree) -> Iterator[Any]:
    """Return a Playwright page in headless system Chromium; closed (and checked) afterwards."""
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    processes.watch_own_children()  # the Playwright driver and, below it, Chromium
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.set_default_timeout(UI_TIMEOUT_MS)
            yield context.new_page()
        finally:
            processes.snapshot()
            browser.close()


def _run_all(page: Any, lab: Lab, name: str, processes: ProcessTree) -> float:
    """Open ``name``, Run All Cells through the menu, wait until done and save; return seconds."""
    page.goto(lab.url(name))
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while lab.kernel_states().get(name) != "idle":  # kernel started and ready
        assert time.monotonic() < deadline, f"{name}: kernel not idle: {lab.kernel_states()}"
        time.sleep(0.5)
    processes.snapshot()
    start = time.monotonic()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    # Run All marks every queued cell "[*]" at once; done = none left and the kernel idle.
    prompts = ".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt"
    page.wait_for_function(
        """(sel) => {
            const p = [...document.querySelectorAll(sel)].map((e) => e.textContent);
            return p.length > 0 && !p.some((t) => t.includes("*")) && p.some((t) => /\\d/.test(t));
        }""",
        arg=prompts,
        timeout=RUN_TIMEOUT_S * 1000,
        polling=500,
    )
    while lab.kernel_states().get(name) != "idle":
        assert time.monotonic() < deadline, f"{name}: kernel still busy after {RUN_TIMEOUT_S} s"
        time.sleep(0.5)
    elapsed = time.monotonic() - start
    processes.snapshot()
    before = (lab.root / name).stat().st_mtime_ns
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^File$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Save Notebook$")).click()
    deadline = time.monotonic() + 30
    while (lab.root / name).stat().st_mtime_ns == before:
        assert time.monotonic() < deadline, f"{name}: File > Save Notebook wrote nothing in 30 s"
        time.sleep(0.3)
    return elapsed


def _read_saved(path: Path) -> nbformat.NotebookNode:
    """Read the notebook JupyterLab saved (retrying briefly while the write is in flight)."""
    for _ in range(20):
        with contextlib.suppress(json.JSONDecodeError, nbformat.reader.NotJSONError):
            return nbformat.read(path, as_version=4)
        time.sleep(0.3)
    return nbformat.read(path, as_version=4)


def _check_clean_run(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Assert every code cell ran, without an error output or a widget fallback warning.

    Returns:
        ``(cell index, output)`` for every output of every code cell.
    """
    nb = _read_saved(path)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    outputs = [(i, out) for i, c in code for out in c.get("outputs", [])]
    errors = [
        f"cell {i}: {o.get('ename')}: {o.get('evalue')}"
        for i, o in outputs
        if o["output_type"] == "error"
    ]
    assert not errors, f"{path.name}: error outputs in JupyterLab: {errors}"
    unrun = [i for i, c in code if not c.get("execution_count")]
    assert not unrun, f"{path.name}: cells not executed by Run All: {unrun}"
    fallbacks = [
        i for i, o in outputs if o["output_type"] == "stream" and "IProgress" in o.get("text", "")
    ]
    assert not fallbacks, (
        f"{path.name}: tqdm fell back to text (ipywidgets missing?) in {fallbacks}"
    )
    return outputs


@contextlib.contextmanager
def _evidence_on_failure(page: Any, folder: Path) -> Iterator[None]:
    """On a failure inside the block, save the page as ``failure.png`` / ``failure.html``."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=folder / "failure.png")
            (folder / "failure.html").write_text(page.content())
        raise


def test_tour_runs_in_jupyterlab(page: Any, lab: Lab, tmp_path: Path, processes: ProcessTree):
    with _evidence_on_failure(page, tmp_path):
        _check_tour(page, lab, tmp_path, processes)
        _check_progress_widget(page, lab, tmp_path, processes)


def _check_tour(page: Any, lab: Lab, tmp_path: Path, processes: ProcessTree) -> None:
    """Run the SMOKE tour: no error, readable record lines, a plot image; screenshot it."""
    seconds = _run_all(page, lab, "00_tour.ipynb", processes)
    outputs = _check_clean_run(lab.root / "00_tour.ipynb")
    assert any("application/vnd.hpcnb.record+json" in o.get("data", {}) for _, o in outputs)
    shown = page.locator(".jp-OutputArea-output", has_text=RECORD_LINE)
    assert shown.count() >= 1, f"no output shows {RECORD_LINE!r}"
    shown.first.scroll_into_view_if_needed()
    assert shown.first.is_visible()
    assert re.search(r"tour\.numba_vs_numpy = \S+", shown.first.inner_text())
    for text in page.locator(".jp-OutputArea-output").all_inner_texts():
        assert "Traceback (most recent call last)" not in text, text[:2000]
    images = page.locator(".jp-OutputArea-output img")
    assert images.count() >= 1, "no plot image in any output area"
    images.first.scroll_into_view_if_needed()  # the timing bar chart
    page.wait_for_function(
        "(s) => [...document.querySelectorAll(s)].some((i) => i.complete && i.naturalWidth > 0)",
        arg=".jp-OutputArea-output img",
    )
    page.screenshot(path=tmp_path / "00_tour.png")
    assert seconds < RUN_TIMEOUT_S


def _check_progress_widget(page: Any, lab: Lab, tmp_path: Path, processes: ProcessTree) -> None:
    """Run a tqdm.auto loop: the bar must be an ipywidgets progress widget, full at the end."""
    _run_all(page, lab, "progress_bar.ipynb", processes)
    outputs = _check_clean_run(lab.root / "progress_bar.ipynb")
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for _, o in outputs)
    area = page.locator(".jp-OutputArea-output").first
    bar = area.locator(".jupyter-widgets.widget-hprogress .progress-bar")
    bar.wait_for(state="visible")
    page.wait_for_function(  # the bar is full and its label counted every step
        """(el) => el.style.width === "100%" &&
            el.closest(".jp-OutputArea-output").textContent.includes("50/50")""",
        arg=bar.element_handle(),
    )
    page.screenshot(path=tmp_path / "progress_bar.png")
