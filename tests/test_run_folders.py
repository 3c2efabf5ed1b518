"""Run folders that survive bad notebooks, bad destinations, full disks and bad run.json."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys

import pytest

from _nbutil import make_notebook
from hpcnb.cli import main
from hpcnb.records import MIME_TYPE, RecordError, record
from hpcnb.report import render_report
from hpcnb.runfolder import RunFolderError, locked_run_folder, unique_run_folder
from hpcnb.runner import run_notebooks

PARAMS = "SMOKE: bool = False  # tiny\nX: float = 1.0  # a value\n"


@pytest.fixture
def good(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    return make_notebook(src / "a_good.ipynb", PARAMS, "from hpcnb import record\nrecord('t.x', X)")


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\x01garbage",
        b"{not json",
        b"[]",
        b'{"cells": 5}',
        b'{"cells": [{"source": 3}]}',
        b'{"cells": [{"source": "x", "metadata": {"tags": "parameters"}}]}',
        b"[" * 100_000,
    ],
)
def test_a_garbage_notebook_is_refused_in_one_line(tmp_path, capsys, content):
    bad = tmp_path / "junk.ipynb"
    bad.write_bytes(content)
    assert main(["run", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "junk.ipynb" in _err_line(capsys)
    assert not (tmp_path / "o").exists()


def test_list_skips_a_bad_notebook_with_a_warning(good, monkeypatch, capsys):
    (good.parent / "b_junk.ipynb").write_text("{oops")
    monkeypatch.setenv("HPCNB_NOTEBOOKS", str(good.parent))
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert "a_good" in out and "X: float = 1.0" in out and "b_junk" not in out
    assert "warning: skipped" in err and "b_junk.ipynb" in err


def test_destinations_that_cannot_be_used(good, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["run", str(good), "--out", str(blocker / "run")]) == 2  # not a folder: even root
    assert "cannot be used" in _err_line(capsys)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    assert main(["run", str(good), "--out", str(dangling)]) == 2
    assert "symbolic link to nothing" in _err_line(capsys)
    with pytest.raises(RunFolderError, match="cannot create a run folder"):
        unique_run_folder(blocker, "20260101T000000Z")


def test_default_run_folders_are_unique_within_a_second(tmp_path):
    first = unique_run_folder(tmp_path, "20260101T000000Z")
    second = unique_run_folder(tmp_path, "20260101T000000Z")
    assert first != second and second.name == "20260101T000000Z-2"
    assert first.is_dir() and second.is_dir() and not any(second.iterdir())
    with locked_run_folder(first), locked_run_folder(second):
        pass  # both usable at once


def test_a_file_size_limit_while_writing_leaves_a_consistent_folder(tmp_path):
    """With ``ulimit -f`` the executed notebook cannot be written; the folder says so."""
    big = make_notebook(
        tmp_path / "big_out.ipynb",
        PARAMS,
        "from hpcnb import record\nrecord('t.x', X)",
        "print('y' * 3_000_000)",
    )
    out = tmp_path / "run"
    limit = 1 << 20  # run.json and report.md fit; a 3 MB notebook does not

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcnb",
            "run",
            str(big),
            "--out",
            str(out),
            "--no-progress",
            "--timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        preexec_fn=limit_files,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    run = json.loads((out / "run.json").read_text())
    assert run["big_out"]["status"] == "failed"
    assert "could not be written" in run["big_out"]["error"]
    assert not (out / "big_out.ipynb").exists()  # no truncated notebook left
    assert "big_out | failed" in (out / "report.md").read_text()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (5, "expected a JSON object"),
        ({"status": "fine"}, "status 'fine'"),
        ({"status": "ok", "seconds": "soon", "output": "a.ipynb"}, "field 'seconds' is str"),
        ({"status": "ok", "seconds": 1, "output": "../../etc/passwd"}, "not a file name"),
        ({"status": "ok", "seconds": 1, "output": "a.ipynb", "parameters": []}, "'parameters'"),
    ],
)
def test_report_and_resume_validate_run_json(good, tmp_path, capsys, entry, message):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"a_good": entry}))
    assert main(["report", str(out)]) == 2
    err = _err_line(capsys)
    assert "run.json" in err and message in err
    assert main(["run", str(good), "--out", str(out), "--resume"]) == 2
    assert message in _err_line(capsys)


def test_resume_reruns_a_missing_notebook_and_changed_parameters(good, tmp_path):
    out = tmp_path / "run"
    (first,) = run_notebooks([good], {"X": "2"}, out=out, progress=False, timeout=300)
    assert first.ok and first.records == {"t.x": 2.0}
    (out / "a_good.ipynb").unlink()
    (again,) = run_notebooks(
        [good], {"X": "2"}, out=out, progress=False, timeout=300, resume=True, force=True
    )
    assert again.ok and (out / "a_good.ipynb").is_file() and not again.cached_from
    (changed,) = run_notebooks(
        [good], {"X": "3"}, out=out, progress=False, timeout=300, resume=True
    )
    assert changed.ok and changed.records == {"t.x": 3.0} and changed.parameters == {"X": 3.0}
    run = json.loads((out / "run.json").read_text())
    assert run["a_good"]["parameters"] == {"X": 3.0}


def _notebook_with_payload(path, payload):
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "source": "",
                "metadata": {},
                "outputs": [
                    {"output_type": "display_data", "data": {MIME_TYPE: payload}, "metadata": {}}
                ],
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def test_record_text_is_escaped_in_the_report_and_bounded(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    payload = {"key": "t.x", "value": 1.0, "unit": "s|x\n# injected", "source": "real"}
    _notebook_with_payload(out / "nb.ipynb", payload)
    (out / "run.json").write_text(
        json.dumps({"nb": {"status": "ok", "seconds": 1.0, "output": "nb.ipynb"}})
    )
    report = render_report(out)
    assert "\n# injected" not in report
    row = next(line for line in report.splitlines() if line.startswith("| t.x |"))
    assert "s\\|x # injected" in row
    assert len(re.findall(r"(?<!\\)\|", row)) == 11  # ten cells: the unit's bar is escaped
    _notebook_with_payload(out / "nb.ipynb", {**payload, "unit": "u" * 10_000_000})
    assert "unit of 10000000 characters" in render_report(out)
    with pytest.raises(RecordError, match="note of 50000001 characters"):
        record("t.y", 1.0, note="n" * 50_000_001)
    with pytest.raises(RecordError, match="unit"):
        record("t.y", 1.0, unit="u" * 65)
    capsys.readouterr()


def test_a_read_only_run_folder_root_is_one_line(good, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the not-a-folder case covers root")
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        assert main(["run", str(good), "--out", str(root / "run")]) == 2
        assert "cannot be used" in _err_line(capsys)
    finally:
        root.chmod(0o700)


def test_a_run_json_that_cannot_be_written_keeps_the_folder_whole(tmp_path, monkeypatch):
    import errno

    import hpcnb.cachefile
    from hpcnb.runner import NotebookResult, write_run

    out = tmp_path / "run"
    out.mkdir()
    first = NotebookResult("a", "ok", 1.0, str(out / "a.ipynb"), records={"t.x": 1.0})
    write_run(out, [first])
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(hpcnb.cachefile, "atomic_write", full)
    second = NotebookResult("b", "ok", 1.0, str(out / "b.ipynb"), records={"t.y": 2.0})
    with pytest.raises(RunFolderError, match="No space left on device"):
        write_run(out, [second])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
