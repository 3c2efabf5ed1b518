"""Generated-code caches that survive damaged Numba cache files and unwritable folders.

A Numba cache entry (``__pycache__/*.nbi`` index, ``*.nbc`` data) that does not load is
dropped with one CodeCacheWarning naming the files, and the function is compiled again;
a cache folder that cannot be written makes the generated modules run from a private
temporary folder, with one warning naming the folder; cache writes use private
temporary names, so processes generating the same module at once all succeed.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from _numbagen import NUMBA_SOURCE, numba_script

from hpcnb import codecache
from hpcnb.codecache import (
    CodeCacheWarning,
    atomic_write,
    generated_path,
    guard_numba_cache,
    load_generated,
)

REPO = Path(__file__).resolve().parents[1]

NUMBA_SCRIPT = numba_script("gen_corrupt")

WINOGRAD_SCRIPT = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("always")
    import numpy as np
    import torch
    from hpcnb.winograd.conv import conv2d_winograd
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((1, 2, 7, 7)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((3, 2, 3, 3)).astype(np.float32))
    y = conv2d_winograd(x, w, padding=1, m=2)
    ref = torch.nn.functional.conv2d(x, w, padding=1)
    assert torch.allclose(y, ref, atol=1e-4), float((y - ref).abs().max())
    print("ok")
    """
)


def _env(cache: Path) -> dict[str, str]:
    drop = ("NUMBA_CACHE_DIR",)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["HPCNB_CACHE"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _run(args: list[str], cache: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(cache),
    )


def _run_numba(folder: Path) -> subprocess.CompletedProcess:
    return _run([NUMBA_SCRIPT, str(folder), NUMBA_SOURCE], folder)


def _flip_middle(data: bytes) -> bytes:
    raw = bytearray(data)
    start = len(raw) // 3
    for i in range(start, min(start + 200, len(raw))):
        raw[i] ^= 0xFF
    return bytes(raw)


CORRUPTIONS = {
    "truncated": lambda data: data[: len(data) // 2],
    "garbage": lambda data: b"garbage\n",
    "empty": lambda data: b"",
    "bits_flipped": _flip_middle,
}


@pytest.fixture(scope="module")
def warm_numba_cache(tmp_path_factory) -> Path:
    """A cache folder holding the generated module and its Numba cache (one hit shown)."""
    folder = tmp_path_factory.mktemp("warm")
    first, second = _run_numba(folder), _run_numba(folder)
    assert first.returncode == 0, first.stderr
    assert "hits 0" in first.stdout and "hits 1" in second.stdout, second.stdout
    return folder


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which folders were warned about, as in a new process."""
    monkeypatch.setattr(codecache, "_WARNED_FOLDERS", set())


def _cache_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CodeCacheWarning)]


# -------------------------------------------------- damaged Numba cache files: issue 1


@pytest.mark.parametrize("kind", ["nbi", "nbc"])
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_damaged_numba_cache_file_is_dropped_and_rebuilt(
    warm_numba_cache, tmp_path, kind, corruption
):
    folder = tmp_path / "cache"
    shutil.copytree(warm_numba_cache, folder)
    (damaged,) = (folder / "__pycache__").glob(f"gen_corrupt_*.twice-*.{kind}")
    damaged.write_bytes(CORRUPTIONS[corruption](damaged.read_bytes()))

    after = _run_numba(folder)  # a fresh process, as every later run would be
    assert after.returncode == 0, after.stderr
    assert "hits 0" in after.stdout  # compiled again, not loaded
    assert after.stderr.count("CodeCacheWarning") == 1, after.stderr
    assert str(damaged) in after.stderr and "could not be loaded" in after.stderr

    again = _run_numba(folder)  # the rebuilt cache is used without a warning
    assert again.returncode == 0, again.stderr
    assert "hits 1" in again.stdout and "CodeCacheWarning" not in again.stderr


def test_damaged_nested_winograd_caches_do_not_stop_the_convolution(tmp_path):
    cache = tmp_path / "cache"
    first = _run([WINOGRAD_SCRIPT], cache)
    assert first.returncode == 0, first.stderr
    pycache = cache / "winograd" / "generated" / "__pycache__"
    # ``gather`` is compiled while the fused driver is typed: a load nested in a compile
    damaged = sorted(pycache.glob("*.gather-*.nbi")) + sorted(pycache.glob("*.fused_*.nbc"))
    assert any(".gather-" in p.name for p in damaged)
    assert any(".fused_" in p.name for p in damaged)
    for path in damaged:
        path.write_bytes(b"\x80\x05junk" + path.read_bytes()[:40])

    second = _run([WINOGRAD_SCRIPT], cache)
    assert second.returncode == 0, second.stderr
    assert "ok" in second.stdout
    assert second.stderr.count("CodeCacheWarning") == len(damaged), second.stderr
    for path in damaged:
        assert str(path) in second.stderr


def test_cache_files_that_cannot_be_removed_switch_the_cache_off(
    tmp_path, monkeypatch, fresh_warnings
):
    mod = load_generated(NUMBA_SOURCE, tmp_path, "gen_stuck")
    assert mod.twice(4) == 8  # writes the cache
    (index,) = Path(mod.twice.stats.cache_path).glob("gen_stuck_*.twice-*.nbi")
    index.write_bytes(b"garbage\n")
    real_unlink = Path.unlink

    def refuse(self: Path, missing_ok: bool = False) -> None:
        if self.suffix in (".nbi", ".nbc"):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    again = load_generated(NUMBA_SOURCE, tmp_path, "gen_stuck")  # new dispatchers
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert again.twice(5) == 10 and again.twice(2.5) == 5.0
    (message,) = _cache_warnings(record)
    assert "could not remove" in message and str(index) in message
    assert index.read_bytes() == b"garbage\n"  # the cache is off: nothing written over it


def test_guard_finds_cached_dispatchers_once(tmp_path):
    namespace: dict = {"__file__": str(tmp_path / "guarded.py")}
    (tmp_path / "guarded.py").write_text(NUMBA_SOURCE)
    exec(compile(NUMBA_SOURCE, str(tmp_path / "guarded.py"), "exec"), namespace)
    assert guard_numba_cache(namespace) == ["twice"]
    assert guard_numba_cache(namespace) == []  # installed once
    assert guard_numba_cache({"x": 1, "np": np}) == []


# -------------------------------------------------- unwritable cache folders: issue 2


def _blocked(tmp_path: Path) -> Path:
    """A cache root below a regular file: no one, root included, can create it."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file\n")
    return blocker / "cache"


def test_winograd_conv_computes_when_the_cache_cannot_be_written(
    tmp_path, monkeypatch, fresh_warnings
):
    torch = pytest.importorskip("torch")
    from hpcnb.winograd import codegen
    from hpcnb.winograd.conv import conv2d_winograd

    root = _blocked(tmp_path)
    monkeypatch.setenv("HPCNB_CACHE", str(root))
    monkeypatch.setattr(codegen, "_LOADED", {})
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((2, 3, 9, 8)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        y = conv2d_winograd(x, w, padding=1, m=2)
    torch.testing.assert_close(y, torch.nn.functional.conv2d(x, w, padding=1), atol=1e-4, rtol=0)
    (message,) = _cache_warnings(record)
    assert str(root / "winograd" / "generated") in message and "temporary folder" in message
    files = [Path(m.__file__) for m in codegen._LOADED.values()]
    assert files and all(f.is_file() and not f.is_relative_to(tmp_path) for f in files)


def test_commprof_kernel_runs_when_the_cache_cannot_be_written(
    tmp_path, monkeypatch, fresh_warnings
):
    from hpcnb import commprof
    from hpcnb.commprof.instrument import Kernel

    root = _blocked(tmp_path)
    monkeypatch.setenv("HPCNB_CACHE", str(root))
    kernel = Kernel(_shift)
    a, b = np.zeros(3), np.zeros(3)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        commprof.profile(kernel, [a, b], nthreads=3, nphases=2)
    assert b.tolist() == [2.0, 3.0, 1.0]
    (message,) = _cache_warnings(record)
    assert str(root / "commprof") in message and "temporary folder" in message


def _shift(tid, nthreads, phase, a, b):
    if phase == 0:
        a[tid] = tid + 1.0
    else:
        b[tid] = a[(tid + 1) % nthreads]


def test_unwritable_pycache_falls_back_with_one_warning(tmp_path, fresh_warnings):
    (tmp_path / "__pycache__").write_text("not a folder\n")  # Numba could not cache here
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = load_generated(NUMBA_SOURCE, tmp_path, "gen_ro")
        second = load_generated(NUMBA_SOURCE + "\n", tmp_path, "gen_ro")
        assert first.twice(21) == 42 and second.twice(1) == 2
    (message,) = _cache_warnings(record)  # once per folder
    assert str(tmp_path) in message
    assert Path(first.__file__).parent == codecache._private_folder()
    assert Path(first.__file__).read_text() == NUMBA_SOURCE


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root writes into a folder without write permission; the regular-file "
    "parent tests cover that case for every user",
)
def test_read_only_folder_falls_back(tmp_path, fresh_warnings):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.warns(CodeCacheWarning, match="cannot be written"):
            mod = load_generated(NUMBA_SOURCE, folder, "gen_ro")
        assert mod.twice(3) == 6 and not any(folder.iterdir())
    finally:
        folder.chmod(0o700)


def test_full_disk_on_numba_cache_write_is_skipped(tmp_path, monkeypatch, fresh_warnings):
    from numba.core import caching

    def full(self, name, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(caching.IndexDataCacheFile, "_save_data", full)
    mod = load_generated(NUMBA_SOURCE, tmp_path, "gen_full")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert mod.twice(7) == 14 and mod.twice(1.5) == 3.0
    (message,) = _cache_warnings(record)
    assert str(tmp_path / "__pycache__") in message and "No space left" in message
    assert not list((tmp_path / "__pycache__").glob("*.nbc"))


def test_no_writable_folder_at_all_names_both(tmp_path, monkeypatch, fresh_warnings):
    def no_temp(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(codecache, "_PRIVATE_FOLDER", None)
    monkeypatch.setattr(codecache.tempfile, "mkdtemp", no_temp)
    with pytest.warns(CodeCacheWarning), pytest.raises(OSError, match="temporary folder"):
        load_generated(NUMBA_SOURCE, _blocked(tmp_path), "gen_none")


# ------------------------------------------------ atomic writes, concurrent writers: 3


def test_atomic_write_uses_a_private_temporary_name_in_the_same_folder(tmp_path, monkeypatch):
    seen: list[Path] = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(Path(src))
        assert Path(src).stat().st_mode & 0o077 == 0  # private until renamed
        real_replace(src, dst)

    monkeypatch.setattr(codecache.os, "replace", spy)
    target = tmp_path / "mod.py"
    atomic_write(target, "a = 1\n")
    atomic_write(target, "a = 2\n")
    assert target.read_text() == "a = 2\n"
    assert len(seen) == 2 and seen[0] != seen[1]  # a new name each time, never a fixed one
    assert all(p.parent == tmp_path and p.name.startswith(".mod.py.") for p in seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mod.py"]


CONCURRENT_SCRIPT = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path
    from hpcnb.codecache import load_generated
    folder, go = sys.argv[1], Path(sys.argv[2])
    sources = [sys.argv[3].replace("2 * x", f"{k} * x") for k in range(2, 8)]
    plain = [f"VALUE = {k}\\n" + "# padding\\n" * 2000 for k in range(40)]
    while not go.exists():
        time.sleep(0.005)
    for k, src in enumerate(plain):
        assert load_generated(src, folder, "gen_plain").VALUE == k
    for k, src in enumerate(sources, start=2):
        assert load_generated(src, folder, "gen_race").twice(3) == 3 * k
    print("done")
    """
)


def test_two_processes_generating_the_same_modules_both_succeed(tmp_path):
    folder, go = tmp_path / "shared", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_SCRIPT, str(folder), str(go), NUMBA_SOURCE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(tmp_path / "root"),
        )
        for _ in range(2)
    ]
    time.sleep(1.0)  # both importing; they start writing together
    go.touch()
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert "done" in out and "CodeCacheWarning" not in err, err
    names = [p.name for p in folder.rglob("*")]
    assert not [n for n in names if n.endswith(".tmp") or ".tmp." in n], names
    src = NUMBA_SOURCE.replace("2 * x", "5 * x")
    assert generated_path(folder, "gen_race", src).read_text() == src
    assert len(list(folder.glob("gen_plain_*.py"))) == 40
