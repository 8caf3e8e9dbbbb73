"""How long one streaming update of the answer HTML takes: ``python -m bench.speed.render [--tokens 500]``.

A synthetic answer (prose, a list, a fenced Python block) is cut into tokens of 1-6 characters with mixed
kinds; the answer is re-rendered (both views, as the chat does once per speculation step) every ``--every``
tokens. Prints the mean and the worst milliseconds per update, and the update at full length.
"""
from __future__ import annotations

import argparse
import time

from app.turn import Turn
from engine.events import TOKEN_KINDS, TokenEvent

PROSE = ("Here is a **prime check** in Python. It tries every divisor up to the square root of `n`, so it runs "
         "in *O(sqrt n)* time.\n\n- small numbers are handled first\n- even numbers stop at once\n\n")
CODE = ("```python\ndef is_prime(n: int) -> bool:\n    \"\"\"True when n is prime.\"\"\"\n    if n < 2:\n"
        "        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n"
        "            return False\n    return True\n```\n\n")


def synthetic_tokens(n_tokens: int) -> list[TokenEvent]:
    text = ""
    while len(text) < n_tokens * 6:
        text += PROSE + CODE
    tokens, pos, i = [], 0, 0
    while len(tokens) < n_tokens:
        size = 1 + (i * 7) % 6
        kind = TOKEN_KINDS[(i * 5) % 4]  # accepted, corrected, bonus, plain
        tokens.append(TokenEvent(token_id=i, text=text[pos:pos + size], kind=kind, step=i // 4, t=0.0,
                                 p_target=0.9, q_draft=0.5, rejected_text="x" if kind == "corrected" else None))
        pos, i = pos + size, i + 1
    return tokens


def time_updates(tokens: list[TokenEvent], every: int) -> list[float]:
    """Seconds per update: the whole answer so far rendered once per ``every`` tokens."""
    turn, times = Turn(), []
    for i, ev in enumerate(tokens, 1):
        turn.tokens.append(ev)
        if i % every == 0 or i == len(tokens):
            start = time.perf_counter()
            turn.html(streaming=True)
            times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.render", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--every", type=int, default=3, help="tokens per update (about one speculation step)")
    args = parser.parse_args(argv)
    tokens = synthetic_tokens(args.tokens)
    times = time_updates(tokens, args.every)
    ms = [t * 1000 for t in times]
    last = ms[-len(ms) // 10:]  # the last tenth of the stream: the longest answers
    print(f"{len(ms)} updates of a {args.tokens}-token answer ({sum(len(t.text) for t in tokens)} characters): "
          f"mean {sum(ms) / len(ms):.1f} ms, median {sorted(ms)[len(ms) // 2]:.1f} ms, worst {max(ms):.1f} ms; "
          f"last tenth (450+ tokens) median {sorted(last)[len(last) // 2]:.1f} ms per update")


if __name__ == "__main__":
    main()
