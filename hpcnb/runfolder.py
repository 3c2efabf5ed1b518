"""Run folders: one writer at a time, atomic JSON files, inputs fingerprints for re-use.

A run folder (``papermill_runs/<UTC timestamp>`` by default) holds the executed notebooks
and ``records.json``, ``records_detail.json``, ``claims.json`` and ``run.json``. Rules:

* a run starts only in an empty or absent folder, unless it *resumes* that run;
* a lock file (``.hpcnb-run.lock``, an advisory ``flock``) keeps a second writer out with a
  clear message; the lock ends with the process, so a crashed run never blocks a folder;
* each JSON file is written to a temporary file and moved into place (``os.replace``),
  with ``allow_nan=False``, so readers never see half a file;
* ``run.json`` stores the executed notebook's path relative to the folder, so a moved or
  copied folder still reports correctly.

The *inputs fingerprint* of a notebook run (:func:`inputs_key`) hashes what decides its
results: its code cells, its effective parameters, the installed package sources and data,
the lock file of pinned dependencies, the machine (CPU model and core count) and the
*measurement environment* (:func:`measurement_environment`). A later run with the same
fingerprint, and whose logged real-data lookups still give the same files, may re-use the
earlier result (see :func:`find_cached`); a change of any of them means a new run.

The measurement environment is every variable of :data:`MEASUREMENT_ENV` (set or unset),
every ``HPCNB_*`` setting except those in :data:`NEUTRAL_HPCNB_ENV`, and the BLAS and
OpenMP libraries a fresh Python process actually loads with NumPy and PyTorch, as
threadpoolctl reports them (internal API, version, architecture, threads, threading
layer):

===========================  =============================================================
variable                     why it changes a measurement
===========================  =============================================================
``OMP_NUM_THREADS``          OpenMP threads of torch, oneDNN and OpenMP-built BLAS
``MKL_NUM_THREADS``          threads of MKL
``OPENBLAS_NUM_THREADS``     threads of OpenBLAS
``NUMBA_NUM_THREADS``        size of Numba's parallel thread pool
``NUMBA_THREADING_LAYER``    Numba's threading back-end (omp, tbb, workqueue)
``OPENBLAS_CORETYPE``        which OpenBLAS kernels run (e.g. Haswell vs SkylakeX)
``OPENBLAS_L2_SIZE``         OpenBLAS's blocking
``MKL_ENABLE_INSTRUCTIONS``  which MKL kernels run
``ONEDNN_MAX_CPU_ISA``       which oneDNN kernels run (``DNNL_MAX_CPU_ISA`` too)
``ATEN_CPU_CAPABILITY``      which vectorised ATen kernels run
``NUMBA_OPT``                Numba's optimisation level (``NUMBA_CPU_NAME``,
                             ``NUMBA_CPU_FEATURES``, ``NUMBA_DISABLE_JIT`` too)
``OMP_PROC_BIND``            thread pinning (``OMP_PLACES``, ``GOMP_CPU_AFFINITY``,
                             ``KMP_AFFINITY`` too)
``PYTHONHASHSEED``           hash order of sets and dicts of strings
``HPCNB_*``                  the project's own settings: cache roots hold measured data
                             sets, trained drafts and tuning wisdom
===========================  =============================================================

``HPCNB_DATA`` is left out of the fingerprint because every real-data lookup is logged
with the file's hash and checked on re-use, so another data folder with the same files
gives the same results and one with other files is a new run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcnb.cachefile import write_private_atomic
from hpcnb.errors import HpcnbError

__all__ = [
    "LOCK_NAME",
    "MEASUREMENT_ENV",
    "NEUTRAL_HPCNB_ENV",
    "RUN_FILES",
    "RunFolderError",
    "data_states_match",
    "find_cached",
    "held_lock_fd",
    "inputs_key",
    "inputs_parts",
    "key_of",
    "locked_run_folder",
    "measurement_environment",
    "package_digest",
    "read_run_tables",
    "unique_run_folder",
    "validate_run_entry",
    "write_json_atomic",
]

LOCK_NAME = ".hpcnb-run.lock"
RUN_FILES = ("records.json", "records_detail.json", "claims.json", "run.json")
#: Environment variables that change what a notebook measures (see the module's table).
MEASUREMENT_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "NUMBA_THREADING_LAYER",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "NUMBA_OPT",
    "NUMBA_CPU_NAME",
    "NUMBA_CPU_FEATURES",
    "NUMBA_DISABLE_JIT",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "GOMP_CPU_AFFINITY",
    "KMP_AFFINITY",
    "PYTHONHASHSEED",
)
#: ``HPCNB_*`` variables that do not change results: paths checked by hash (data files;
#: the notebooks folder, whose code cells are hashed), the runner's own plumbing, progress
#: display and test switches.
NEUTRAL_HPCNB_ENV = (
    "HPCNB_DATA",
    "HPCNB_DATA_MIRROR",
    "HPCNB_NOTEBOOKS",
    "HPCNB_DATA_LOG",
    "HPCNB_BATCH",
    "HPCNB_PROGRESS",
    "HPCNB_HISTORY",
    "HPCNB_SMOKE_RUN",
    "HPCNB_LAUNCH_TOKEN",
    "HPCNB_SWEEP_TOKEN",
    "HPCNB_SMOKE_TIMEOUT",
    "HPCNB_FULL",
    "HPCNB_CHROMIUM",
)
_THREADPOOLS_SCRIPT = """
import json
import numpy
try:
    import torch  # noqa: F401 (loads its OpenMP runtime)
except Exception:
    pass
from threadpoolctl import threadpool_info
keys = ("internal_api", "version", "architecture", "num_threads", "threading_layer")
print(json.dumps([{k: str(d.get(k)) for k in keys if d.get(k) is not None}
                  for d in threadpool_info()]))
"""


class RunFolderError(HpcnbError):
    """A run folder cannot be used: not empty, in use, not a folder, or corrupt."""


@contextlib.contextmanager
def locked_run_folder(out: str | Path, *, resume: bool = False) -> Iterator[Path]:
    """Create (or, with ``resume``, reopen) a run folder and hold its lock.

    Args:
        out: The run folder.
        resume: Reopen a folder that holds an earlier run instead of refusing it.

    Raises:
        RunFolderError: ``out`` is a file, is not empty (without ``resume``), or another
            process holds the lock.
    """
    import fcntl

    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise RunFolderError(f"--out {out}: is a symbolic link to nothing ({os.readlink(out)})")
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {out}: exists and is not a folder")
    try:
        if out.is_dir() and not resume and any(p.name != LOCK_NAME for p in out.iterdir()):
            raise RunFolderError(
                f"--out {out}: folder is not empty; give an empty or new folder, or --resume "
                "to continue the run that is there"
            )
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RunFolderError(f"--out {out}: cannot be used ({_os_reason(exc)})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            raise RunFolderError(
                f"--out {out}: in use by another hpcnb run (pid {holder}); wait for it or "
                "choose another folder"
            ) from None
        with contextlib.suppress(OSError):  # the pid is a courtesy: a full disk may refuse it
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        _HELD_LOCKS[str(out.resolve())] = fd
        yield out
    finally:
        _HELD_LOCKS.pop(str(out.resolve()), None)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_HELD_LOCKS: dict[str, int] = {}


def held_lock_fd(folder: str | Path) -> int | None:
    """Return the descriptor of the lock this process holds on ``folder``, if any.

    The runner hands it to the watchdog of each notebook's processes
    (:class:`hpcnb.launch.ProcessTree`), so the folder stays locked while anything the
    run started is still alive, even after the run itself was killed.
    """
    return _HELD_LOCKS.get(str(Path(folder).resolve()))


def _os_reason(exc: OSError) -> str:
    """One line for an operating-system error: its text and the file it names."""
    reason = exc.strerror or str(exc)
    return f"{reason}: {exc.filename}" if exc.filename else reason


def unique_run_folder(root: str | Path, stem: str) -> Path:
    """Create and return a new empty folder ``root/stem`` (``stem-2``, ``-3``... if taken).

    The folder is created with an exclusive ``mkdir``, so two runs started in the same
    second get two folders.

    Args:
        root: The folder of run folders (created if missing).
        stem: The wanted name, usually a UTC timestamp.

    Raises:
        RunFolderError: ``root`` cannot be created or written.
    """
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, 10_000):
            folder = root / (stem if n == 1 else f"{stem}-{n}")
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            return folder
    except OSError as exc:
        raise RunFolderError(f"{root}: cannot create a run folder ({_os_reason(exc)})") from None
    raise RunFolderError(f"{root}: 10000 run folders named {stem}*; choose --out")


def write_json_atomic(path: Path, data: Any, *, indent: int = 2, sort_keys: bool = True) -> None:
    """Write ``data`` as strict JSON to ``path`` through a private temporary file and a rename.

    (:func:`hpcnb.cachefile.write_private_atomic`: a unique temporary name, so two writers
    never share one; flushed to disk before the rename.)

    Args:
        path: The file to write.
        data: JSON-serialisable data.
        indent: Indentation of the JSON text.
        sort_keys: Sort the keys of every mapping.

    Raises:
        ValueError: ``data`` holds NaN or infinity.
    """
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, allow_nan=False) + "\n"
    write_private_atomic(path, text)


def read_run_tables(out: str | Path) -> dict[str, dict[str, Any]]:
    """Read the JSON files of a run folder (``{}`` for absent ones).

    Raises:
        RunFolderError: A file is not valid JSON or not a mapping; the message names it.
    """
    out = Path(out)
    tables: dict[str, dict[str, Any]] = {}
    for name in RUN_FILES:
        path = out / name
        if not path.exists():
            tables[name] = {}
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RunFolderError(f"{path}: unreadable ({exc}); move it away to continue") from exc
        if not isinstance(data, dict):
            raise RunFolderError(f"{path}: expected a JSON object, found {type(data).__name__}")
        if name == "run.json":
            for stem, entry in data.items():
                validate_run_entry(entry, f"{path}: entry {stem!r}")
        tables[name] = data
    return tables


#: Fields of a ``run.json`` entry and the JSON types each may have.
_RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "status": (str,),
    "seconds": (int, float),
    "output": (str,),
    "error": (str,),
    "cell": (int, type(None)),
    "parameters": (dict,),
    "inputs_key": (str,),
    "data": (dict,),
    "cached_from": (str,),
    "machine": (str,),
    "environment": (dict,),
    "inputs": (dict,),
    "notebook": (str,),
}
_STATUSES = ("ok", "failed", "timeout", "interrupted")


def validate_run_entry(entry: Any, where: str) -> None:
    """Check one ``run.json`` entry: a mapping with a known status and well-typed fields.

    Args:
        entry: The entry read from ``run.json``.
        where: The file and entry, for messages.

    Raises:
        RunFolderError: Naming ``where`` and the field that is wrong.
    """
    if not isinstance(entry, dict):
        raise RunFolderError(f"{where}: expected a JSON object, found {type(entry).__name__}")
    if entry.get("status") not in _STATUSES:
        raise RunFolderError(
            f"{where}: status {entry.get('status')!r} is not one of {', '.join(_STATUSES)}"
        )
    for field, types in _RUN_FIELDS.items():
        if field in entry and (
            not isinstance(entry[field], types) or isinstance(entry[field], bool)
        ):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RunFolderError(
                f"{where}: field {field!r} is {type(entry[field]).__name__}, expected {wanted}"
            )
    output = entry.get("output", "")
    if output and (Path(output).name != output or output in {".", ".."}):
        raise RunFolderError(f"{where}: output {output!r} is not a file name in the folder")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _code_digest(notebook: Path) -> str:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    code = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            code.append("".join(src) if isinstance(src, list) else src)
    return _sha("\n\x00\n".join(code).encode())


@lru_cache(maxsize=1)
def package_digest() -> str:
    """Return a hash of the installed ``hpcnb`` package: every source and data file."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(path.relative_to(root).as_posix().encode() + b"\x00")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _lock_digest() -> str:
    for folder in (Path.cwd(), Path(__file__).resolve().parents[1]):
        lock = folder / "requirements.lock"
        if lock.is_file():
            return _sha(lock.read_bytes())
    return ""


def _environment_variables(env: Mapping[str, str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {name: env.get(name) for name in MEASUREMENT_ENV}
    for name in sorted(env):
        if name.startswith("HPCNB_") and name not in NEUTRAL_HPCNB_ENV:
            out[name] = env[name]
    return out


@lru_cache(maxsize=8)
def _threadpools(frozen_env: tuple[tuple[str, str], ...]) -> tuple[dict[str, str], ...]:
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-c", _THREADPOOLS_SCRIPT],
            env=dict(frozen_env),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        pools = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return ({"error": f"threadpoolctl probe failed: {type(exc).__name__}"},)
    found = [dict(p) for p in pools if isinstance(p, dict)]
    return tuple(sorted(found, key=lambda p: json.dumps(p, sort_keys=True)))  # load order varies


def measurement_environment(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return the environment that changes what a notebook measures.

    The variables of :data:`MEASUREMENT_ENV` (``None`` when unset), the ``HPCNB_*``
    settings other than :data:`NEUTRAL_HPCNB_ENV`, and under ``"threadpools"`` the BLAS and
    OpenMP libraries that a fresh Python process with this environment loads with NumPy
    and PyTorch (threadpoolctl's internal API, version, architecture, thread count and
    threading layer). The probe runs once per distinct environment in a process.

    Args:
        env: The environment the notebook's kernel gets (default: this process's).
    """
    env = dict(os.environ if env is None else env)
    out: dict[str, Any] = _environment_variables(env)
    out["threadpools"] = [dict(p) for p in _threadpools(tuple(sorted(env.items())))]
    return out


def inputs_parts(
    notebook: str | Path,
    parameters: Mapping[str, Any],
    environment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return what the inputs fingerprint hashes, part by part (kept in ``run.json``).

    Args:
        notebook: The notebook.
        parameters: Its effective parameters.
        environment: The measurement environment (default:
            :func:`measurement_environment` of this process).

    Returns:
        ``{"code", "parameters", "package", "lock", "machine", "environment"}``: digests
        of the code cells, installed package and lock file, the parameters as sorted JSON,
        the machine key and the environment mapping.
    """
    from hpcnb.paths import machine_key

    return {
        "code": _code_digest(Path(notebook)),
        "parameters": json.dumps(dict(parameters), sort_keys=True, default=str),
        "package": package_digest(),
        "lock": _lock_digest(),
        "machine": machine_key(),
        "environment": dict(measurement_environment() if environment is None else environment),
    }


def key_of(parts: Mapping[str, Any]) -> str:
    """Return the inputs fingerprint of :func:`inputs_parts`."""
    return _sha(json.dumps(dict(parts), sort_keys=True, default=str).encode())


def inputs_key(
    notebook: str | Path,
    parameters: Mapping[str, Any],
    environment: Mapping[str, Any] | None = None,
) -> str:
    """Return the inputs fingerprint of running ``notebook`` with ``parameters``.

    Args:
        notebook: The notebook.
        parameters: Its effective parameters.
        environment: The measurement environment (default:
            :func:`measurement_environment` of this process).
    """
    return key_of(inputs_parts(notebook, parameters, environment))


def data_states_match(logged: Mapping[str, str]) -> bool:
    """Whether every real-data lookup logged by a run would give the same file today."""
    from hpcnb.data.registry import lookup_state

    return all(lookup_state(name) == state for name, state in logged.items())


def find_cached(
    stem: str, key: str, search_root: Path, exclude: Path | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """Find the newest successful run of ``stem`` with fingerprint ``key`` under a folder.

    Args:
        stem: Notebook stem.
        key: Its inputs fingerprint now.
        search_root: The folder holding earlier run folders (``papermill_runs``).
        exclude: A run folder to skip (the current one).

    Returns:
        ``(run folder, its run.json entry)``, or ``None``.
    """
    if not search_root.is_dir():
        return None
    candidates = []
    for run_json in search_root.glob("*/run.json"):
        folder = run_json.parent
        if exclude is not None and folder.resolve() == exclude.resolve():
            continue
        with contextlib.suppress(OSError):
            candidates.append((run_json.stat().st_mtime, folder))
    for _, folder in sorted(candidates, reverse=True):
        try:
            info = read_run_tables(folder)["run.json"].get(stem)
        except RunFolderError:
            continue
        if not isinstance(info, dict) or info.get("status") != "ok":
            continue
        if info.get("inputs_key") != key:
            continue
        executed = folder / Path(str(info.get("output", ""))).name
        if executed.is_file() and data_states_match(info.get("data") or {}):
            return folder, info
    return None
