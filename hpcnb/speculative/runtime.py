"""The MPI pipeline runtime: ``mpiexec -n P python -m hpcnb.speculative.runtime job out``.

:func:`run_pipeline_mpi` writes a :class:`~hpcnb.speculative.contracts.JobSpec` as JSON,
runs it on ``P`` ranks and reads back one :class:`~hpcnb.speculative.contracts.RunResult`
per generation.

Each rank holds a contiguous slice of the layers and its own :class:`KVCache`. Rank 0,
the head, embeds tokens, runs the first slice, drafts, verifies and decides (through
:class:`HeadPolicy`); the last rank turns hidden states into argmax tokens and sends them
back to the head. Messages:

* forward (tag ``FWD``, rank ``j`` → ``j+1``): cache edits to apply first, then a run's
  header and hidden states — or, for a run cancelled at this stage, a placeholder so that
  message order is kept; ``STOP`` at the end. MPI keeps messages between two ranks in
  order, so every rank applies runs and cache edits in the same order.
* result (tag ``RESULT``, last rank → head): the run's argmax tokens or ``None``, its
  first position, and — when the generation's draft reads the target's features
  (:meth:`~hpcnb.speculative.contracts.DraftSpec.needs_features`) — the run's final hidden
  states, which the head checks against the run's positions and hands to the draft.
* cancel (tag ``CANCEL``): run ids the head has invalidated, sent to the last rank and
  passed backwards rank by rank; a rank drops cancelled runs when they reach it.
* stats (tag ``STATS``): each rank's event log and counters, to the head at the end.

The head polls for results with non-blocking probes and keeps launching runs while none
is waiting. Every wait has a deadline: a rank that hears nothing for ``timeout_s``
prints which rank it waited for and aborts the whole job (``MPI_Abort``); a rank that
dies is reported by ``mpiexec``. Either way :func:`run_pipeline_mpi` raises
:class:`~hpcnb.launch.MPIRunError`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from hpcnb.errors import HpcnbError, InvalidInputError, InvalidTypeError
from hpcnb.launch import MPIRunError, run_mpi
from hpcnb.speculative.contracts import GenerationSpec, JobSpec, RunResult, SpecError, StageEvent
from hpcnb.speculative.head import Draft, Edit, HeadPolicy, RunHeader
from hpcnb.speculative.model import KVCache, LlamaModel
from hpcnb.speculative.stages import build_stage, layer_split
from hpcnb.timing import pinned_threads

__all__ = ["main", "run_pipeline_mpi"]

FWD, RESULT, CANCEL, STATS = 11, 12, 13, 14


class _TimeoutError(HpcnbError, RuntimeError):
    """A rank waited longer than the job's ``timeout_s`` (the job is then aborted)."""


class _Rank:
    """State shared by the head and worker loops of one rank."""

    def __init__(self, comm: Any, job: JobSpec) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = float(job.timeout_s)
        self.poll = float(job.poll_s)
        self.reqs: list[Any] = []
        self.events: list[StageEvent] = []
        self.cancelled: set[int] = set()
        self.computed = 0
        self.skipped = 0
        self.messages = 0
        self.delay = float(job.stage_delay_s.get(self.rank, 0.0))
        self.fault = job.fault if job.fault is not None and job.fault.rank == self.rank else None
        self.t0 = 0.0

    def reset(self) -> None:
        self.events, self.cancelled = [], set()
        self.computed = self.skipped = 0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def isend(self, obj: Any, dest: int, tag: int) -> None:
        self.reqs.append(self.comm.isend(obj, dest=dest, tag=tag))
        if len(self.reqs) > 64:
            self.reqs = [r for r in self.reqs if not r.Test()]

    def wait_for(self, source: int, tag: int, what: str) -> Any:
        from mpi4py import MPI

        deadline = time.perf_counter() + self.timeout
        status = MPI.Status()
        while not self.comm.Iprobe(source=source, tag=tag, status=status):
            if tag == FWD:
                self.drain_cancels()
            if time.perf_counter() > deadline:
                raise _TimeoutError(
                    f"rank {self.rank}: no {what} from rank {source} within {self.timeout:g} s "
                    "(a rank died or is stuck)"
                )
            time.sleep(self.poll)
        return self.comm.recv(source=source, tag=tag)

    def drain_cancels(self) -> None:
        from mpi4py import MPI

        if self.rank == 0:
            return
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=CANCEL):
            ids = self.comm.recv(source=MPI.ANY_SOURCE, tag=CANCEL)
            self.cancelled.update(ids)
            if self.rank > 1:
                self.isend(ids, self.rank - 1, CANCEL)

    def event(self, run_id: int, kind: str, t0: float, n_tokens: int, spec: bool) -> None:
        self.events.append(StageEvent(self.rank, run_id, kind, t0, self.now(), n_tokens, spec))

    def maybe_fault(self) -> None:
        if self.fault is not None and self.messages >= self.fault.after:
            sys.stderr.write(f"rank {self.rank}: injected fault {self.fault.kind!r}\n")
            sys.stderr.flush()
            if self.fault.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600.0)

    def finish(self) -> None:
        deadline = time.perf_counter() + self.timeout
        while any(not r.Test() for r in self.reqs):
            if time.perf_counter() > deadline:
                raise _TimeoutError(
                    f"rank {self.rank}: sends not completed within {self.timeout:g} s"
                )
            time.sleep(self.poll)


def _apply_edits(cache: KVCache, edits: list[Edit]) -> None:
    for e in edits:
        if e[0] == "commit":
            cache.copy(int(e[1]), 0, int(e[2]))
        elif e[0] == "remove":
            cache.remove(int(e[1]))
        else:
            raise InvalidInputError(f"unknown cache edit {e!r}")


def _stage_compute(
    model: LlamaModel, cache: KVCache, hdr: RunHeader, h: torch.Tensor
) -> torch.Tensor:
    if hdr.seq != hdr.parent_seq:
        cache.copy(hdr.parent_seq, hdr.seq, hdr.parent_len)
    return model.run_layers(h, hdr.seq, cache)


def _worker(st: _Rank, model: LlamaModel, send_features: bool = False) -> None:
    cache = model.new_cache()
    last = st.rank == st.size - 1
    while True:
        st.drain_cancels()
        msg = st.wait_for(st.rank - 1, FWD, "forward message")
        st.drain_cancels()
        st.messages += 1
        _apply_edits(cache, msg["edits"])
        if msg["kind"] == "stop":
            st.drain_cancels()
            if not last:
                st.isend(msg, st.rank + 1, FWD)
            break
        hdr: RunHeader = msg["run"]
        rid, n = hdr.run_id, len(hdr.tokens)
        t0 = st.now()
        out: Any = None
        feats: Any = None
        if msg["h"] is None or rid in st.cancelled:
            st.skipped += n
            st.event(rid, "skip", t0, n, hdr.speculative)
            h = None
        else:
            if st.delay:
                time.sleep(st.delay)
            with torch.no_grad():
                h = _stage_compute(model, cache, hdr, torch.from_numpy(msg["h"]))
                if last:
                    out = torch.argmax(model.logits(h), -1).tolist()
                    feats = h.numpy() if send_features else None
            st.computed += n
            st.event(rid, "compute", t0, n, hdr.speculative)
        if last:
            result = {"run_id": rid, "outputs": out, "features": feats, "start": hdr.parent_len}
            st.isend(result, 0, RESULT)
        else:
            payload = None if h is None else h.numpy()
            st.isend(
                {"kind": "run", "edits": msg["edits"], "run": hdr, "h": payload}, st.rank + 1, FWD
            )
        st.maybe_fault()


def _head(
    st: _Rank, model: LlamaModel, draft: Draft | None, gen: GenerationSpec, first_run_id: int
) -> RunResult:
    policy = HeadPolicy(
        strategy=gen.strategy,
        prompt=list(gen.prompt),
        n_new=int(gen.n_new),
        draft=draft,
        k=int(gen.k),
        max_inflight=int(gen.max_inflight),
        max_ahead=int(gen.max_ahead),
        first_run_id=first_run_id,
        plain_drafts=bool(gen.plain_drafts),
        adaptive=bool(gen.adaptive),
    )
    cache = model.new_cache()
    last = st.size - 1
    pending: list = []
    st.t0 = time.perf_counter()
    t_start = st.now()

    def handle(msg: dict) -> None:
        edits, cancels = policy.on_result(
            msg["run_id"],
            msg["outputs"],
            st.now(),
            features=msg.get("features"),
            start=msg.get("start"),
        )
        _apply_edits(cache, edits)
        pending.extend(edits)
        if cancels:
            st.isend(cancels, last, CANCEL)

    while not policy.done or policy.inflight:
        got = False
        while st.comm.Iprobe(source=last, tag=RESULT):
            handle(st.comm.recv(source=last, tag=RESULT))
            got = True
        if not policy.done:
            t0 = st.now()
            run = policy.next_run()
            if run is not None:
                if run.speculative:
                    st.event(run.run_id, "draft", t0, 0, True)
                t1 = st.now()
                hdr = run.header()
                with torch.no_grad():
                    h = _stage_compute(model, cache, hdr, model.embed(run.tokens))
                st.computed += len(run.tokens)
                st.event(run.run_id, "compute", t1, len(run.tokens), run.speculative)
                st.isend({"kind": "run", "edits": pending, "run": hdr, "h": h.numpy()}, 1, FWD)
                pending = []
                st.messages += 1
                st.maybe_fault()
                continue
        if policy.inflight and not got:
            handle(st.wait_for(last, RESULT, "result"))
    t_end = st.now()
    st.isend({"kind": "stop", "edits": pending}, 1, FWD)
    stats = [_rank_stats(st)]
    for r in range(1, st.size):
        stats.append(st.wait_for(r, STATS, "statistics"))
    return RunResult.from_policy(
        policy,
        ranks=st.size,
        elapsed_s=t_end - t_start,
        computed=[s["computed"] for s in stats],
        skipped=[s["skipped"] for s in stats],
        events=[e for s in stats for e in s["events"]],
        t_start=t_start,
    )


def _rank_stats(st: _Rank) -> dict[str, Any]:
    return {"computed": st.computed, "skipped": st.skipped, "events": st.events}


def _run_rank(comm: Any, job: JobSpec, out_path: Path) -> None:
    """One rank's share of the job: load its stage, run every generation, write results."""
    st = _Rank(comm, job)
    if st.size < 2:
        raise SpecError("the pipeline runtime needs at least 2 ranks (mpiexec -n P, P >= 2)")
    split = layer_split(job.model, st.size, job.split)
    model, full = build_stage(job.model, split, st.rank, st.size, job.head_layers())
    drafts = [
        g.draft.build(full) if st.rank == 0 and g.draft is not None else None for g in job.runs
    ]
    del full
    req = comm.Ibarrier()
    deadline = time.perf_counter() + max(st.timeout, 120.0)
    while not req.Test():
        if time.perf_counter() > deadline:
            raise _TimeoutError(f"rank {st.rank}: start-up barrier not reached by all ranks")
        time.sleep(st.poll)
    results = []
    for g, (gen, draft) in enumerate(zip(job.runs, drafts, strict=True)):
        st.reset()
        if st.rank == 0:
            results.append(_head(st, model, draft, gen, first_run_id=g * 1_000_000))
        else:
            st.t0 = time.perf_counter()
            _worker(st, model, gen.draft is not None and gen.draft.needs_features())
            st.isend(_rank_stats(st), 0, STATS)
    st.finish()
    if st.rank == 0:
        out_path.write_text(json.dumps([r.to_json() for r in results]))


def main(argv: list[str] | None = None) -> int:
    """Entry point of one MPI rank: ``job.json out.json``.

    The job's drafts are resolved on every rank (:meth:`DraftSpec.from_json
    <hpcnb.speculative.contracts.DraftSpec.from_json>`), importing a user's draft module
    named by reference.
    """
    from mpi4py import MPI

    argv = sys.argv[1:] if argv is None else argv
    comm = MPI.COMM_WORLD
    try:
        job = JobSpec.from_json(json.loads(Path(argv[0]).read_text()))
        with pinned_threads(job.threads, numba=False):
            _run_rank(comm, job, Path(argv[1]))
        return 0
    except BaseException as err:  # any failure must end every rank, never hang
        sys.stderr.write(f"[hpcnb.speculative rank {comm.Get_rank()}] {err}\n")
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        comm.Abort(2)
        return 2


def run_pipeline_mpi(job: JobSpec, n_ranks: int = 2, timeout_s: float = 120.0) -> list[RunResult]:
    """Run a job's generations under one ``mpiexec -n n_ranks`` job; one result per run.

    Args:
        job: The model, its layer split and the generations (see
            :class:`~hpcnb.speculative.contracts.JobSpec`; ``JobSpec.from_json`` builds
            one from a dict).
        n_ranks: MPI ranks (pipeline stages); oversubscribed when above the core count.
        timeout_s: Wall-clock limit for the whole job.

    Raises:
        InvalidTypeError: ``job`` is not a :class:`~hpcnb.speculative.contracts.JobSpec`.
        InvalidInputError: ``n_ranks`` < 2.
        SpecError: A draft cannot be written to JSON (a class no other process can import).
        MPIRunError: Non-zero exit, timeout or missing result; the message holds the
            tail of the ranks' error output.
    """
    if not isinstance(job, JobSpec):
        raise InvalidTypeError(
            f"job must be a JobSpec (JobSpec.from_json(d) reads a dict), got {job!r}"
        )
    if n_ranks < 2:
        raise InvalidInputError(f"n_ranks={n_ranks}: the pipeline needs at least 2 ranks")
    with tempfile.TemporaryDirectory(prefix="hpcnb_spec_") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job.to_json()))
        program = [sys.executable, "-m", __name__, str(job_path), str(out_path)]
        run_mpi(program, n_ranks, timeout_s=timeout_s, threads=1)
        if not out_path.exists():
            raise MPIRunError(f"mpiexec -n {n_ranks}: the head rank wrote no result")
        return [RunResult.from_json(r) for r in json.loads(out_path.read_text())]


if __name__ == "__main__":
    raise SystemExit(main())
