"""Tests of the α–β all-reduce model, the multi-node step model and validate-scaling."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from hpcnb.errors import InvalidStateError
from hpcnb.perfmodel import ScalingModel, allreduce_time
from hpcnb.perfmodel.allreduce import fit_alpha_beta, overlapped_step
from hpcnb.perfmodel.cli import register
from hpcnb.perfmodel.protocol import PerfmodelError
from hpcnb.perfmodel.scaling import (
    ScalingDataError,
    ScalingParams,
    read_placements,
    validate_scaling,
    write_synthetic_tables,
)

TRUE = {
    "c0": 0.02,
    "c1": 0.0015,
    "alpha_intra": 2e-4,
    "beta_intra": 0.004,
    "alpha_inter": 1.5e-3,
    "beta_inter": 0.03,
}
PLACEMENTS = ["1", "2", "3", "4", "11", "12", "22", "13", "44", "111", "222", "1111", "2434"]
BATCHES = [8, 16, 32, 64, 128]


def _step(nodes: int, reps: int, bsz: int, overlap: float) -> float:
    comp = TRUE["c0"] + TRUE["c1"] * bsz
    if reps == 1:
        comm = 0.0
    else:
        kind = "inter" if nodes > 1 else "intra"
        comm = 2 * (reps - 1) * TRUE[f"alpha_{kind}"] + 2 * (reps - 1) / reps * TRUE[f"beta_{kind}"]
    return comp + comm - overlap * min(comp, comm)


def _synthetic_dir(root: Path, overlap: float) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    lines = ["placement,local_bsz,step_time,sync_time"]
    for pl in PLACEMENTS:
        reps = sum(int(c) for c in pl)
        for b in BATCHES:
            lines.append(f"{pl},{b},{_step(len(pl), reps, b, overlap)!r},0.0")
    (root / "placements.csv").write_text("\n".join(lines) + "\n")
    lines = ["num_nodes,num_replicas,local_bsz,step_time,sync_time"]
    for nodes, reps in [(6, 6), (8, 16), (16, 64)]:
        for b in BATCHES:
            lines.append(f"{nodes},{reps},{b},{_step(nodes, reps, b, overlap)!r},0.0")
    (root / "scalability.csv").write_text("\n".join(lines) + "\n")
    return root


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hpcnb")
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_ring_and_tree_formulas_by_hand() -> None:
    assert allreduce_time(1, 1e6, 1e-3, 1e-9) == 0.0
    # ring, p=4: 2*3*alpha + 2*3/4 * n * beta
    assert allreduce_time(4, 1e6, 1e-3, 1e-9) == pytest.approx(6e-3 + 1.5e-3)
    # tree, p=4: 2*2*(alpha + n*beta)
    assert allreduce_time(4, 1e6, 1e-3, 1e-9, "tree") == pytest.approx(4 * (1e-3 + 1e-3))
    assert allreduce_time(5, 0, 1.0, 0.0, "tree") == pytest.approx(6.0)
    with pytest.raises(PerfmodelError, match="algorithm"):
        allreduce_time(2, 1, 1, 1, "butterfly")


def test_overlap_factor_between_sum_and_max() -> None:
    assert overlapped_step(3.0, 1.0, 0.0) == pytest.approx(4.0)
    assert overlapped_step(3.0, 1.0, 1.0) == pytest.approx(3.0)
    assert overlapped_step(3.0, 1.0, 0.5) == pytest.approx(3.5)
    with pytest.raises(PerfmodelError, match="overlap"):
        overlapped_step(1.0, 1.0, 1.5)


def test_fit_alpha_beta_recovers_benchmark_parameters() -> None:
    p = np.array([2, 2, 2, 4, 4, 8])
    n = np.array([1e3, 1e6, 1e7, 1e3, 1e6, 1e7])
    t = allreduce_time(p, n, 5e-5, 2e-10)
    fit = fit_alpha_beta(p, n, t)
    assert fit.alpha == pytest.approx(5e-5, rel=1e-6)
    assert fit.beta == pytest.approx(2e-10, rel=1e-6)
    assert fit.mape < 1e-9


@pytest.mark.parametrize("overlap", [0.0, 0.4])
def test_validate_scaling_recovers_alpha_beta_on_synthetic_dir(
    tmp_path: Path, overlap: float
) -> None:
    result = validate_scaling(_synthetic_dir(tmp_path / "synth", overlap))
    got = result.model.params_
    for name, value in TRUE.items():
        assert getattr(got, name) == pytest.approx(value, rel=1e-3), name
    assert got.overlap == pytest.approx(overlap, abs=1e-3)
    assert result.mape < 1e-4


def test_cli_prints_mape_last_and_writes_predictions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _synthetic_dir(tmp_path / "synth", 0.0)
    out = tmp_path / "pred.csv"
    assert _run_cli(["perfmodel", "validate-scaling", str(d), "--predictions", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("MAPE ")
    assert float(last.split()[1]) < 1e-3
    rows = out.read_text().strip().splitlines()
    assert rows[0].startswith("num_nodes,num_replicas,local_bsz,step_time,predicted_step_time")
    assert len(rows) == 1 + 3 * len(BATCHES)


def test_malformed_csv_names_file_and_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _synthetic_dir(tmp_path / "bad", 0.0)
    lines = (d / "placements.csv").read_text().splitlines()
    lines[4] = "2x,16,0.1,0.0"
    (d / "placements.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ScalingDataError, match=r"placements\.csv: line 5: column placement"):
        read_placements(d / "placements.csv")
    assert _run_cli(["perfmodel", "validate-scaling", str(d)]) == 2
    err = capsys.readouterr().err
    assert "placements.csv" in err and "line 5" in err

    lines[4] = "2,16,-0.1,0.0"
    (d / "placements.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ScalingDataError, match=r"line 5: column step_time"):
        read_placements(d / "placements.csv")
    lines[4] = "2,16"
    (d / "placements.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ScalingDataError, match=r"line 5: expected 4 fields"):
        read_placements(d / "placements.csv")
    lines[4] = "2,16,0.1,0.0"
    (d / "placements.csv").write_text("\n".join(lines) + "\n")
    (d / "scalability.csv").write_text("num_nodes,local_bsz,step_time\n1,2,3\n")
    with pytest.raises(ScalingDataError, match=r"scalability\.csv: line 1: .*lacks.*num_replicas"):
        validate_scaling(d)


def test_model_api_and_errors() -> None:
    model = ScalingModel()
    with pytest.raises(InvalidStateError, match="before fit"):
        model.predict([1], [1], [1])
    with pytest.raises(PerfmodelError, match="at least 7"):
        model.fit(num_nodes=[1], num_replicas=[1], local_bsz=[1], step_time=[1.0])
    with pytest.raises(PerfmodelError, match="gradient_bytes"):
        ScalingModel(gradient_bytes=0)


def test_pollux_extrapolation_mape(shared_data: Path) -> None:
    dl = shared_data / "dl"
    dirs = sorted(p for p in dl.iterdir() if (p / "placements.csv").is_file())
    assert dirs, f"no model folders in {dl}"
    mapes = [validate_scaling(d).mape for d in dirs]
    assert float(np.mean(mapes)) <= 0.18


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_write_synthetic_tables_round_trip(tmp_path: Path, algorithm: str) -> None:
    true = ScalingParams(0.03, 2e-3, 1e-4, 5e-3, 2e-3, 0.04, 0.25)
    d = write_synthetic_tables(tmp_path / algorithm, true, algorithm=algorithm)
    assert read_placements(d / "placements.csv").num_nodes.max() == 4
    got = validate_scaling(d, algorithm=algorithm).model.params_
    if algorithm == "tree":
        # the tree's latency and bandwidth terms share one multiplier: only alpha + n*beta shows
        for link in ("intra", "inter"):
            total = getattr(got, f"alpha_{link}") + getattr(got, f"beta_{link}")
            assert total == pytest.approx(
                getattr(true, f"alpha_{link}") + getattr(true, f"beta_{link}"), rel=1e-3
            )
        keep = [0, 1, 6]  # compute line and overlap
    else:
        keep = list(range(7))
    np.testing.assert_allclose(got.as_array()[keep], true.as_array()[keep], rtol=1e-3, atol=1e-7)
    noisy = validate_scaling(write_synthetic_tables(tmp_path / "noisy", true, noise=0.05))
    assert 0 < noisy.mape < 0.15


def test_extrapolate_nodes_fits_small_predicts_sixteen(tmp_path: Path) -> None:
    from hpcnb.perfmodel.scaling import extrapolate_nodes

    d = _synthetic_dir(tmp_path / "m", overlap=0.3)
    far = extrapolate_nodes(d, max_fit_nodes=8, target_nodes=16)
    assert set(far.test.num_nodes.tolist()) == {16}
    assert far.mape < 1e-3  # noiseless tables from the model's own form
    with pytest.raises(ScalingDataError, match="exceed"):
        extrapolate_nodes(d, max_fit_nodes=16, target_nodes=8)
    with pytest.raises(ScalingDataError, match="no row"):
        extrapolate_nodes(d, max_fit_nodes=8, target_nodes=12)
