import pytest

from _nbutil import make_notebook
from hpcnb.cli import main
from hpcnb.parameters import ParameterError
from hpcnb.sweep import expand_grid, load_grid, sweep

PARAMS = (
    "SMOKE: bool = False  # tiny\nSEED: int = 0  # seed\nA: int = 1  # a\nB: float = 0.5  # b\n"
)


def test_expand_grid_is_cartesian():
    points = expand_grid({"A": [1, 2], "B": [0.1, 0.2, 0.3]})
    assert len(points) == 6 and {"A": 2, "B": 0.3} in points
    with pytest.raises(ParameterError, match="no values"):
        expand_grid({"A": []})


def test_load_grid_rejects_non_mapping(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ParameterError, match="mapping"):
        load_grid(path)
    path.write_text("A: [1, 2]\nB: 0.5\n")
    assert load_grid(path) == {"A": [1, 2], "B": [0.5]}


def test_sweep_2x2_on_local_cluster(tmp_path):
    nb = make_notebook(
        tmp_path / "s.ipynb", PARAMS, "from hpcnb import record\nrecord('s.total', A + B)"
    )
    table = sweep(nb, {"A": [1, 2], "B": [0.5, 1.5]}, workers=2, out=tmp_path / "out")
    assert len(table) == 4 and (table["status"] == "ok").all()
    assert sorted(table["s.total"]) == [1.5, 2.5, 2.5, 3.5]
    for _, row in table.iterrows():
        assert row["s.total"] == row["A"] + row["B"]
    assert (tmp_path / "out" / "sweep.csv").exists()
    assert (tmp_path / "out" / "records.json").exists()
    assert table.attrs["run_folder"] == str(tmp_path / "out")


def test_sweep_rejects_unknown_grid_names_before_running(tmp_path):
    nb = make_notebook(tmp_path / "s.ipynb", PARAMS, "pass")
    grid = tmp_path / "g.yaml"
    grid.write_text("C: [1, 2]\n")
    assert main(["sweep", str(nb), "--grid", str(grid), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_unreachable_scheduler_and_bad_workers_fail_fast(tmp_path):
    import socket
    import time

    nb = make_notebook(tmp_path / "s.ipynb", PARAMS, "A + B")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    start = time.monotonic()
    with pytest.raises(ParameterError, match="no Dask scheduler reachable"):
        sweep(
            nb,
            {"A": [1]},
            scheduler=f"tcp://127.0.0.1:{port}",
            out=tmp_path / "o",
            connect_timeout=2,
        )
    assert time.monotonic() - start < 30
    with pytest.raises(ParameterError, match="workers"):
        sweep(nb, {"A": [1]}, workers=0, out=tmp_path / "o2")


def test_sweep_writes_a_report_of_every_grid_point_and_prints_its_folder(tmp_path, capsys):
    nb = make_notebook(
        tmp_path / "s.ipynb", PARAMS, "from hpcnb import record\nrecord('s.total', A + B)"
    )
    grid = tmp_path / "g.yaml"
    grid.write_text("A: [1, 2]\nB: 0.25\n")
    out = tmp_path / "out"
    status = main(
        ["sweep", str(nb), "--grid", str(grid), "--workers", "1", "--smoke", "--out", str(out)]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert f"run folder: {out}" in printed and f"report: {out / 'report.md'}" in printed
    report = (out / "report.md").read_text()
    assert report.splitlines()[2].startswith("**SMOKE run**")
    assert "| s__000 | ok |" in report and "| s__001 | ok |" in report
    assert "`A=1`, `B=0.25`, `SMOKE=True`" in report and "`A=2`, `B=0.25`, `SMOKE=True`" in report
