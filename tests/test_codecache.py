"""Tests of hpcnb.codecache and its use by the commprof and Winograd code generators.

A cached generated module is compared with the generated text before it runs; a tampered
file (a line appended, a truncated write) is rewritten with a CodeCacheWarning and the
appended code never runs, in this process or the next; Numba's ``cache=True`` keeps
working on the verified files.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from _numbagen import NUMBA_SOURCE, numba_script

from hpcnb import codecache
from hpcnb.codecache import (
    CodeCacheWarning,
    atomic_write,
    ensure_source,
    generated_path,
    load_generated,
    source_digest,
)

REPO = Path(__file__).resolve().parents[1]
TAMPER = "\nraise SystemExit('tampered')\n"
SOURCE = "VALUE = 41\n\n\ndef answer():\n    return VALUE + 1\n"


def _marker_line(marker: Path) -> str:
    return f"\nopen({str(marker)!r}, 'w').write('ran')\n"


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HPCNB_CACHE"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


# ---------------------------------------------------------------------------- helpers


def test_generated_path_is_keyed_on_sha256_of_source(tmp_path):
    import hashlib

    p = generated_path(tmp_path, "cp_k", SOURCE)
    assert p == tmp_path / f"cp_k_{hashlib.sha256(SOURCE.encode()).hexdigest()[:16]}.py"
    assert source_digest(SOURCE) != source_digest(SOURCE + " ")


def test_atomic_write_replaces_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "f.json"
    atomic_write(path, "one")
    atomic_write(path, b"two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.json"]


def test_atomic_write_failure_keeps_old_file_and_removes_temporary(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    atomic_write(path, "old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(codecache.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_concurrent_reader_never_sees_half_a_file(tmp_path):
    path = tmp_path / "big.txt"
    contents = ["a" * 400_000, "b" * 600_000]
    atomic_write(path, contents[0])
    seen: set[int] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.add(len(path.read_text()))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(60):
            atomic_write(path, contents[i % 2])
    finally:
        stop.set()
        t.join()
    assert seen <= {400_000, 600_000}


def test_ensure_source_writes_missing_and_keeps_correct_file(tmp_path):
    path = tmp_path / "m.py"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ensure_source(path, SOURCE) is True  # missing: written, no warning
        stamp = path.stat().st_mtime_ns
        assert ensure_source(path, SOURCE) is False  # correct: untouched
    assert path.stat().st_mtime_ns == stamp and path.read_text() == SOURCE


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (SOURCE + TAMPER, "appended"),
        (SOURCE[:10], "truncated"),
        (SOURCE.replace("41", "42"), "differs from line 1"),
        ("", "truncated"),
    ],
)
def test_ensure_source_rewrites_altered_file_with_warning(tmp_path, content, reason):
    path = tmp_path / "m.py"
    path.write_text(content)
    with pytest.warns(CodeCacheWarning, match=reason) as rec:
        assert ensure_source(path, SOURCE) is True
    assert str(path) in str(rec[0].message)
    assert path.read_text() == SOURCE


def test_load_generated_does_not_run_appended_line_and_restores_file(tmp_path):
    mod = load_generated(SOURCE, tmp_path, "gen_t")
    assert mod.answer() == 42 and Path(mod.__file__).read_text() == SOURCE
    marker = tmp_path / "marker"
    path = Path(mod.__file__)
    path.write_text(SOURCE + _marker_line(marker) + TAMPER)
    with pytest.warns(CodeCacheWarning, match=str(path.name)):
        again = load_generated(SOURCE, tmp_path, "gen_t")  # SystemExit would escape here
    assert again.answer() == 42
    assert not marker.exists()
    assert path.read_text() == SOURCE


def test_load_generated_runs_the_generated_text_not_the_file(tmp_path, monkeypatch):
    """Even a file changed between the check and the import cannot run."""
    marker = tmp_path / "marker"
    real_ensure = codecache.ensure_source

    def ensure_then_tamper(path, source):
        changed = real_ensure(path, source)
        Path(path).write_text(source + _marker_line(marker))
        return changed

    monkeypatch.setattr(codecache, "ensure_source", ensure_then_tamper)
    mod = load_generated(SOURCE, tmp_path, "gen_race")
    assert mod.answer() == 42 and not marker.exists()


def test_load_generated_writes_no_bytecode(tmp_path):
    load_generated(SOURCE, tmp_path, "gen_pyc")
    assert not list(tmp_path.rglob("*.pyc"))


# ---------------------------------------------------- cache folders under one root


def test_cache_folders_live_under_the_cache_root(monkeypatch, tmp_path):
    from hpcnb.commprof.instrument import _cache_dir
    from hpcnb.winograd.codegen import kernel_cache_dir
    from hpcnb.winograd.wisdom import wisdom_path

    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    monkeypatch.delenv("HPCNB_WISDOM", raising=False)
    monkeypatch.setenv("HPCNB_CACHE_DIR", str(tmp_path / "legacy"))  # not a cache variable
    monkeypatch.setenv("HPCNB_COMMPROF_CACHE", str(tmp_path / "legacy"))
    assert _cache_dir() == tmp_path / "commprof"
    assert kernel_cache_dir() == tmp_path
    assert wisdom_path() == tmp_path / "winograd_wisdom.json"


# --------------------------------------- numba cache=True on verified generated files

NUMBA_SCRIPT = numba_script("gen_numba")


def test_numba_cache_survives_verification_and_tampering(tmp_path):
    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", NUMBA_SCRIPT, str(tmp_path), NUMBA_SOURCE],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(tmp_path),
        )

    first, second = run(), run()
    assert first.returncode == 0, first.stderr
    assert "hits 0" in first.stdout and "hits 1" in second.stdout  # cache=True applies
    path = generated_path(tmp_path, "gen_numba", NUMBA_SOURCE)
    marker = tmp_path / "marker"
    path.write_text(NUMBA_SOURCE + _marker_line(marker) + TAMPER)
    third = run()
    assert third.returncode == 0, third.stderr
    assert "CodeCacheWarning" in third.stderr and path.name in third.stderr
    # exit status 0: the appended SystemExit('tampered') did not run
    assert not marker.exists() and path.read_text() == NUMBA_SOURCE


# ----------------------------------------------------------- commprof kernel cache

KERNEL_MODULE = textwrap.dedent(
    """
    from hpcnb import commprof


    @commprof.kernel
    def shift(tid, nthreads, phase, a, b):
        if phase == 0:
            a[tid] = tid + 1.0
        else:
            b[tid] = a[(tid + 1) % nthreads]
    """
)

KERNEL_SCRIPT = textwrap.dedent(
    """
    import sys
    import warnings
    warnings.simplefilter("always")
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from hpcnb import commprof
    from cc_kernels import shift
    a, b = np.zeros(3), np.zeros(3)
    commprof.profile(shift, [a, b], nthreads=3, nphases=2)
    assert b.tolist() == [2.0, 3.0, 1.0], b
    print("file", shift.compiled().__file__)
    """
)


def test_commprof_tampered_cache_file_is_regenerated_in_next_process(tmp_path):
    (tmp_path / "cc_kernels.py").write_text(KERNEL_MODULE)
    cache = tmp_path / "cache"

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", KERNEL_SCRIPT, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
            env=_env(cache),
        )

    first = run()
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.split("file ", 1)[1].strip())
    assert path.parent == cache / "commprof" and path.name.startswith("cp_shift_")
    good = path.read_text()
    marker = tmp_path / "marker"
    path.write_text(good + _marker_line(marker) + TAMPER)  # what a shared cache allows
    second = run()
    assert second.returncode == 0, second.stderr
    assert "CodeCacheWarning" in second.stderr and str(path) in second.stderr
    assert not marker.exists()
    assert path.read_text() == good


def _ring(tid, nthreads, phase, a):
    a[tid] = a[(tid + 1) % nthreads] + 1.0


def test_commprof_kernel_in_process_tamper(tmp_path, monkeypatch):
    from hpcnb.commprof.instrument import Kernel

    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    fresh = Kernel(_ring)
    mod = fresh.compiled()
    path = Path(mod.__file__)
    assert path.parent == tmp_path / "commprof"
    path.write_text(path.read_text() + TAMPER)
    with pytest.warns(CodeCacheWarning, match="appended"):
        again = Kernel(_ring).compiled()  # a new Kernel loads again, as a new process would
    assert hasattr(again, "drive_native") and path.read_text() == fresh._module_source


# ------------------------------------------------------------ Winograd kernel cache


def test_winograd_tampered_kernel_file_is_regenerated(tmp_path, monkeypatch):
    from hpcnb.winograd import codegen
    from hpcnb.winograd.conv import conv2d_direct, conv2d_winograd

    monkeypatch.setenv("HPCNB_CACHE", str(tmp_path))
    monkeypatch.setattr(codegen, "_LOADED", {})
    mod = codegen.cpu_kernels(2, 3)
    path = Path(mod.__file__)
    assert path.parent == tmp_path / "winograd" / "generated"
    marker = tmp_path / "marker"
    path.write_text(mod.SOURCE + _marker_line(marker) + TAMPER)
    monkeypatch.setattr(codegen, "_LOADED", {})  # as in a new process
    monkeypatch.setattr(codegen, "_KERNELS", {})
    with pytest.warns(CodeCacheWarning, match=path.name):
        again = codegen.cpu_kernels(2, 3)
    assert not marker.exists() and path.read_text() == again.SOURCE
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 7, 7)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    y = conv2d_winograd(x, w, padding=1, m=2)
    np.testing.assert_allclose(y, conv2d_direct(x, w, padding=1), atol=1e-4)
