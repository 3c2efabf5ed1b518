"""PipeInfer: pipelined speculative LLM inference over MPI ranks (notebook 04).

The core model is exported here; the simulator (:mod:`hpcnb.speculative.simulation`),
measurements and figures (:mod:`hpcnb.speculative.analysis`), stage building
(:mod:`hpcnb.speculative.stages`) and the draft registry
(:data:`~hpcnb.speculative.contracts.DRAFTS`, with the built-in kinds in
:mod:`hpcnb.speculative.drafts`, the feature-level draft head in
:mod:`hpcnb.speculative.feature_draft`) are imported from their modules.
"""

from hpcnb.speculative.contracts import GenerationSpec, JobSpec, RunResult, TransformerSpec
from hpcnb.speculative.drafts import (
    EarlyExitDraftSpec,
    NgramDraft,
    NgramDraftSpec,
    early_exit_draft,
    measure_acceptance,
)
from hpcnb.speculative.feature_draft import FeatureDraftSpec
from hpcnb.speculative.gguf_loader import GGUFFormatError, load_gguf
from hpcnb.speculative.head import STRATEGIES, HeadPolicy
from hpcnb.speculative.model import KVCache, LlamaConfig, LlamaModel
from hpcnb.speculative.runtime import run_pipeline_mpi
from hpcnb.speculative.tokenizer import BPETokenizer

__all__ = [
    # the target: a Llama decoder with a per-sequence KV cache, GGUF weights, its tokenizer
    "LlamaConfig",
    "LlamaModel",
    "KVCache",
    "load_gguf",
    "GGUFFormatError",
    "BPETokenizer",
    # drafts that guess the target's next tokens, and their acceptance
    "NgramDraft",
    "early_exit_draft",
    "measure_acceptance",
    # the head's launch / verify / cancel decisions
    "STRATEGIES",
    "HeadPolicy",
    # MPI jobs: the typed specification, the results, the runtime
    "TransformerSpec",
    "GenerationSpec",
    "NgramDraftSpec",
    "EarlyExitDraftSpec",
    "FeatureDraftSpec",
    "JobSpec",
    "RunResult",
    "run_pipeline_mpi",
]
