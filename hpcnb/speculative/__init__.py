"""PipeInfer: pipelined speculative LLM inference over MPI ranks (notebook 04)."""

from hpcnb.launch import MPIRunError
from hpcnb.speculative.drafts import ModelDraft, NgramDraft, early_exit_draft, measure_acceptance
from hpcnb.speculative.gguf_loader import GGUFFormatError, load_gguf, read_config, smollm2_path
from hpcnb.speculative.head import STRATEGIES, HeadPolicy, Run
from hpcnb.speculative.model import KVCache, LayerWeights, LlamaConfig, LlamaModel, tiny_config
from hpcnb.speculative.runtime import run_pipeline_mpi
from hpcnb.speculative.stages import model_from_spec
from hpcnb.speculative.tokenizer import BPETokenizer

__all__ = [
    "STRATEGIES",
    "BPETokenizer",
    "GGUFFormatError",
    "HeadPolicy",
    "KVCache",
    "LayerWeights",
    "LlamaConfig",
    "LlamaModel",
    "MPIRunError",
    "ModelDraft",
    "NgramDraft",
    "Run",
    "early_exit_draft",
    "load_gguf",
    "measure_acceptance",
    "model_from_spec",
    "read_config",
    "run_pipeline_mpi",
    "smollm2_path",
    "tiny_config",
]
