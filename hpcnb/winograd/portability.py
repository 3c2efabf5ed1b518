"""One ``F(m, r)`` on every registered target, side by side: sources, resources, correctness, time.

Both functions loop over the registered targets (:func:`~hpcnb.winograd.backend.backends`),
so a target registered by a module of your own appears in them too. With the built-in
targets: Numba CPU (measured), OpenCL C on an OpenCL CPU device such as PoCL (measured
when a device exists), and ``numba.cuda`` (measured on a GPU; without one, compiled to PTX
for several architectures, resources from ``ptxas``, correctness from Numba's CUDA
simulator running the same source, time *modelled*).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcnb.timing import interleaved, ratios
from hpcnb.winograd.backend import Backend, backends, target_options
from hpcnb.winograd.config import WinogradConfig
from hpcnb.winograd.numerics import relative_error

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["portability_table", "source_excerpts"]

Targets = Iterable[str | Backend] | None
Options = Mapping[str, Mapping[str, Any]] | None


def source_excerpts(
    m: int, r: int, k: int = 4, *, targets: Targets = None, options: Options = None
) -> dict[str, str]:
    """First ``k`` lines of the input-transform arithmetic in each target's generated kernels.

    Args:
        m: Outputs per tile.
        r: Filter size.
        k: Lines per excerpt.
        targets: Names, references or Backends (default: every registered target).
        options: Per target name, keyword options of its ``excerpt`` (the ``"cuda"``
            target takes ``archs``, the architectures whose PTX is excerpted; PTX needs
            the CUDA toolkit).

    Returns:
        ``{title: text}`` in the order of the targets; a target may give several texts
        (source and PTX), one without an ``excerpt`` none.
    """
    out: dict[str, str] = {}
    for backend in backends(targets):
        out.update(backend.excerpts(m, r, k, **target_options(options, backend)))
    return out


def _layer(
    r: int, shape: tuple[int, int, int, int], seed: int
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Random data of the square layer ``shape = (N, C, K, H)`` and its float64 reference."""
    import torch
    import torch.nn.functional as F

    N, C, K, H = shape
    pad = (r - 1) // 2
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, H), dtype=np.float32)
    w = rng.standard_normal((K, C, r, r), dtype=np.float32)
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad).numpy()
    return x, w, pad, ref.astype(np.float64)


def _bound(plan: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> Callable[[], np.ndarray]:
    """``plan(x)`` as a call without arguments (for the timing functions)."""
    return lambda: plan(x)


def portability_table(
    m: int,
    r: int,
    shape: tuple[int, int, int, int],
    *,
    threads: int,
    reps: int = 3,
    seed: int = 0,
    targets: Targets = None,
    reference: str = "cpu",
    options: Options = None,
) -> pd.DataFrame:
    """Correctness, resources and time of ``F(m, r)`` on every target for one layer.

    Every target that can run here is prepared once (its plan) with
    ``WinogradConfig(m=m, threads=threads)``, run and compared with ``F.conv2d``, then all
    of them are timed together in ``reps`` interleaved rounds after a warm-up round. A
    target that cannot run gives a "not run" row (no value is made up); a target's
    ``resources`` add its own rows (the ``"cuda"`` target: ptxas resources and a modelled
    time per architecture).

    Args:
        m: Outputs per tile.
        r: Filter size.
        shape: ``(N, C, K, H)`` of a square layer with padding ``(r - 1) // 2``.
        threads: Threads for the Numba CPU kernels (``WinogradConfig.threads``).
        reps: Timed interleaved rounds of the targets that run.
        seed: Seed of the data.
        targets: Names, references or Backends (default: every registered target).
        reference: Target whose per-round times divide the others' (``round_ratios``).
        options: Per target name, keyword options of its ``resources`` (the ``"cuda"``
            target takes ``archs`` and ``sim_error``, the largest relative error of the
            same source in the simulator from
            :func:`~hpcnb.winograd.cuda.validate_in_simulator`).

    Returns:
        ``pandas.DataFrame`` with one row per target and per ``resources`` row: ``target``
        (its label), ``name``, ``compiled``, ``max_rel_error``, ``time_ms``, ``time_kind``
        (measured / modelled / not run / -), ``requirement`` (of a target not run), and
        the columns of ``resources`` rows (``registers``, ``spills``, ``occupancy``).
        ``attrs["measured"]`` names the targets that ran, ``attrs["round_ratios"]`` maps
        each of them but ``reference`` to its per-round time ratios over ``reference``
        (empty when ``reference`` did not run).
    """
    import pandas as pd

    chosen = backends(targets)
    x, w, pad, ref = _layer(r, shape, seed)
    cfg = WinogradConfig(m=m, threads=threads)
    plans = {b.name: b.make_plan(x.shape, w, pad, cfg) for b in chosen if b.available()}
    errors = {name: relative_error(plan(x), ref) for name, plan in plans.items()}
    calls = {name: _bound(plan, x) for name, plan in plans.items()}
    timings = interleaved(calls, repeats=reps, warmup=1) if calls else {}
    rows: list[dict[str, Any]] = []
    for b in chosen:
        if b.name in plans:
            rows.append(
                {
                    "target": b.title,
                    "name": b.name,
                    "compiled": True,
                    "max_rel_error": errors[b.name],
                    "time_ms": 1e3 * timings[b.name].median,
                    "time_kind": "measured",
                }
            )
        else:
            rows.append(
                {
                    "target": b.title,
                    "name": b.name,
                    "compiled": False,
                    "time_kind": "not run",
                    "requirement": b.requirement,
                }
            )
        if b.resources is not None:
            extra = b.resources(m, r, shape, **target_options(options, b))
            rows += [{"name": b.name, **row} for row in extra]
    table = pd.DataFrame(rows)
    for column in ("max_rel_error", "time_ms"):
        if column not in table:
            table[column] = np.nan
    table.attrs["measured"] = tuple(plans)
    table.attrs["round_ratios"] = {
        name: ratios(timings[name], timings[reference])
        for name in plans
        if name != reference and reference in plans
    }
    return table
