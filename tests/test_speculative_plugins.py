"""A user's draft, in a module outside the package, named by reference in a job's JSON."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcnb.speculative import GenerationSpec, JobSpec, TransformerSpec, run_pipeline_mpi
from hpcnb.speculative.contracts import DRAFTS, DraftSpec, SpecError
from hpcnb.speculative.drafts import NgramDraftSpec
from hpcnb.speculative.stages import model_from_spec

MODEL = TransformerSpec("tiny", n_layers=4, vocab_size=96, seed=2)
PROMPT = [1, 5, 9, 3, 7, 5, 9, 3]
N_NEW = 16

# Two drafts of the user's own: a prompt lookup that writes a marker file when it is built
# (on the head rank), unregistered, and one that registers the kind "user_marked".
USER_DRAFTS = """
import os
from dataclasses import dataclass
from pathlib import Path

from hpcnb.speculative.contracts import DraftSpec
from hpcnb.speculative.drafts import NgramDraft


@dataclass(frozen=True)
class MarkerDraftSpec(DraftSpec):
    marker: str
    max_n: int = 2

    def build(self, head_model):
        Path(self.marker).write_text(str(os.getpid()))
        return NgramDraft(max_n=self.max_n, name="user_marker")
"""

USER_REGISTERED = """
import os
from dataclasses import dataclass
from pathlib import Path

from hpcnb.speculative.contracts import DraftSpec, register_draft
from hpcnb.speculative.drafts import NgramDraft


@register_draft("user_marked")
@dataclass(frozen=True)
class MarkedDraftSpec(DraftSpec):
    marker: str

    def build(self, head_model):
        Path(self.marker).write_text(str(os.getpid()))
        return NgramDraft(name="user_marked")
"""


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Two draft modules in a folder outside the package, importable here and on the ranks."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "user_drafts.py").write_text(textwrap.dedent(USER_DRAFTS))
    (folder / "user_registered.py").write_text(textwrap.dedent(USER_REGISTERED))
    monkeypatch.syspath_prepend(str(folder))
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(folder) + (os.pathsep + path if path else ""))
    try:
        yield tmp_path
    finally:
        DRAFTS.unregister("user_marked")
        for name in ("user_drafts", "user_registered"):
            sys.modules.pop(name, None)


def test_draft_by_reference_resolves_and_round_trips(user_modules: Path) -> None:
    marker = str(user_modules / "marker")
    spec = DraftSpec.from_json({"kind": "user_drafts:MarkerDraftSpec", "marker": marker})
    assert type(spec).__module__ == "user_drafts" and "MarkerDraftSpec" not in DRAFTS
    assert spec.to_json() == {"kind": "user_drafts:MarkerDraftSpec", "marker": marker, "max_n": 2}
    # "module:" imports the module, which registers one kind; the JSON names the class
    marked = DraftSpec.from_json({"kind": "user_registered:", "marker": marker})
    assert DRAFTS.get("user_marked") is type(marked)
    assert marked.to_json()["kind"] == "user_registered:MarkedDraftSpec"
    # the module is imported now: "module:" and the registered kind still resolve
    again = DraftSpec.from_json({"kind": "user_registered:", "marker": marker})
    assert again == marked == DraftSpec.from_json({"kind": "user_marked", "marker": marker})
    # a built-in class named by reference is written by its kind
    builtin = DraftSpec.from_json({"kind": "hpcnb.speculative.drafts:NgramDraftSpec"})
    assert builtin == NgramDraftSpec() and builtin.to_json()["kind"] == "ngram"
    gen = GenerationSpec("pipeinfer", PROMPT, N_NEW, draft=spec)
    assert GenerationSpec.from_json(gen.to_json()) == gen


def test_bad_draft_references_name_the_problem(user_modules: Path) -> None:
    with pytest.raises(SpecError, match="cannot import 'no_such_module'"):
        DraftSpec.from_json({"kind": "no_such_module:Spec"})
    with pytest.raises(SpecError, match="has no attribute 'Missing'"):
        DraftSpec.from_json({"kind": "user_drafts:Missing"})
    with pytest.raises(SpecError, match="expected a DraftSpec dataclass"):
        DraftSpec.from_json({"kind": "user_drafts:NgramDraft"})
    with pytest.raises(SpecError, match="lacks 'marker'"):
        DraftSpec.from_json({"kind": "user_drafts:MarkerDraftSpec"})
    with pytest.raises(SpecError, match="registered 0 drafts"):
        DraftSpec.from_json({"kind": "os.path:"})


@pytest.mark.mpi
def test_ranks_import_and_run_a_draft_named_by_reference(user_modules: Path) -> None:
    """The job's JSON names both user drafts by reference; the head rank imports their
    modules itself, builds them (marker files written by another process) and the
    generations stay lossless."""
    unregistered, registered = user_modules / "unregistered", user_modules / "registered"
    job = JobSpec.from_json(
        {
            "model": MODEL.to_json(),
            "prompt": PROMPT,
            "n_new": N_NEW,
            "k": 3,
            "runs": [
                {
                    "strategy": "pipeinfer",
                    "draft": {"kind": "user_drafts:MarkerDraftSpec", "marker": str(unregistered)},
                },
                {
                    "strategy": "speculative",
                    "draft": {"kind": "user_registered:", "marker": str(registered)},
                },
            ],
            "timeout_s": 20,
        }
    )
    assert not unregistered.exists() and not registered.exists()  # nothing built here
    results = run_pipeline_mpi(job, n_ranks=2, timeout_s=90)
    ref = model_from_spec(MODEL).greedy(PROMPT, N_NEW)
    assert [r.draft for r in results] == ["user_marker", "user_marked"]
    assert all(list(r.tokens) == ref for r in results)
    for marker in (unregistered, registered):
        assert int(marker.read_text()) != os.getpid()  # built on the head rank
