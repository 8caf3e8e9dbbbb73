"""What the app asks of the loaded pair besides answers: where two answers part and why, and the fp32 proof.

The fp32 proof calls the decoders directly on fp32 copies of the pair (engine/start/decoders.py): no second engine,
no step-cost measurement per proof (the k policy starts without a prior; greedy output does not depend on k).
"""
from __future__ import annotations

import time

from engine.config import SamplingConfig, SpecConfig
from engine.divergence import Divergence, Fp32Proof, first_divergence
from engine.events import final_done
from engine.models.loading import LoadedModel
from engine.serve.generation import encode
from engine.serve.model_lock import ModelLock
from engine.serve.pair_slot import Pair
from engine.start.decoders import start_reference, start_speculative


def explain(pair: Pair, lock: ModelLock, messages: list[dict], reference_ids: list[int],
            other_ids: list[int]) -> Divergence | None:
    """Where ``other_ids`` first leaves the target-only ``reference_ids``, and the target's margin there."""
    prompt_ids = encode(pair, messages)
    return lock.run([pair.target], "while explaining a divergence",
                    lambda: first_divergence(pair.target, prompt_ids, list(reference_ids), list(other_ids)))


def prove_fp32(pair: Pair, copies: tuple[LoadedModel, LoadedModel], load_s: float, lock: ModelLock,
               messages: list[dict], sampling: SamplingConfig, spec: SpecConfig) -> Fp32Proof:
    """Target-only and speculative again with the fp32 ``copies`` of ``pair``, cache off, under the model lock:
    nothing else runs on the models meanwhile."""
    target, draft = copies
    prompt_ids = encode(pair, messages)

    def both() -> tuple[list[int], list[int], float, Divergence | None]:
        start = time.perf_counter()
        reference = list(final_done(start_reference(target, prompt_ids, sampling)).token_ids)
        other = list(final_done(start_speculative(target, draft, prompt_ids, sampling, spec)).token_ids)
        seconds = time.perf_counter() - start
        return reference, other, seconds, first_divergence(target, prompt_ids, reference, other)

    reference, other, seconds, divergence = lock.run(copies, "while proving in fp32", both)
    return Fp32Proof(identical=reference == other, n_tokens=len(reference), divergence=divergence, seconds=seconds,
                     load_seconds=load_s, target=pair.target.name, draft=pair.draft.name)
