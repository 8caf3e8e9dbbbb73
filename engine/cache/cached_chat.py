"""The semantic cache in front of generation, as its steps: scope, lookup, serving a hit, storing a finished
answer, forgetting an entry the target refuted. Each is one call with an effect, made as a statement."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from engine.config import CacheConfig, SamplingConfig
from engine.events import CacheEvent, Event
from engine.models.loading import LoadedModel
from engine.cache.semantic_cache import CacheHit, SemanticCache, make_scope
from engine.decode.stream import StatsTracker, TokenStream


def _cacheable(sampling: SamplingConfig) -> bool:
    """Greedy answers, or seeded samples, are reproducible; an unseeded sample is a fresh draw each time."""
    return sampling.greedy or sampling.seed is not None


def chat_scope(target: LoadedModel, sampling: SamplingConfig, messages: list[dict]) -> str:
    """Everything besides the last prompt that shapes the answer (the draft model does not)."""
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    history = [m for m in messages[:-1] if m["role"] != "system"]
    return make_scope(target.name, target.precision, sampling, system, history)


def lookup(cache: SemanticCache | None, target: LoadedModel, messages: list[dict], sampling: SamplingConfig,
           config: CacheConfig, judge=None, judge_note: str = "") -> tuple[CacheHit, CacheEvent, str | None]:
    """(hit, event, scope). The scope is computed once here and handed to :func:`remember`; it is None when
    the cache takes no part in this request (off, or an unseeded sample), and then nothing is stored either.
    Entries whose token ids fall outside the target's vocabulary are skipped (a hostile or stale entry).
    ``judge_note`` (why there is no judge) is added to the reason of a hit that direct mode verifies."""
    if cache is None or config.mode == "off":
        return CacheHit("miss"), CacheEvent("off", reason="cache is off"), None
    if not _cacheable(sampling):
        return (CacheHit("miss"), CacheEvent("off", reason="sampling without a seed: every answer is a fresh draw"),
                None)
    scope = chat_scope(target, sampling, messages)
    hit = cache.lookup(messages[-1]["content"], scope, config, vocab_size=target.vocab_size, judge=judge)
    if judge_note and config.mode == "direct" and hit.outcome == "verified":
        hit = replace(hit, reason="; ".join(filter(None, (hit.reason, judge_note))))
    return hit, hit.to_event(), scope


def serve(hit: CacheHit, stream: TokenStream, cache: SemanticCache) -> Iterator[Event]:
    """Replay a cached answer's tokens (kind ``cached``): no model runs."""
    stats = StatsTracker(proposer="cache")
    for token in hit.answer_token_ids:
        event = stream.emit(token, "cached", 0)
        if event is not None:
            yield event
        if stream.finish_reason:
            break
    stream.finish_reason = stream.finish_reason or "eos"
    done = stream.done(stats.snapshot(len(stream.token_ids)))
    cache.record_saved(max(0.0, float((hit.meta or {}).get("seconds", 0.0)) - done.stats.elapsed_s))
    yield done


def remember(cache: SemanticCache | None, scope: str | None, messages: list[dict], done) -> bool:
    """Store a finished answer under the scope :func:`lookup` returned. Cancelled or truncated answers, and
    requests the cache took no part in (``scope`` None), are never stored. Never raises: a failed write is
    the cache's warning, not the answer's failure."""
    if cache is None or scope is None:
        return False
    return cache.store(messages[-1]["content"], scope, done.text, done.token_ids,
                       complete=done.finish_reason == "eos",
                       meta={"seconds": done.stats.elapsed_s, "tokens": len(done.token_ids)})


def forget(cache: SemanticCache | None, hit: CacheHit) -> None:
    """Delete the entry behind ``hit`` (one the target refuted, and that no complete answer replaced)."""
    if cache is not None and hit.entry_key:
        cache.delete(hit.entry_key)
