"""Fakes and hand-made events shared by the app's tests: engines that replay events, with no models.

Every fake engine here has the whole EngineSurface and nothing more; tests/serve/test_engine_surface.py checks each
against the Protocol (``surface_problems``), so an app that called anything else on the engine would fail there.
"""
from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

from engine.config import DEFAULT_CACHE, CacheConfig
from engine.errors import EmptyPromptError, InvalidSettingError
from engine.events import Acceptance, CacheEvent, Candidate, Candidates, DoneEvent, StatsEvent, TokenEvent
from engine.lab.grid import DOCTOR_KINDS
from engine.lab.results import DoctorReport, LabUpdate, PromptRun, cell_row
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.costs.costmodel import StepCosts, break_even_alpha
from engine.surface import CacheEntry, CacheInfo, CacheStats, PairInfo, TargetSpeed

SCRIPT = "<script>alert(1)</script>"
IMG = '<img src=x onerror="alert(1)">'
ACCEPTANCE_FIELDS = frozenset(f.name for f in fields(Acceptance))
FAKE_SPEED = TargetSpeed(tokens_per_s=8.0, decode_tokens_per_s=10.0, first_token_s=0.9, tokens=32,
                         how=f"a fake's speed {SCRIPT}")


def tok(text="a", kind="accepted", **kw):
    base = dict(token_id=1, text=text, kind=kind, step=2, t=0.1, p_target=0.9, q_draft=0.8, draft_pos=0)
    return TokenEvent(**{**base, **kw})


def stats(**kw):
    """A StatsEvent; keywords of its Acceptance (``steps``, ``accepted``, ...) go to that."""
    counts = dict(steps=4, proposed=16, accepted=8, accepted_by_pos=(4, 2, 1, 1), proposed_by_pos=(4, 4, 4, 4))
    counts.update({name: kw.pop(name) for name in [n for n in kw if n in ACCEPTANCE_FIELDS]})
    base = dict(new_tokens=12, elapsed_s=2.0, k=4, draft_s=0.4, verify_s=1.2, acceptance=Acceptance(**counts),
                first_token_s=0.9)  # 6 tok/s end to end, 10 tok/s decoding
    return StatsEvent(**{**base, **kw})


def done(ids=(1, 2), s=None, reason="eos"):
    return DoneEvent(reason, "ab", tuple(ids), s or stats())


def toks(*pieces, kinds=("accepted", "corrected", "bonus", "plain")):
    """One token per piece, the kinds in turn; each corrected one carries a rejected draft token "RJ"."""
    return [tok(text, kinds[i % len(kinds)], token_id=i, step=i, rejected_text="RJ" if i % len(kinds) == 1 else None)
            for i, text in enumerate(pieces)]


def assert_inert(html: str):
    lowered = html.lower()
    assert "<script" not in lowered and "<img" not in lowered


def named(record_type, **components):
    """A tab's component record whose components are their own field names (``components`` replaces some):
    the handlers' updates, keyed by component, then read by name (``update["summary"]``)."""
    return record_type(**{**{f.name: f.name for f in fields(record_type)}, **components})


def div_dict(margin=0.125, within=True, other_text="<img src=x onerror=alert(1)>"):
    return {"position": 12, "reference_token": 304, "other_token": 7923, "reference_text": " n",
            "other_text": other_text, "top_logit": 18.375, "top2_margin": margin, "tokens_gap": margin,
            "precision": "bf16", "rounding_step": 0.125, "within_rounding": within}


LAB_COSTS = StepCosts(verify_fixed_s=0.05, verify_per_token_s=0.004, draft_per_token_s=0.012)


def fake_experiment(grid, cancel):
    """Each cell: its prompts accepted 3 of 4 draft tokens per step, at a speed that grows with k."""
    cells = grid.cells()
    yield LabUpdate(0, len(cells), f"{len(cells)} cells")
    rows = []
    for i, cell in enumerate(cells):
        if cancel is not None and cancel.is_set():
            break
        k = 4 if cell.k == "adaptive" else cell.k
        accepted = Acceptance(steps=1, proposed=k, accepted=k - 1, rejected_steps=1,
                              accepted_by_pos=(1,) * (k - 1) + (0,), proposed_by_pos=(1,) * k)
        runs = [PromptRun(token_ids=(1, 2, 3, 4), seconds=1.0 / k, acceptance=accepted)]
        base = [PromptRun(token_ids=(1, 2, 3, 4), seconds=1.0)]
        fidelity = {"n_tokens": 40, "chi2": 3.0, "p_value": 0.5, "counts": [8] * 5, "passed": True}
        rows.append(cell_row(grid, cell, runs, base, LAB_COSTS, None if cell.temperature == 0 else fidelity))
        yield LabUpdate(i + 1, len(cells), f"Done: {cell.key}", row=rows[-1])
    yield LabUpdate(len(rows), len(cells), "end", result={
        "version": 1, "created": "2026-11-30T20:00:00Z", "seconds": 1.0, "grid": grid.to_dict(),
        "machine": {"cpu": SCRIPT, "kind": "test", "threads": 2, "torch": "x"}, "stopped": len(rows) < len(cells),
        "rows": rows, "prompts": {s: list(grid.set_prompts(s)) for s in grid.all_sets()}, "step_costs": []})


def fake_doctor(kinds):
    return DoctorReport(target="t", draft=IMG, target_precision="bf16", draft_precision="nf4", vocab_same=True,
                        vocab_sizes=(49152, 49152), template_same=False, template_note="differ",
                        memory_gb={"bf16": {"target": 0.27, "draft": 0.27}}, kv_mb_per_1k_tokens={"target": 9.0,
                                                                                                  "draft": 9.0},
                        t_draft_s=0.012, t_verify_s={1: 0.054, 8: 0.082}, costs=LAB_COSTS,
                        break_even={k: break_even_alpha(LAB_COSTS, k) for k in (1, 2, 4, 8)},
                        probes={kind: {"alpha": 0.7, "prompts": 3, "tokens": 24, "best_k": 4,
                                       "predicted": {k: LAB_COSTS.speedup(0.7, k) for k in (1, 2, 4, 8)}}
                                for kind in kinds})


class FakeEngine:
    """Replays hand-made events; its cache holds one hostile entry. The whole EngineSurface, nothing else (see
    test_fakes_and_the_engine_have_exactly_the_surface)."""

    def __init__(self, events, cache: bool = True):
        self.events = events
        self.calls = []
        self.entries = [CacheEntry("k1", SCRIPT, IMG, 0.0)] if cache else None
        self.verify_mode = "identical"  # a pair identical only up to some width: the choice is offered
        self.measuring = False  # True: the pair's figures are still being measured (no speed, no verify choice)

    def load_pair(self, target=DEFAULT_TARGET, draft=DEFAULT_DRAFT, target_precision=None, draft_precision=None):
        self.calls.append(dict(load=(target, draft, target_precision, draft_precision)))
        return self.info()

    def info(self):
        pair = PairInfo(target="t", draft="d", target_precision="bf16", draft_precision="nf4", device="cpu")
        if self.measuring:
            return PairInfo(**{**pair.__dict__, "measuring": True, "identity_note": "measuring"})
        return PairInfo(**{**pair.__dict__, "verify_mode": self.verify_mode,
                           "verify_note": f"verify widths: {SCRIPT} default identical",
                           "target_speed": FAKE_SPEED, "checks_note": "measured 2026-01-01 00:00 while it was quiet"})

    def use_models(self, target, draft):
        self.calls.append(dict(use_models=(target, draft)))

    @property
    def target(self):
        """A fake replays events: it holds no model."""
        return None

    @property
    def draft(self):
        return None

    def encode(self, messages):
        """A token per character of the messages' contents (the chat template left out)."""
        return [ord(c) for m in messages for c in m["content"]]

    def remeasure(self):
        self.calls.append(dict(remeasure=True))
        return self.info()

    def wait_measured(self, timeout=None):
        self.measuring = False
        return self.info()

    def set_verify_mode(self, mode):
        if mode not in ("identical", "fastest"):
            raise InvalidSettingError(f"verify mode must be one of identical, fastest, not {mode!r}")
        self.calls.append(dict(verify=mode))
        self.verify_mode = mode
        return self.info()

    def generate(self, messages, sampling, spec, *, cache=CacheConfig(), cancel=None, prediction="", memory_scope=""):
        self.calls.append(dict(messages=messages, sampling=sampling, spec=spec, cache=cache, cancel=cancel,
                               prediction=prediction, memory_scope=memory_scope))
        if not messages[-1]["content"].strip():
            raise EmptyPromptError("the message is empty")
        yield from self.events

    def generate_reference(self, messages, sampling, cancel=None):
        yield tok("x", "plain")
        yield done((1,), stats(new_tokens=32, elapsed_s=4.0, first_token_s=0.9))  # 8 tok/s, decode 10 tok/s

    def explain_divergence(self, messages, reference_ids, other_ids):
        return None

    def prove_fp32(self, messages, sampling, spec):
        self.proved = (messages, sampling.greedy, spec.k)
        return SimpleNamespace(identical=True, n_tokens=2, divergence=None, seconds=1.25, load_seconds=0.0,
                               to_dict=lambda: {"identical": True})

    def run_experiment(self, grid, cancel=None):
        """Hand-made cells (fake_experiment): one row per cell, Stop honoured between cells."""
        self.calls.append(dict(grid=grid, cancel=cancel))
        yield from fake_experiment(grid, cancel)

    def pair_doctor(self, kinds=DOCTOR_KINDS, probe_tokens=24, cancel=None):
        self.calls.append(dict(doctor=kinds))
        return fake_doctor(kinds)

    def cache_info(self):
        return CacheInfo(available=self.entries is not None, threshold=0.9, backend="redis://:***@<b>host</b>:1/0")

    def cache_stats(self):
        if self.entries is None:
            return None
        return CacheStats(entries=len(self.entries), lookups=4, hits={"exact": 1, "verified": 1}, misses=2,
                          hit_rate=0.5, time_saved_s=2.5)

    def cache_entries(self, limit=50):
        return (self.entries or [])[:limit]

    def cache_delete(self, key):
        if key not in [e.key for e in self.entries or []]:
            return False
        self.entries = [e for e in self.entries if e.key != key]
        return True

    def cache_clear(self):
        self.entries = [] if self.entries is not None else None

    def memory_clear(self):
        self.memory_cleared = True


class RaceEngine(FakeEngine):
    """A race whose answers differ at token 1, explained as a tie (and the fake's fp32 proof)."""

    def explain_divergence(self, messages, reference_ids, other_ids):
        self.explained = (reference_ids, other_ids)
        d = div_dict()
        return SimpleNamespace(**{k: v for k, v in d.items() if k != "within_rounding"}, within_rounding=True,
                               to_dict=lambda: d)


PIECES = [("Hello", "accepted"), (" wor", "corrected"), ("ld", "bonus"), ("! END", "accepted"), (" more", "plain")]


def piece(text, kind="accepted", i=0, candidates=None):
    """A token as the OpenAI routes' tests make them: token id and step ``i``, p_target 0.5, q_draft 0.25. With
    ``candidates`` (the sampling's), spelled as itself with that many alternatives "alt0", … at p 0.25, 0.125, …"""
    spelled = None
    if candidates is not None:
        top = tuple(Candidate(100 + j, f"alt{j}", tuple(f"alt{j}".encode()), 0.25 / 2**j) for j in range(candidates))
        spelled = Candidates(Candidate(i, text, tuple(text.encode()), 0.5), top)
    return TokenEvent(token_id=i, text=text, kind=kind, step=i, t=0.0, p_target=0.5, q_draft=0.25,
                      candidates=spelled)


class PiecesEngine(FakeEngine):
    """Replays PIECES, honours cancel between tokens, records what it was asked. The prompt's length comes on
    the DoneEvent only: the API must not read the prompt apart from the generation."""
    PROMPT_TOKENS = 3

    def __init__(self):
        super().__init__([], cache=False)

    def info(self):
        return PairInfo(target="tgt", draft="drf", target_precision="bf16", draft_precision="nf4", device="cpu")

    def generate(self, messages, sampling, spec, *, cache=DEFAULT_CACHE, cancel=None, prediction="", memory_scope=""):
        self.calls.append(dict(messages=messages, sampling=sampling, spec=spec, cache=cache, prediction=prediction,
                               memory_scope=memory_scope))
        if not messages[-1]["content"].strip():
            raise EmptyPromptError("the message is empty: type something to ask")
        yield CacheEvent("off")
        ids = []
        for i, (text, kind) in enumerate(PIECES):
            if cancel is not None and cancel.is_set():
                break
            ids.append(i)
            yield piece(text, kind, i, sampling.candidates)
        stats_ = StatsEvent(new_tokens=len(ids), elapsed_s=0.1, k=4, acceptance=Acceptance(steps=2, proposed=4,
                                                                                          accepted=3))
        reason = "cancelled" if len(ids) < len(PIECES) else "length"
        yield DoneEvent(reason, "".join(t for t, _ in PIECES[:len(ids)]), tuple(ids), stats_,
                        prompt_tokens=self.PROMPT_TOKENS)
