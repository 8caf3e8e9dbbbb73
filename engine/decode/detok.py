"""Incremental detokenisation that never splits a multi-byte character (same idea as TGI / vLLM), and a token
spelled on its own (its bytes), for what a request asks about each position (engine.events.Candidates)."""
from __future__ import annotations

import re

from engine.events import Candidate


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self._pieces: list[str] = []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is still partial)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self._pieces.append(after[len(before):])
            return self._pieces[-1]
        return ""

    def text(self) -> str:
        """Everything ``push`` returned, joined: a character cut off by the length limit is left out (no U+FFFD)."""
        return "".join(self._pieces)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a byte-level BPE vocabulary
    (printable Latin-1 bytes for themselves, the others shifted to U+0100 and up)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = (b for b in range(256) if b not in printable)
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(shifted)}}


BYTE_ALPHABET = _byte_alphabet()
BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


def is_byte_level(tokenizer) -> bool:
    """A byte-level BPE tokenizer (GPT-2, Qwen, SmolLM2): its decoder maps the byte alphabet back to bytes."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return decoder is not None and "ByteLevel" in repr(decoder)


class TokenSpeller:
    """A token on its own: its bytes and its text. A byte-level BPE token spells each byte (half a character keeps
    its bytes); SentencePiece's ``<0xHH>`` tokens are that byte; any other token (a special or added one, a
    SentencePiece word) is its decoded text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = is_byte_level(tokenizer)
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", None) or ())

    def utf8(self, token_id: int) -> bytes:
        to_piece = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        piece = to_piece(token_id) if to_piece is not None and token_id not in self.special_ids else None
        if piece and self.byte_level and all(ch in BYTE_ALPHABET for ch in piece):
            return bytes(BYTE_ALPHABET[ch] for ch in piece)
        fallback = BYTE_FALLBACK.fullmatch(piece) if piece else None
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        return self.tokenizer.decode([token_id], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False).encode("utf-8")

    def candidate(self, token_id: int, p_target: float | None) -> Candidate:
        utf8 = self.utf8(token_id)
        return Candidate(token_id, utf8.decode("utf-8", errors="replace"), tuple(utf8), p_target)
