r"""A byte-level BPE tokenizer built from GGUF metadata (GPT-2 style, as SmolLM2 uses).

The GGUF file stores the vocabulary (``tokenizer.ggml.tokens``), the merge rules in rank
order (``tokenizer.ggml.merges``, each ``"left right"``) and token types (3 = control
token such as ``<|im_start|>``). Text is split into pieces by a pre-tokenizer regex, each
piece's UTF-8 bytes are mapped to printable characters (the GPT-2 byte alphabet), and
adjacent symbols are merged lowest rank first until no rule applies.

The pre-tokenizer follows SmolLM2's: every digit is its own piece, then the GPT-2 rule
(contractions, optional space + letters, optional space + punctuation, whitespace). Python's
``re`` has no ``\p{L}``; letters are approximated by ``[^\W\d_]``, which agrees on
the scripts SmolLM2 was trained on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from hpcnb.errors import InvalidInputError

__all__ = ["BPETokenizer", "byte_alphabet"]

_PIECE = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+|\d| ?(?:_|[^\s\w])+|\s+(?!\S)|\s+",
)


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """Return the GPT-2 map from byte values to printable unicode characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class BPETokenizer:
    """Byte-level BPE with merge ranks and control tokens.

    Args:
        tokens: Vocabulary, index = token id, in the byte alphabet.
        merges: Merge rules ``"left right"`` in rank order.
        control: Ids of control tokens (matched verbatim in text, never merged).
        bos_id: Beginning-of-sequence id.
        eos_id: End-of-sequence id.

    Raises:
        InvalidInputError: A merge rule is not ``"left right"``.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        control: Sequence[int] = (),
        bos_id: int | None = None,
        eos_id: int | None = None,
    ) -> None:
        self.tokens = list(tokens)
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.ranks: dict[tuple[str, str], int] = {}
        for r, rule in enumerate(merges):
            parts = rule.split(" ")
            if len(parts) != 2:
                raise InvalidInputError(f"BPE merge rule {r} is {rule!r}; expected 'left right'")
            self.ranks[(parts[0], parts[1])] = r
        self.control = {self.tokens[i]: i for i in control}
        self.bos_id, self.eos_id = bos_id, eos_id
        self._enc = byte_alphabet()
        self._dec = {c: b for b, c in self._enc.items()}
        alts = sorted(self.control, key=len, reverse=True)
        self._special = re.compile("(" + "|".join(map(re.escape, alts)) + ")") if alts else None
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        """Number of tokens."""
        return len(self.tokens)

    def _bpe(self, piece: str) -> list[int]:
        hit = self._cache.get(piece)
        if hit is not None:
            return hit
        syms = [self._enc[b] for b in piece.encode("utf-8")]
        while len(syms) > 1:
            best, best_rank = -1, None
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best < 0:
                break
            syms[best : best + 2] = [syms[best] + syms[best + 1]]
        out = []
        for s in syms:
            if s not in self.ids:
                raise InvalidInputError(
                    f"BPE symbol {s!r} of piece {piece!r} is not in the vocabulary"
                )
            out.append(self.ids[s])
        if len(self._cache) < 100_000:
            self._cache[piece] = out
        return out

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        """Return the token ids of ``text`` (control tokens written verbatim are kept).

        Args:
            text: The text.
            bos: Start with the beginning-of-sequence id (when the vocabulary has one).

        Raises:
            InvalidInputError: A symbol of the text is not in the vocabulary.
        """
        out: list[int] = [self.bos_id] if bos and self.bos_id is not None else []
        chunks = self._special.split(text) if self._special else [text]
        for chunk in chunks:
            if not chunk:
                continue
            if chunk in self.control:
                out.append(self.control[chunk])
                continue
            for piece in _PIECE.findall(chunk):
                out.extend(self._bpe(piece))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Return the text of ``ids`` (invalid UTF-8 is replaced, not dropped silently).

        Raises:
            InvalidInputError: An id is outside the vocabulary.
        """
        buf = bytearray()
        parts: list[str] = []
        for i in ids:
            if not 0 <= int(i) < len(self.tokens):
                raise InvalidInputError(
                    f"token id {i} outside the vocabulary [0, {len(self.tokens)})"
                )
            tok = self.tokens[int(i)]
            if tok in self.control:
                parts.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                parts.append(tok)
                continue
            buf.extend(self._dec.get(ch, ord("?")) for ch in tok)
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)

    def chat_prompt(self, user: str) -> list[int]:
        """Return ids of a one-turn chat prompt in the ChatML format of SmolLM2-Instruct."""
        return self.encode(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")

    def chat(self, user: str, assistant: str) -> list[int]:
        """Return ids of a whole one-turn conversation: the chat prompt, the reply, its end.

        Args:
            user: The user's message.
            assistant: The assistant's reply.
        """
        return self.chat_prompt(user) + self.encode(f"{assistant}<|im_end|>")
