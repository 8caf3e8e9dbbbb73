"""Real text the machine has offline, in prompt-sized pieces, embedded by the app's embedder: the distractors of the
semantic cache's recall bench (bench/cache/recall.py).

Random 384-d vectors are the worst case for HNSW and say little about users' prompts. The pieces here are the
docstrings and comments of the Python sources installed on this machine (the standard library and every
installed package), split into sentences and joined up to a prompt's length, without duplicates. The order is
fixed (sorted files), so the same installation gives the same corpus. The embeddings are kept in a ``.npz`` file
beside the texts: embedding a million pieces takes most of an hour on 2 cores, and is done once.
"""
from __future__ import annotations

import ast
import io
import re
import sysconfig
import tokenize
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

MIN_WORDS, MAX_WORDS = 5, 40  # a piece: one or more sentences, as long as a short prompt
MAX_CHARS = 240
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_WORDS = re.compile(r"[A-Za-z][A-Za-z'-]+")


def source_roots() -> list[Path]:
    """The standard library and the installed packages (``purelib`` and ``platlib``), each once."""
    paths = sysconfig.get_paths()
    return sorted({Path(paths[k]).resolve() for k in ("stdlib", "purelib", "platlib") if k in paths})


def _texts_of(source: str) -> Iterator[str]:
    """The docstrings and the comments of one Python file."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield doc
    block, last = [], -2  # a comment running over consecutive lines is one text
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type != tokenize.COMMENT:
                continue
            if tok.start[0] != last + 1 and block:
                yield " ".join(block)
                block = []
            block.append(tok.string.lstrip("#").strip())
            last = tok.start[0]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    if block:
        yield " ".join(block)


def _pieces(text: str) -> Iterator[str]:
    """Prose pieces of ``text``: paragraphs split into sentences, joined while they fit; code and tables left out."""
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in paragraph.splitlines()]
        if any(ln.startswith((">>>", "...", "$", "|", "+-", "..")) for ln in lines):
            continue  # examples and tables: not what people write in a chat
        piece = ""
        for sentence in _SENTENCE.split(" ".join(ln for ln in lines if ln)):
            joined = f"{piece} {sentence}".strip()
            if piece and len(joined) > MAX_CHARS:
                yield piece
                joined = sentence
            piece = joined
        if piece:
            yield piece


def _prose(piece: str) -> bool:
    words = _WORDS.findall(piece)
    return MIN_WORDS <= len(words) <= MAX_WORDS and len(" ".join(words)) >= 0.6 * len(piece)


def text_pieces(limit: int, roots: list[Path] | None = None, progress: bool = True) -> list[str]:
    """Up to ``limit`` distinct prose pieces from the Python files under ``roots`` (default: this installation)."""
    seen: set[str] = set()
    out: list[str] = []
    files = sorted(p for root in (roots or source_roots()) for p in root.rglob("*.py"))
    with tqdm(total=limit, desc="real-text pieces", unit="piece", disable=not progress) as bar:
        for path in files:
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            for text in _texts_of(source):
                for piece in _pieces(text):
                    key = " ".join(piece.lower().split())
                    if key in seen or not _prose(piece):
                        continue
                    seen.add(key)
                    out.append(piece)
                    bar.update(1)
                    if len(out) >= limit:
                        return out
    return out


def embedded_corpus(limit: int, path: Path, embedder, batch: int = 256,
                    progress: bool = True) -> tuple[list[str], np.ndarray]:
    """(pieces, their unit embeddings (n, d) float32), read from ``path`` when it holds at least ``limit`` of
    them, else made and saved there. ``embedder``: the app's (``encode(texts) -> (n, d)``)."""
    from engine.cache.embedder import normalise_rows

    path = Path(path)
    if path.exists():
        with np.load(path, allow_pickle=False) as saved:
            texts, vectors = [str(t) for t in saved["texts"]], saved["vectors"]
        if len(texts) >= limit:
            return texts[:limit], vectors[:limit]
    texts = text_pieces(limit, progress=progress)
    parts = [normalise_rows(embedder.encode(texts[i:i + batch])).astype(np.float32)
             for i in tqdm(range(0, len(texts), batch), desc="embedding", unit="batch", disable=not progress)]
    vectors = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, texts=np.array(texts), vectors=vectors)
    return texts, vectors
