"""Multi-node step-time model fitted on measured placements (Pollux artifact format).

The model of one synchronous data-parallel training step on ``p`` replicas spread over
``N`` nodes, each replica with a local batch ``b``::

    T_compute(b)  = c0 + c1 · b
    T_comm(N, p)  = 0                                   if p = 1
                  = a(p) α_intra + b(p) β_intra          if N = 1 (all replicas on one node)
                  = a(p) α_inter + b(p) β_inter          if N > 1
    T_step        = T_compute + T_comm − ω · min(T_compute, T_comm)

``a(p), b(p)`` are the ring (or tree) multipliers of :mod:`hpcnb.perfmodel.allreduce`. The
gradient size ``n`` is folded into ``β`` (``β`` is then *seconds per gradient*) unless the
caller knows it (``gradient_bytes``), in which case ``β`` is seconds per byte. A ring is as
slow as its slowest link, so any placement spanning nodes uses the inter-node pair.

The seven parameters are fitted by bounded least squares on the log of the step
time (a relative error), from ``placements.csv`` only; the fitted model then predicts
``scalability.csv`` — placements on more nodes and replicas than it has seen.

File formats (see ``../shared/data/README.md``):

* ``placements.csv``: ``placement,local_bsz,step_time,sync_time`` where ``placement`` is a
  string of per-node GPU counts (``"4"``: one node with 4 GPUs, ``"2434"``: 4 nodes).
* ``scalability.csv``: ``num_nodes,num_replicas,local_bsz,step_time,sync_time``.

Both are UTF-8 text (a byte-order mark is allowed) of at most :data:`MAX_TABLE_BYTES`
bytes with fields of at most :data:`MAX_FIELD_CHARS` characters; anything else is a
:class:`ScalingDataError` naming the file and line.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from hpcnb.errors import HpcnbError, InvalidStateError
from hpcnb.perfmodel.allreduce import message_terms, overlapped_step
from hpcnb.perfmodel.protocol import PerfmodelError

PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
#: Largest measurement table read (bytes); real tables hold a few hundred short rows.
MAX_TABLE_BYTES = 64 << 20
#: Longest field accepted in a measurement table (characters).
MAX_FIELD_CHARS = 1024

__all__ = [
    "MAX_FIELD_CHARS",
    "MAX_TABLE_BYTES",
    "PLACEMENT_COLUMNS",
    "SCALABILITY_COLUMNS",
    "ScalingDataError",
    "ScalingModel",
    "ScalingParams",
    "ScalingTable",
    "ScalingValidation",
    "extrapolate_nodes",
    "read_placements",
    "read_scalability",
    "validate_scaling",
    "write_synthetic_tables",
]


class ScalingDataError(HpcnbError, ValueError):
    """A measurement table is malformed; the message names the file and row."""


@dataclass(frozen=True)
class ScalingTable:
    """Measured training steps, one entry per row of a table.

    Attributes:
        source: The file the rows came from.
        num_nodes: Nodes used by each row.
        num_replicas: Data-parallel replicas (GPUs) of each row.
        local_bsz: Per-replica batch size.
        step_time: Measured seconds per step.
        sync_time: Measured gradient-synchronisation seconds (as reported).
    """

    source: str
    num_nodes: np.ndarray
    num_replicas: np.ndarray
    local_bsz: np.ndarray
    step_time: np.ndarray
    sync_time: np.ndarray

    def __len__(self) -> int:
        return len(self.step_time)


def _read_text(path: Path, columns: tuple[str, ...]) -> str:
    """The file's text, checked to be bounded, UTF-8 and free of NUL bytes."""
    expected = f"expected a CSV table with columns {','.join(columns)}"
    if not path.is_file():
        raise ScalingDataError(f"{path}: file not found ({expected})")
    try:
        size = path.stat().st_size
        if size > MAX_TABLE_BYTES:
            raise ScalingDataError(
                f"{path}: {size} bytes, over the limit of {MAX_TABLE_BYTES} bytes for a "
                f"measurement table; {expected}"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise ScalingDataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        raise ScalingDataError(
            f"{path}: line {line}: byte 0x{data[start]:02x} is not UTF-8 text (not a "
            f"text file?); {expected}"
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise ScalingDataError(
            f"{path}: line {line}: contains a NUL byte (not a text file?); {expected}"
        )
    return text


def _long_field(path: Path, line: int) -> ScalingDataError:
    return ScalingDataError(
        f"{path}: line {line}: a field longer than {MAX_FIELD_CHARS} characters; "
        "expected short fields (numbers and placements)"
    )


def _open_rows(path: Path, columns: tuple[str, ...]) -> tuple[list[dict[str, str]], list[int]]:
    reader = csv.DictReader(io.StringIO(_read_text(path, columns), newline=""))
    rows, lines = [], []
    try:
        header = reader.fieldnames or []
        if any(len(h) > MAX_FIELD_CHARS for h in header):
            raise _long_field(path, reader.line_num)
        missing = [c for c in columns if c not in header]
        if missing:
            raise ScalingDataError(
                f"{path}: line 1: header {','.join(header) or '(empty)'} lacks column(s) "
                f"{','.join(missing)}; expected {','.join(columns)}"
            )
        for row in reader:
            if None in row or any(row.get(c) is None for c in columns):
                raise ScalingDataError(
                    f"{path}: line {reader.line_num}: expected {len(header)} fields "
                    f"({','.join(header)}), got a row of a different length"
                )
            if any(len(v) > MAX_FIELD_CHARS for v in row.values()):
                raise _long_field(path, reader.line_num)
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as exc:
        line = max(reader.reader.line_num, 1)  # the inner reader's: the failing line
        if "field larger than field limit" in str(exc):
            raise _long_field(path, line) from None
        raise ScalingDataError(f"{path}: line {line}: not a valid CSV row ({exc})") from None
    if not rows:
        raise ScalingDataError(f"{path}: no data rows after the header")
    return rows, lines


def _number(path: Path, line: int, column: str, text: str, *, integer: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    bad = not math.isfinite(value) or value < 0 or (integer and value != int(value))
    if column != "sync_time" and value <= 0:
        bad = True
    if bad:
        kind = "a positive integer" if integer else "a finite positive number"
        if column == "sync_time":
            kind = "a finite number >= 0"
        raise ScalingDataError(f"{path}: line {line}: column {column}={text!r}: expected {kind}")
    return value


def read_placements(path: str | Path) -> ScalingTable:
    """Read a ``placements.csv`` table.

    Args:
        path: The file.

    Raises:
        ScalingDataError: Missing, unreadable, oversized or non-text file, a malformed
            CSV row or over-long field, missing column, a short row, a placement that is
            not a string of digits 1–9, or a non-positive number; the message names file
            and line.
    """
    path = Path(path)
    rows, lines = _open_rows(path, PLACEMENT_COLUMNS)
    nodes, reps, bsz, step, sync = [], [], [], [], []
    for row, line in zip(rows, lines, strict=True):
        placement = row["placement"].strip()
        if not placement or not all(c in "123456789" for c in placement):
            raise ScalingDataError(
                f"{path}: line {line}: column placement={placement!r}: expected a string of "
                "per-node GPU counts, digits 1-9 (e.g. '4', '2434')"
            )
        nodes.append(len(placement))
        reps.append(sum(int(c) for c in placement))
        bsz.append(_number(path, line, "local_bsz", row["local_bsz"], integer=True))
        step.append(_number(path, line, "step_time", row["step_time"]))
        sync.append(_number(path, line, "sync_time", row["sync_time"]))
    return ScalingTable(
        str(path), np.array(nodes), np.array(reps), np.array(bsz), np.array(step), np.array(sync)
    )


def read_scalability(path: str | Path) -> ScalingTable:
    """Read a ``scalability.csv`` table.

    Args:
        path: The file.

    Raises:
        ScalingDataError: Missing, unreadable, oversized or non-text file, a malformed
            CSV row or over-long field, missing column, a short row, non-positive numbers,
            or fewer replicas than nodes; the message names file and line.
    """
    path = Path(path)
    rows, lines = _open_rows(path, SCALABILITY_COLUMNS)
    cols: dict[str, list[float]] = {c: [] for c in SCALABILITY_COLUMNS}
    for row, line in zip(rows, lines, strict=True):
        for c in SCALABILITY_COLUMNS:
            integer = c in ("num_nodes", "num_replicas", "local_bsz")
            cols[c].append(_number(path, line, c, row[c], integer=integer))
        if cols["num_replicas"][-1] < cols["num_nodes"][-1]:
            raise ScalingDataError(
                f"{path}: line {line}: num_replicas={row['num_replicas']} is below "
                f"num_nodes={row['num_nodes']}; expected at least one replica per node"
            )
    return ScalingTable(
        str(path),
        np.array(cols["num_nodes"], dtype=int),
        np.array(cols["num_replicas"], dtype=int),
        np.array(cols["local_bsz"]),
        np.array(cols["step_time"]),
        np.array(cols["sync_time"]),
    )


@dataclass(frozen=True)
class ScalingParams:
    """Parameters of the step-time model (see the module docstring).

    Attributes:
        c0: Fixed compute seconds per step.
        c1: Compute seconds per sample of local batch.
        alpha_intra: Latency per ring step inside a node, seconds.
        beta_intra: Inverse bandwidth inside a node (s per gradient, or s/byte).
        alpha_inter: Latency per ring step across nodes, seconds.
        beta_inter: Inverse bandwidth across nodes (s per gradient, or s/byte).
        overlap: Overlap factor ω in [0, 1].
    """

    c0: float
    c1: float
    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    overlap: float

    def as_array(self) -> np.ndarray:
        """Return the parameters in field order."""
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=float)


class ScalingModel:
    """Step time of data-parallel training vs nodes, replicas and local batch.

    scikit-learn style: :meth:`fit` on a :class:`ScalingTable` (or arrays) returns ``self``;
    :meth:`predict` returns seconds per step.

    Args:
        algorithm: All-reduce algorithm, ``"ring"`` or ``"tree"``.
        gradient_bytes: Bytes of gradient per replica if known (``β`` then in s/byte); with
            ``None`` the gradient size is folded into ``β``.
        fixed_overlap: Hold ω at this value instead of fitting it.
        loss: ``scipy.optimize.least_squares`` loss on the log residuals: ``"linear"``
            (plain least squares, the default) or a robust one such as ``"soft_l1"``.
        f_scale: Residual scale at which the robust loss starts to flatten.

    Raises:
        PerfmodelError: An unknown algorithm, a non-positive gradient size, or an overlap
            outside [0, 1].
    """

    def __init__(
        self,
        algorithm: str = "ring",
        gradient_bytes: float | None = None,
        fixed_overlap: float | None = None,
        loss: str = "linear",
        f_scale: float = 1.0,
    ) -> None:
        message_terms(2, algorithm)  # validates the name
        if gradient_bytes is not None and gradient_bytes <= 0:
            raise PerfmodelError(f"gradient_bytes={gradient_bytes}: expected a positive size")
        if fixed_overlap is not None and not 0.0 <= fixed_overlap <= 1.0:
            raise PerfmodelError(f"fixed_overlap={fixed_overlap}: expected a factor in [0, 1]")
        self.algorithm = algorithm
        self.gradient_bytes = gradient_bytes
        self.fixed_overlap = fixed_overlap
        self.loss = loss
        self.f_scale = f_scale

    def _step(
        self, theta: np.ndarray, nodes: np.ndarray, reps: np.ndarray, bsz: np.ndarray
    ) -> np.ndarray:
        c0, c1, ai, bi, ae, be, omega = theta
        n = 1.0 if self.gradient_bytes is None else float(self.gradient_bytes)
        a, b = message_terms(reps, self.algorithm)
        comm = np.where(nodes > 1, a * ae + b * n * be, a * ai + b * n * bi)
        comm = np.where(reps > 1, comm, 0.0)
        return overlapped_step(c0 + c1 * bsz, comm, float(np.clip(omega, 0.0, 1.0)))

    def fit(
        self,
        table: ScalingTable | None = None,
        *,
        num_nodes: ArrayLike | None = None,
        num_replicas: ArrayLike | None = None,
        local_bsz: ArrayLike | None = None,
        step_time: ArrayLike | None = None,
    ) -> ScalingModel:
        """Fit the seven parameters to measured step times.

        Args:
            table: Measurements (or give the four arrays by keyword).
            num_nodes: Nodes per sample.
            num_replicas: Replicas per sample.
            local_bsz: Local batch per sample.
            step_time: Measured seconds per step.

        Returns:
            ``self``, with ``params_`` and ``train_mape_`` set.

        Raises:
            PerfmodelError: Fewer than 7 samples or no multi-replica sample.
        """
        from scipy.optimize import least_squares

        if table is not None:
            num_nodes, num_replicas = table.num_nodes, table.num_replicas
            local_bsz, step_time = table.local_bsz, table.step_time
        nodes = np.asarray(num_nodes, dtype=float)
        reps = np.asarray(num_replicas, dtype=float)
        bsz = np.asarray(local_bsz, dtype=float)
        t = np.asarray(step_time, dtype=float)
        if len(t) < 7:
            raise PerfmodelError(
                f"need at least 7 measured steps to fit 7 parameters, got {len(t)}"
            )
        if not np.any(reps > 1):
            raise PerfmodelError("no sample with more than one replica: communication unobservable")
        n = 1.0 if self.gradient_bytes is None else float(self.gradient_bytes)
        # Initial guess: compute line from single-replica rows (or all rows), comm from the rest.
        single = reps == 1 if np.sum(reps == 1) >= 2 else np.ones_like(t, dtype=bool)
        c1, c0 = np.polyfit(bsz[single], t[single], 1) if np.ptp(bsz[single]) > 0 else (0, 0)
        c0, c1 = max(float(c0), 1e-3 * t.min()), max(float(c1), 1e-9)
        excess = np.maximum(t - (c0 + c1 * bsz), 1e-3 * t.min())
        a, b = message_terms(reps, self.algorithm)
        multi = reps > 1
        scale_a = float(np.median(excess[multi] / (a[multi] + b[multi])))
        lower = np.zeros(7)
        upper = np.array([np.inf] * 6 + [1.0])
        if self.fixed_overlap is not None:
            lower[6] = self.fixed_overlap
            upper[6] = self.fixed_overlap + 1e-12
        log_t = np.log(t)
        best = None
        for omega in (0.0, 0.5, 0.9) if self.fixed_overlap is None else (self.fixed_overlap,):
            x0 = np.array([c0, c1, scale_a / 2, scale_a / n, scale_a / 2, scale_a / n, omega])
            x0 = np.clip(x0, lower, upper)

            def residual(theta: np.ndarray) -> np.ndarray:
                pred = self._step(theta, nodes, reps, bsz)
                return np.log(np.maximum(pred, 1e-300)) - log_t

            sol = least_squares(
                residual,
                x0,
                bounds=(lower, upper),
                loss=self.loss,
                f_scale=self.f_scale,
                x_scale=np.maximum(np.abs(x0), 1e-12),
                max_nfev=4000,
                xtol=1e-12,
                ftol=1e-12,
                gtol=1e-12,
            )
            if best is None or sol.cost < best.cost:
                best = sol
        assert best is not None
        self.params_ = ScalingParams(*[float(v) for v in best.x])
        pred = self._step(best.x, nodes, reps, bsz)
        self.train_mape_ = float(np.mean(np.abs(pred - t) / t))
        self.n_samples_ = len(t)
        return self

    def predict(
        self, num_nodes: ArrayLike, num_replicas: ArrayLike, local_bsz: ArrayLike
    ) -> np.ndarray:
        """Predict seconds per step.

        Args:
            num_nodes: Nodes of each row.
            num_replicas: Data-parallel replicas of each row.
            local_bsz: Per-replica batch size of each row.

        Raises:
            InvalidStateError: The model was not fitted.
        """
        if not hasattr(self, "params_"):
            raise InvalidStateError("ScalingModel.predict called before fit")
        return self._step(
            self.params_.as_array(),
            np.asarray(num_nodes, dtype=float),
            np.asarray(num_replicas, dtype=float),
            np.asarray(local_bsz, dtype=float),
        )

    def predict_table(self, table: ScalingTable) -> np.ndarray:
        """Predict every row of a measurement table."""
        return self.predict(table.num_nodes, table.num_replicas, table.local_bsz)


@dataclass(frozen=True)
class ScalingValidation:
    """Outcome of fitting on placements and predicting the scalability table.

    Attributes:
        name: The model directory's name.
        model: The fitted :class:`ScalingModel`.
        test: The scalability table.
        predicted: Predicted seconds per step for each row of ``test``.
        mape: Mean absolute percentage error on ``test``.
        train_mape: The same on the placements it was fitted on.
    """

    name: str
    model: ScalingModel
    test: ScalingTable
    predicted: np.ndarray
    mape: float
    train_mape: float

    def write_predictions(self, path: str | Path) -> None:
        """Write one CSV row per scalability row: inputs, measured, predicted, error."""
        with Path(path).open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow([*SCALABILITY_COLUMNS[:4], "predicted_step_time", "abs_pct_error"])
            t = self.test
            for i in range(len(t)):
                err = abs(self.predicted[i] - t.step_time[i]) / t.step_time[i]
                writer.writerow(
                    [
                        int(t.num_nodes[i]),
                        int(t.num_replicas[i]),
                        int(t.local_bsz[i]),
                        f"{t.step_time[i]:.6g}",
                        f"{self.predicted[i]:.6g}",
                        f"{err:.6g}",
                    ]
                )


def validate_scaling(
    directory: str | Path,
    algorithm: str = "ring",
    gradient_bytes: float | None = None,
    fixed_overlap: float | None = None,
) -> ScalingValidation:
    """Fit on ``directory/placements.csv`` only and predict ``directory/scalability.csv``.

    Args:
        directory: A model folder in the Pollux artifact format.
        algorithm: ``"ring"`` or ``"tree"``.
        gradient_bytes: Gradient size if known (``β`` then in s/byte).
        fixed_overlap: Hold ω fixed instead of fitting it.

    Raises:
        ScalingDataError: A file is missing or malformed (names file and line).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ScalingDataError(f"{directory}: not a directory (expected a model folder)")
    train = read_placements(directory / "placements.csv")
    test = read_scalability(directory / "scalability.csv")
    model = ScalingModel(algorithm, gradient_bytes, fixed_overlap).fit(train)
    pred = model.predict_table(test)
    mape = float(np.mean(np.abs(pred - test.step_time) / test.step_time))
    return ScalingValidation(directory.name, model, test, pred, mape, model.train_mape_)


def _subset(table: ScalingTable, keep: np.ndarray, source: str) -> ScalingTable:
    return ScalingTable(
        source,
        table.num_nodes[keep],
        table.num_replicas[keep],
        table.local_bsz[keep],
        table.step_time[keep],
        table.sync_time[keep],
    )


def extrapolate_nodes(
    directory: str | Path,
    max_fit_nodes: int = 8,
    target_nodes: int = 16,
    algorithm: str = "ring",
) -> ScalingValidation:
    """Fit on every measurement with at most ``max_fit_nodes`` nodes, predict ``target_nodes``.

    The fit uses ``placements.csv`` and the rows of ``scalability.csv`` on at most
    ``max_fit_nodes`` nodes; the test is the rows on exactly ``target_nodes`` nodes: an
    extrapolation in node count with everything smaller seen.

    Args:
        directory: A model folder in the Pollux artifact format.
        max_fit_nodes: Largest node count the fit sees.
        target_nodes: Node count predicted.
        algorithm: ``"ring"`` or ``"tree"``.

    Raises:
        ScalingDataError: Missing or malformed files, ``target_nodes <= max_fit_nodes``, or
            no row at ``target_nodes``.
    """
    directory = Path(directory)
    if target_nodes <= max_fit_nodes:
        raise ScalingDataError(
            f"extrapolate_nodes: target_nodes={target_nodes} must exceed "
            f"max_fit_nodes={max_fit_nodes}"
        )
    places = read_placements(directory / "placements.csv")
    scale = read_scalability(directory / "scalability.csv")
    small = scale.num_nodes <= max_fit_nodes
    test = _subset(scale, scale.num_nodes == target_nodes, str(scale.source))
    if len(test) == 0:
        raise ScalingDataError(f"{scale.source}: no row on {target_nodes} nodes to predict")
    model = ScalingModel(algorithm).fit(
        num_nodes=np.concatenate([places.num_nodes, scale.num_nodes[small]]),
        num_replicas=np.concatenate([places.num_replicas, scale.num_replicas[small]]),
        local_bsz=np.concatenate([places.local_bsz, scale.local_bsz[small]]),
        step_time=np.concatenate([places.step_time, scale.step_time[small]]),
    )
    pred = model.predict_table(test)
    mape = float(np.mean(np.abs(pred - test.step_time) / test.step_time))
    return ScalingValidation(directory.name, model, test, pred, mape, model.train_mape_)


#: Placements of the synthetic tables, per-node GPU counts of up to 4 nodes.
SYNTHETIC_PLACEMENTS = (
    *("1", "2", "3", "4"),  # one node
    *("11", "12", "22", "13", "33", "44"),  # two nodes
    *("111", "222"),  # three nodes
    *("1111", "2434", "4444"),  # four nodes
)
SYNTHETIC_SCALES = ((6, 6), (6, 12), (8, 16), (12, 24), (16, 32), (16, 64))


def write_synthetic_tables(
    directory: str | Path,
    params: ScalingParams,
    *,
    batches: tuple[int, ...] = (8, 16, 32, 64, 128),
    noise: float = 0.0,
    seed: int = 0,
    algorithm: str = "ring",
) -> Path:
    """Write ``placements.csv`` and ``scalability.csv`` whose rows follow the model.

    Placements span up to 4 nodes of up to 4 GPUs; the scalability rows 6–16 nodes and up to
    64 replicas, as in the Pollux artifact. Used when real measurements are absent and to
    check that fitting recovers known parameters.

    Args:
        directory: Folder to create (parents too).
        params: The true parameters (``β`` in seconds per gradient).
        batches: Local batch sizes of each placement.
        noise: Standard deviation of multiplicative log-normal noise (0: exact).
        seed: Seed of the noise.
        algorithm: ``"ring"`` or ``"tree"``.

    Returns:
        The folder.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = ScalingModel(algorithm)
    rng = np.random.default_rng(seed)
    theta = params.as_array()

    def steps(nodes: list[int], reps: list[int], bsz: list[int]) -> np.ndarray:
        t = model._step(theta, np.array(nodes), np.array(reps), np.array(bsz, dtype=float))
        return t * np.exp(noise * rng.standard_normal(len(t))) if noise > 0 else t

    rows = [(pl, b) for pl in SYNTHETIC_PLACEMENTS for b in batches]
    t = steps(
        [len(pl) for pl, _ in rows], [sum(map(int, pl)) for pl, _ in rows], [b for _, b in rows]
    )
    lines = ["placement,local_bsz,step_time,sync_time"]
    lines += [f"{pl},{b},{float(ti)!r},0.0" for (pl, b), ti in zip(rows, t, strict=True)]
    (directory / "placements.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    scale = [(n, r, b) for n, r in SYNTHETIC_SCALES for b in batches]
    t = steps([n for n, _, _ in scale], [r for _, r, _ in scale], [b for _, _, b in scale])
    lines = ["num_nodes,num_replicas,local_bsz,step_time,sync_time"]
    lines += [f"{n},{r},{b},{float(ti)!r},0.0" for (n, r, b), ti in zip(scale, t, strict=True)]
    (directory / "scalability.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory
