"""Progress bars: live in interactive use, one summary line in batch runs."""

import pytest

from hpcnb.progress import QuietProgress, progress, show_progress


@pytest.mark.parametrize(
    ("requested", "environ", "parent", "expected"),
    [
        (True, {"HPCNB_BATCH": "1"}, "papermill", True),
        (None, {"HPCNB_PROGRESS": "on", "HPCNB_BATCH": "1"}, "", True),
        (None, {"HPCNB_PROGRESS": "0"}, "", False),
        (None, {"HPCNB_BATCH": "1"}, "bash", False),
        (None, {}, "/usr/bin/python -m papermill a.ipynb", False),
        (None, {}, "python -m pytest -n 2", False),
    ],
)
def test_show_progress_decides_in_order(requested, environ, parent, expected):
    assert show_progress(requested, environ=environ, parent_cmdline=parent) is expected


def test_bad_progress_word_is_an_error():
    with pytest.raises(ValueError, match="HPCNB_PROGRESS"):
        show_progress(environ={"HPCNB_PROGRESS": "maybe"}, parent_cmdline="")


def test_quiet_progress_prints_one_summary_line(capsys):
    items = list(progress(range(7), desc="train", unit="epochs", enabled=False))
    assert items == list(range(7))
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("train: 7 epochs in ")
    bar = QuietProgress(iter([1, 2]), summary=False)
    bar.set_postfix(loss=1.0)
    assert list(bar) == [1, 2] and capsys.readouterr().out == ""


def test_live_progress_is_a_tqdm_bar():
    from tqdm.std import tqdm as std_tqdm

    bar = progress(range(3), desc="x", enabled=True, disable=True)
    assert isinstance(bar, std_tqdm) and list(bar) == [0, 1, 2]
