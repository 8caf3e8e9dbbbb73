"""What the bench command lines share: their input files and their argument errors.

Every argument is checked before anything loads, through the engine's own checks (engine.config,
engine.models.sources.check_source); a bad one ends the program with exit status 2 and one line naming it,
the way argparse reports its own errors, never a traceback.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path

from engine.errors import EngineError
from engine.models.prompt import check_text

# what a bad argument raises: a setting the engine refuses (EngineError is a ValueError), a file that cannot be
# read, a malformed line
ARGUMENT_ERRORS = (ValueError, OSError)


def fail(parser: argparse.ArgumentParser, message: str):
    """Exit 2 with ``prog: error: message`` on one line (argparse's own errors also print the usage)."""
    parser.exit(2, f"{parser.prog}: error: {' '.join(message.split())}\n")


@contextmanager
def arguments_checked(parser: argparse.ArgumentParser):
    """Turn what the checks inside the block raise into :func:`fail`."""
    try:
        yield
    except ARGUMENT_ERRORS as err:
        fail(parser, _sentence(err))


def _sentence(err: Exception) -> str:
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return str(err) if isinstance(err, EngineError) or str(err) else type(err).__name__


def read_jsonl(path: str | Path, keys: Iterable[str]) -> list[dict]:
    """Each non-blank line of ``path``: a JSON object holding ``keys``. OSError when the file cannot be read,
    ValueError naming the line that is not such an object."""
    rows, keys = [], tuple(keys)
    for i, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{i}: not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1})") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{i}: not JSON ({err.msg})") from None
        if not isinstance(row, dict) or not set(keys) <= row.keys():
            raise ValueError(f"{path}:{i}: each line needs a JSON object with the keys {', '.join(keys)}")
        for key, value in row.items():
            if isinstance(value, str):
                try:
                    check_text(value, f"its {key!r}")
                except EngineError as err:
                    raise ValueError(f"{path}:{i}: {err}") from None
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no lines to read")
    return rows


def whole_number_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``low`` (for the bench's own sizes; engine settings are checked
    by engine.config)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {text!r}")
        return value
    return parse
