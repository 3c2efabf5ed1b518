"""The claims engine: verdicts from records only, rendering, JSON round trip, audit."""

import json

import nbformat
import pytest

from hpcnb.claims import (
    BY_CONSTRUCTION,
    CLAIMS_MIME,
    INCONCLUSIVE,
    MET,
    NOT_MET,
    NOT_REPRODUCED,
    NOT_TESTED_SMOKE,
    NOT_TESTED_SYNTHETIC,
    OWN_DESIGN,
    REPRODUCED,
    SIMULATED_ONLY,
    SMOKE_ENV,
    SUCCESS,
    VERDICTS,
    Claim,
    audit_claims,
    claim,
    claims_frame,
    claims_table,
    evaluate_claims,
    paper_claims_judged_on_own_targets,
    read_claims,
    render_html,
    render_markdown,
    reproducibility_summary,
    session_claims,
    smoke_run,
    verdict,
)
from hpcnb.errors import ClaimError, HpcnbError
from hpcnb.records import Record, clear_session, plural, record, session_records


@pytest.fixture(autouse=True)
def _fresh_session():
    clear_session()
    yield
    clear_session()


def _rec(key="a.x", value=1.5, target=">= 1", low=None, high=None, source="real"):
    return Record(key, value, target=target, low=low, high=high, source=source)


@pytest.mark.parametrize(
    ("kind", "records", "expected"),
    [
        ("paper", [_rec()], REPRODUCED),
        ("paper", [_rec(value=0.5)], NOT_REPRODUCED),
        ("paper", [_rec(low=0.9, high=1.6)], INCONCLUSIVE),
        ("paper", [_rec(low=0.9, high=1.6), _rec("a.y", 0.2)], NOT_REPRODUCED),
        ("paper", [_rec(), _rec("a.y", target=None)], REPRODUCED),
        ("paper", [_rec(source="synthetic")], NOT_TESTED_SYNTHETIC),
        ("paper", [_rec(), _rec("a.y", source="simulated")], SIMULATED_ONLY),
        (
            "paper",
            [_rec(source="simulated"), _rec("a.y", source="synthetic")],
            NOT_TESTED_SYNTHETIC,
        ),
        ("own design", [_rec(value=0.1)], NOT_MET),
        ("own design", [_rec()], MET),
        ("own design", [_rec(low=0.9, high=1.6)], INCONCLUSIVE),
        ("paper", [_rec(source="generated")], REPRODUCED),
        ("own design", [_rec(source="synthetic")], NOT_TESTED_SYNTHETIC),
        ("by construction", [_rec(source="synthetic")], BY_CONSTRUCTION),
    ],
)
def test_verdict_follows_only_the_records(kind, records, expected):
    assert verdict(kind, records) == expected


def test_a_paper_claim_needs_a_target():
    with pytest.raises(ClaimError, match="needs a record with a target"):
        verdict("paper", [_rec(target=None)])


def test_claim_validates_its_arguments():
    for kwargs, match in [
        ({"records": []}, "at least one"),
        ({"records": ["Bad Key"]}, "not a record key"),
        ({"records": ["a.x"], "kind": "ours"}, "kind"),
    ]:
        with pytest.raises(ClaimError, match=match):
            claim("something", **kwargs)
    with pytest.raises(ClaimError, match="non-empty"):
        claim("  ", records=["a.x"])
    assert issubclass(ClaimError, HpcnbError) and issubclass(ClaimError, ValueError)


def test_restating_a_claim_replaces_it():
    claim("c", records=["a.x"])
    claim("c", records=["a.y"], paper=2)
    assert [(c.records, c.paper) for c in session_claims()] == [(("a.y",), 2.0)]


def test_missing_record_is_named():
    record("a.x", 1.0, target="> 0")
    claim("needs y", records=["a.x", "a.y"])
    with pytest.raises(ClaimError, match=r"a\.y"):
        evaluate_claims()


def test_claims_table_renders_in_full_and_row_agrees_with_record(capsys):
    long_text = "a long claim " * 20 + "| with a pipe"
    record("a.speedup", samples=[1.2, 1.3, 1.25, 1.4, 1.1], target=">= 1.3", target_from="paper")
    record("a.flops", 0.5, target="<= 0.5")
    claim(long_text, records=["a.speedup"], paper="1.5x (8 nodes)")
    claim("flops halved", records=["a.flops"], kind="by construction")
    claims_table()
    out = capsys.readouterr().out
    assert long_text in out and "-> inconclusive" in out and "2 claims" in out
    rows = evaluate_claims()
    assert rows[0].verdict == INCONCLUSIVE == session_records()["a.speedup"].met
    assert "[" in rows[0].measured and "(n=5)" in rows[0].measured
    table = render_markdown(rows)
    assert "a long claim " * 20 + "\\| with a pipe" in table
    assert table.count("\n") == 3


def test_claims_table_without_claims_is_an_error():
    with pytest.raises(ClaimError, match="no claims"):
        claims_table()


def _executed(tmp_path, source):
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(source))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    return path


def test_claims_round_trip_through_a_kernel_and_pass_the_audit(tmp_path):
    path = _executed(
        tmp_path,
        "from hpcnb import claim, claims_table, record\n"
        "record('k.real', samples=[2.0, 2.1, 2.2, 1.9, 2.05, 2.0, 2.1], target='> 1',"
        " target_from='paper')\n"
        "record('k.syn', 3.0, target='> 1', source='synthetic', target_from='paper')\n"
        "claim('real one', records=['k.real'], paper=2.15)\n"
        "claim('synthetic one', records=['k.syn'], paper='works on traces')\n"
        "claims_table()",
    )
    rows = read_claims(path)
    assert [r["verdict"] for r in rows] == [REPRODUCED, NOT_TESTED_SYNTHETIC]
    assert rows[0]["paper"] == 2.15 and rows[0]["records"] == ["k.real"]
    json.dumps(rows, allow_nan=False)
    from hpcnb.records import read_record_details

    records = {r.key: r for r in read_record_details(path)}
    assert audit_claims(rows, records) == []
    raw = json.loads(path.read_text())
    outputs = raw["cells"][0]["outputs"]
    assert not any(o["output_type"] == "execute_result" for o in outputs)  # nothing echoed
    assert any(CLAIMS_MIME in o.get("data", {}) for o in outputs)


def test_audit_catches_disagreement_missing_records_and_synthetic_reproduced():
    records = {"a.x": _rec(), "a.s": _rec("a.s", source="synthetic")}
    rows = [
        {"claim": "ok", "kind": "paper", "verdict": REPRODUCED, "records": ["a.x"]},
        {"claim": "wrong", "kind": "paper", "verdict": NOT_REPRODUCED, "records": ["a.x"]},
        {"claim": "gone", "kind": "paper", "verdict": REPRODUCED, "records": ["a.zz"]},
        {"claim": "fake", "kind": "paper", "verdict": REPRODUCED, "records": ["a.s"]},
        {"claim": "odd", "kind": "paper", "verdict": "holds", "records": ["a.x"]},
    ]
    problems = audit_claims(rows, records)
    assert len(problems) == 6  # fake and odd fail twice each
    assert not any(p.startswith("'ok'") for p in problems)
    assert set(VERDICTS) >= {REPRODUCED, SIMULATED_ONLY, BY_CONSTRUCTION, MET, NOT_MET}
    assert OWN_DESIGN not in VERDICTS  # an own-design claim always shows a verdict


def test_read_claims_merges_tables_later_wins(tmp_path):
    nb = nbformat.v4.new_notebook()
    for verdict_text in ("inconclusive", "reproduced"):
        cell = nbformat.v4.new_code_cell("claims_table()")
        row = {"claim": "c", "kind": "paper", "verdict": verdict_text, "records": ["a.x"]}
        cell.outputs = [nbformat.v4.new_output("display_data", data={CLAIMS_MIME: [row]})]
        nb.cells.append(cell)
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert [r["verdict"] for r in read_claims(path)] == ["reproduced"]
    bad = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("display_data", data={CLAIMS_MIME: [{"claim": 1}]})]
    bad.cells.append(cell)
    nbformat.write(bad, path)
    with pytest.raises(ClaimError, match="cell 0"):
        read_claims(path)


def _paper_rec(key="p.x", value=0.15, target="< 0.2", own=None, low=0.12, high=0.17):
    return Record(
        key, value, target=target, target_from="paper", own_target=own, low=low, high=high, n=40
    )


def test_a_paper_claim_with_a_figure_but_only_our_targets_is_refused():
    record("a.err", 0.108, interval=(0.103, 0.114), n=40, target="< 0.08")
    with pytest.raises(ClaimError, match="only our targets"):  # refused where it is stated
        claim("multi-node error under 18 %", records=["a.err"], paper="< 18 %")
    clear_session()
    claim("multi-node error under 18 %", records=["a.err"], paper="< 18 %")  # records later
    record("a.err", 0.108, interval=(0.103, 0.114), n=40, target="< 0.08")
    with pytest.raises(ClaimError, match="only our targets"):
        evaluate_claims()
    clear_session()
    record(
        "a.err",
        0.108,
        interval=(0.103, 0.114),
        n=40,
        target="< 0.18",
        target_from="paper",
        own_target="< 0.08",
    )
    claim(
        "multi-node error under 18 %",
        records=["a.err"],
        paper="< 18 %",
        explanation="our 8 % needs a quieter network model",
    )
    rows = evaluate_claims()
    assert [(r.kind, r.verdict) for r in rows] == [("paper", REPRODUCED), (OWN_DESIGN, NOT_MET)]
    assert rows[0].judged_on == "the paper's figure" and rows[1].stricter_of == rows[0].claim
    assert rows[0].reading == "" and rows[1].reading == "our 8 % needs a quieter network model"
    assert "our own target < 0.08: not met" in rows[1].measured
    assert audit_claims([r.to_json() for r in rows], session_records()) == []


def test_without_a_paper_figure_the_row_says_the_target_is_ours():
    record("a.gain", 2.0, interval=(1.8, 2.2), n=9, target=">= 1.5")
    claim("speculation speeds decoding up", records=["a.gain"])
    row = evaluate_claims()[0]
    assert row.verdict == REPRODUCED and "no figure" in row.judged_on
    assert "the paper gives no figure" in render_markdown([row])


def test_paper_claims_are_judged_on_paper_targets_only():
    recs = [_paper_rec(), Record("p.y", 0.5, target=">= 1", n=None)]  # ours: missed, ignored
    assert verdict("paper", recs, paper="< 20 %") == REPRODUCED
    assert verdict("own design", recs) == NOT_MET


def test_baseline_and_explanation_are_shown_and_validated(capsys):
    record(
        "a.speedup",
        samples=[0.9, 0.95, 1.0, 0.97, 0.92, 0.99, 0.96],
        target=">= 1.5",
        target_from="paper",
    )
    claim(
        "PipeInfer beats speculative inference",
        records=["a.speedup"],
        paper="up to 2.15x",
        baseline="adaptive speculation on the same 2 ranks",
        explanation="the draft is accepted 5 % of the time",
    )
    claims_table()
    out = capsys.readouterr().out
    assert "baseline: adaptive speculation on the same 2 ranks" in out
    assert "reading: the draft is accepted 5 % of the time" in out and "not reproduced" in out
    with pytest.raises(ClaimError, match="baseline"):
        claim("x", records=["a.speedup"], baseline=" ")


def test_reproducibility_summary_counts_and_lists_misses(capsys):
    record("a.ok", 2.0, target="> 1", target_from="paper")
    record("a.miss", 0.5, target="> 1", target_from="paper", own_target="> 1.5")
    claim("one holds", records=["a.ok"], paper=2)
    claim("one misses", records=["a.miss"], paper=1.5, explanation="too small a model")
    text = reproducibility_summary(deviations=["2 ranks, not 8"], hard=["noise"])
    assert "Paper claims tested: 2 (1 reproduced, 1 not reproduced)" in text
    assert "Our own targets: 1 (1 not met)" in text
    assert "*one misses* — not reproduced: too small a model" in text
    assert "- 2 ranks, not 8" in text and "- noise" in text


def test_audit_flags_paper_claims_on_our_targets_and_intervals_from_too_few():
    records = {"a.x": _rec(), "a.f": Record("a.f", 1.0, target="> 0", n=2, low=0.9, high=1.1)}
    rows = [
        {"claim": "c", "kind": "paper", "paper": 2.0, "verdict": REPRODUCED, "records": ["a.x"]},
        {"claim": "f", "kind": "own design", "verdict": MET, "records": ["a.f"]},
    ]
    problems = audit_claims(rows, records)
    assert any("only our targets" in p for p in problems)
    assert any("interval from n=2" in p for p in problems)
    assert paper_claims_judged_on_own_targets(rows) == 1


# --- smoke runs, HTML rendering, DataFrame -------------------------------------------


@pytest.mark.parametrize(
    ("kind", "records", "expected"),
    [
        ("paper", [_rec()], NOT_TESTED_SMOKE),
        ("paper", [_rec(value=0.5)], NOT_TESTED_SMOKE),
        ("paper", [_rec(low=0.9, high=1.6)], NOT_TESTED_SMOKE),
        ("paper", [_rec(source="synthetic")], NOT_TESTED_SYNTHETIC),
        ("paper", [_rec(source="simulated")], SIMULATED_ONLY),
        ("own design", [_rec()], MET),
        ("own design", [_rec(value=0.1)], NOT_MET),
        ("own design", [_rec(low=0.9, high=1.6)], INCONCLUSIVE),
        ("by construction", [_rec()], BY_CONSTRUCTION),
    ],
)
def test_a_smoke_run_leaves_paper_claims_untested_and_judges_our_own(kind, records, expected):
    assert NOT_TESTED_SMOKE in VERDICTS and NOT_TESTED_SMOKE not in SUCCESS
    assert verdict(kind, records, smoke=True) == expected


def test_the_runner_flag_makes_the_table_a_smoke_table_and_the_audit_follows(monkeypatch):
    record(
        "a.speed",
        samples=[2.0, 2.1, 2.2, 1.9, 2.05, 2.0, 2.1],
        target="> 1",
        target_from="paper",
        own_target="> 1.5",
    )
    claim("faster", records=["a.speed"], paper="2x")
    monkeypatch.delenv(SMOKE_ENV, raising=False)
    full = evaluate_claims()
    assert [(r.verdict, r.smoke) for r in full] == [(REPRODUCED, False), (MET, False)]
    monkeypatch.setenv(SMOKE_ENV, "1")
    assert smoke_run()
    rows = [row.to_json() for row in evaluate_claims()]
    assert [(r["verdict"], r["smoke"]) for r in rows] == [(NOT_TESTED_SMOKE, True), (MET, True)]
    records = session_records()
    assert audit_claims(rows, records) == []
    # the audit recomputes with the row's own flag: a smoke row may not say reproduced,
    # a full-run row may not say "not tested (smoke inputs)"
    assert audit_claims([{**rows[0], "verdict": REPRODUCED}], records)
    assert audit_claims([{**rows[0], "smoke": False}], records)


def test_claims_table_emits_escaped_coloured_html_and_a_frame(tmp_path):
    path = _executed(
        tmp_path,
        "from hpcnb import claim, claims_table, record\n"
        "from hpcnb.claims import claims_frame\n"
        "record('k.real', samples=[2.0, 2.1, 2.2, 1.9, 2.05, 2.0, 2.1], target='> 1',"
        " target_from='paper')\n"
        "claim('<b>fast</b> & real', records=['k.real'], paper=2.15)\n"
        "claims_table()\n"
        "frame = claims_frame()\n"
        "print(type(frame).__name__, list(frame['verdict']), len(frame))",
    )
    outputs = json.loads(path.read_text())["cells"][0]["outputs"]
    bundle = next(o["data"] for o in outputs if CLAIMS_MIME in o.get("data", {}))
    page = "".join(bundle["text/html"])
    assert "&lt;b&gt;fast&lt;/b&gt; &amp; real" in page and "<b>fast</b>" not in page
    assert '<span style="color:#1a7f37;font-weight:bold">reproduced</span>' in page
    assert "<table" in page and "1 claim: 1 reproduced." in page
    assert "1 claims" not in "".join(bundle["text/plain"])
    printed = "".join("".join(o["text"]) for o in outputs if o["output_type"] == "stream")
    assert "DataFrame ['reproduced'] 1" in printed
    assert not any(o["output_type"] == "execute_result" for o in outputs)


def test_claims_frame_has_the_json_columns_and_needs_claims():
    with pytest.raises(ClaimError, match="no claims"):
        claims_frame()
    record("a.x", 2.0, target="> 1")
    claim("mine", records=["a.x"], kind="own design")
    frame = claims_frame()
    assert list(frame["verdict"]) == [MET] and frame.loc[0, "records"] == ["a.x"]
    assert {"claim", "kind", "measured", "judged_on", "smoke"} <= set(frame.columns)
    assert claims_table() is None


def test_html_colours_failures_red_and_plural_counts():
    rows = evaluate_claims(
        [Claim("slow", ("a.x",), paper=None)], {"a.x": _rec(value=0.5)}, smoke=False
    )
    page = render_html(rows)
    assert '<span style="color:#cf222e;font-weight:bold">not reproduced</span>' in page
    assert plural(1, "claim") == "1 claim" and plural(2, "claim") == "2 claims"
    assert plural(0, "run") == "0 runs" and plural(3, "child", "children") == "3 children"


def test_reproducibility_summary_of_a_smoke_run_says_so(monkeypatch, capsys):
    monkeypatch.setenv(SMOKE_ENV, "1")
    record("a.x", 2.0, target="> 1", target_from="paper")
    record("a.y", 0.5, target="> 1", target_from="paper")
    claim("one", records=["a.x"], paper="2x")
    claim("two", records=["a.y"], paper="2x", explanation="too small here")
    text = reproducibility_summary()
    assert "SMOKE run: 2 paper claims not tested on smoke inputs" in text
    assert "Paper claims not reproduced here" not in text
