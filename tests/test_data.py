"""The real-data registry: lookup order, verified downloads from a local mirror, the CLI.

No test needs the network: downloads come from an ``http.server`` on localhost serving
a copy of ``../shared/data`` (the tests skip with a message where it is absent).
"""

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO
from hpcnb.cli import main
from hpcnb.data import available, data_path, fetch, fetch_all, path, registry, verify
from hpcnb.data.registry import (
    ChecksumError,
    DataNotFoundError,
    DownloadError,
    files_read,
    sha256_of,
)

SHARED = REPO.parent / "shared" / "data"
NAME = "swf/hpc2n-seth-first3170.swf"


@pytest.fixture
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"real data absent: {SHARED} (tests take their files from there)")
    return SHARED


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No data folder, an empty cache, no mirror."""
    monkeypatch.delenv("HPCNB_DATA", raising=False)
    monkeypatch.delenv("HPCNB_DATA_MIRROR", raising=False)
    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path / "cache"))
    return tmp_path


class _Server:
    def __init__(self, root: Path):
        self.root = root
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def mirror(shared, isolated, monkeypatch):
    """A localhost server holding a copy of the shared data, set as HPCNB_DATA_MIRROR."""
    root = isolated / "served"
    shutil.copytree(shared, root)
    server = _Server(root)
    monkeypatch.setenv("HPCNB_DATA_MIRROR", server.url)
    yield server
    server.close()


def test_registry_covers_the_shared_files_byte_for_byte(shared):
    entries = registry()
    files = {
        p.relative_to(shared).as_posix()
        for p in shared.rglob("*")
        if p.is_file() and p.name != "README.md"
    }
    assert set(entries) == files
    for name, entry in entries.items():
        assert sha256_of(shared / name) == entry.sha256, name
        assert (shared / name).stat().st_size == entry.size
        assert entry.url.startswith("https://") and entry.licence and entry.citation


def test_fetch_downloads_verifies_and_caches(mirror, isolated):
    file = fetch(NAME, timeout=10)
    assert file == isolated / "cache" / "data" / NAME
    assert sha256_of(file) == registry()[NAME].sha256
    assert mirror.requests == [f"/{NAME}"]
    assert fetch(NAME, timeout=10) == file and len(mirror.requests) == 1  # no second download
    assert path(NAME) == file and available()[NAME] == "cache"
    assert files_read()[NAME] == registry()[NAME].sha256


def test_corrupt_download_is_rejected_and_not_cached(mirror, isolated):
    served = mirror.root / NAME
    served.write_bytes(served.read_bytes()[:-10] + b"corrupted!")
    with pytest.raises(DownloadError, match=r"(?i)hash|sha256"):
        fetch(NAME, timeout=10)
    cached = isolated / "cache" / "data" / NAME
    assert not cached.exists()
    with pytest.raises(DataNotFoundError, match="hpcnb data fetch"):
        path(NAME)


def test_unreachable_server_fails_within_the_timeout(isolated, monkeypatch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections (backlog) but never answers
    monkeypatch.setenv("HPCNB_DATA_MIRROR", f"http://127.0.0.1:{listener.getsockname()[1]}")
    start = time.perf_counter()
    with pytest.raises(DownloadError, match=r"127\.0\.0\.1"):
        fetch_all(timeout=1.0)
    assert time.perf_counter() - start < 8  # the first failure ends the attempt
    listener.close()


def test_data_folder_takes_precedence_and_a_corrupt_copy_is_refused(mirror, isolated, monkeypatch):
    folder = isolated / "mine"
    (folder / "swf").mkdir(parents=True)
    shutil.copy(mirror.root / NAME, folder / NAME)
    monkeypatch.setenv("HPCNB_DATA", str(folder))
    assert fetch(NAME, timeout=10) == folder / NAME and mirror.requests == []
    assert available()[NAME] == "data folder"
    (folder / NAME).write_text("; not the trace\n")
    expected = registry()[NAME].sha256
    with pytest.raises(ChecksumError, match=expected) as info:
        path(NAME)
    assert sha256_of(folder / NAME) in str(info.value)
    with pytest.raises(ChecksumError):
        fetch(NAME, timeout=10)  # never replaced silently
    assert (folder / NAME).read_text() == "; not the trace\n" and mirror.requests == []
    assert verify() == {NAME: f"corrupt: {folder / NAME}"}


def test_missing_file_error_names_url_and_command(isolated):
    with pytest.raises(DataNotFoundError) as info:
        path(NAME)
    text = str(info.value)
    assert registry()[NAME].url in text and f"hpcnb data fetch {NAME}" in text
    with pytest.raises(DataNotFoundError, match="not in the data registry"):
        path("swf/nope.swf")


def test_folder_lookup_needs_every_member(mirror, isolated):
    with pytest.raises(DataNotFoundError, match="elastisim-example/"):
        data_path("elastisim-example")
    members = [n for n in registry() if n.startswith("elastisim-example/")]
    fetch_all(members, timeout=10)
    folder = data_path("elastisim-example")
    assert folder == isolated / "cache" / "data" / "elastisim-example"
    assert (folder / "jobs.json").is_file()


def test_cli_list_fetch_verify(mirror, isolated, capsys):
    assert main(["data", "list"]) == 0
    assert "23 missing" in capsys.readouterr().out.replace(f"{len(registry())} files, ", "23 ")
    assert main(["data", "fetch", NAME, "--timeout", "10"]) == 0
    assert NAME in capsys.readouterr().out
    assert main(["data", "verify"]) == 0
    assert main(["data", "fetch"]) == 2
    assert main(["data", "fetch", "no/such.csv"]) == 2
    with pytest.raises(SystemExit):
        main(["data", "fetch", "--all", "--timeout", "nan"])


def test_cli_fetch_offline_is_a_notice_with_quiet(isolated, monkeypatch, capsys):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens: connection refused
    monkeypatch.setenv("HPCNB_DATA_MIRROR", f"http://127.0.0.1:{port}")
    assert main(["data", "fetch", "--all", "--quiet", "--timeout", "2"]) == 0
    assert "real data not reachable" in capsys.readouterr().err
    assert main(["data", "fetch", "--all", "--timeout", "2"]) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX venv layout")
def test_built_wheel_ships_package_data(tmp_path):
    """Build the wheel, install it without dependencies into a fresh venv, use it elsewhere."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    wheel = next(wheels.glob("hpcnb-*.whl"))
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(wheel)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    # The project's environment (numpy etc.) after the wheel; its editable hook is not run.
    deps = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "project_env.pth").write_text("\n".join(deps) + "\n")
    code = (
        "import hpcnb, hpcnb.data as d, hpcnb.commprof.valgrind as vg\n"
        "assert 'venv' in hpcnb.__file__, hpcnb.__file__\n"
        "assert len(d.registry()) >= 20\n"
        "print(len(vg.recorded_run().log))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(python), "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) > 1000


def test_stand_in_notice_says_how_to_fetch(capsys):
    from hpcnb.data import stand_in_notice

    stand_in_notice("a generated trace, stand-in for HPC2N", "swf/x: real data not found\nmore")
    out = capsys.readouterr().out
    assert out.startswith("**Synthetic data (a generated trace, stand-in for HPC2N).**")
    assert "hpcnb data fetch --all" in out and "real data not found" in out and "more" not in out


CIFAR = "cifar10/cifar-10-python.tar.gz"


def test_cli_list_shows_the_large_files_and_fetch_takes_their_names(isolated, monkeypatch, capsys):
    from hpcnb.data.registry import large_files

    assert CIFAR in large_files()
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith(CIFAR)]
    assert len(lines) == 1 and "170.5 MB" in lines[0] and "missing" in lines[0]
    assert "not by --all" in out
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens: the fetch cannot reach any network
    monkeypatch.setenv("HPCNB_DATA_MIRROR", f"http://127.0.0.1:{port}")
    assert main(["data", "fetch", CIFAR, "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and CIFAR in errors[0] and "Traceback" not in err
    assert not (isolated / "cache" / "data" / CIFAR).exists()
    assert main(["data", "fetch", "cifar10/no-such.tar.gz"]) == 2
