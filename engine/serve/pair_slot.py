"""The loaded pair's lifecycle: load (or reuse) both models, install them as one value, let go of what only the
previous pair used, and keep what belongs to the pair: its paraphrase judge and its fp32 copies.

Loading a new pair leaves the old one in place until the new one has loaded and passed the pair check; the
switch is one assignment and never waits for a generation (a request reads the pair once).
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.cache.judge import LLMJudge, judge_for, uncalibrated_note
from engine.config import AUTO
from engine.errors import InvalidSettingError, NoPairError
from engine.models.catalog import cache_dir_of
from engine.models.devices import check_target_precision, gpu_bytes, release_memory
from engine.models.auto import describe, plan_precisions
from engine.models.hardware import detect_machine
from engine.models.loading import (LoadedModel, check_pair, check_pair_sources, load_model, runner_name,
                                   with_gguf_settings)
from engine.models.load_checks import LoadChecks
from engine.serve.kept_figures import store_for
from engine.serve.measuring import Measurer
from engine.serve.model_lock import ModelLock
from engine.serve.verify_mode import FASTEST, VerifyChoice, app_settings, check_mode, target_settings, verify_choice
from engine.costs.costmodel import StepCosts
from engine.surface import PairInfo

log = logging.getLogger(__name__)

PAIR_ROLES = ("target", "draft")


@dataclass(frozen=True)
class Pair:
    """The loaded models as one value: swapped in one assignment, read once per request."""
    target: LoadedModel
    draft: LoadedModel
    precision_note: str  # what auto chose (or the user) on this machine, and why: plan_precisions' sentence
    # measured on this machine beside serving (engine/serve/measuring.py): the step costs the adaptive k starts from,
    # the identity check, the target-only speed; None while they are measured (an adaptive k waits for them)
    checks: LoadChecks | None = None
    verify: VerifyChoice = VerifyChoice()  # identical or fastest, where identity holds only up to some width

    @property
    def models(self) -> tuple[LoadedModel, LoadedModel]:
        return self.target, self.draft

    @property
    def costs(self) -> StepCosts | None:
        return self.checks.costs if self.checks else None

    def info(self) -> PairInfo:
        head = PairInfo(self.target.name, self.draft.name, self.target.precision, self.draft.precision,
                        str(self.target.device), self.precision_note, runner=runner_name(self.target))
        checks = self.checks
        if checks is None:
            return replace(head, measuring=True, identity_note=MEASURING_NOTE)
        identity = checks.identity
        return replace(head, costs=checks.costs, bit_identical=identity.identical, identity_note=identity.describe(),
                       identity_drift_steps=identity.max_drift_steps, target_speed=checks.speed,
                       checks_note=checks.note(), checks_flagged=bool(checks.busy),
                       verify_mode=self.verify.mode if self.verify.offered else "",
                       verify_note=" · ".join(n for n in (self.verify.note, self.verify.runner) if n),
                       identity_width_cap=self.verify.cap)


MEASURING_NOTE = ("measuring on this machine while the app is idle: the identity check, the verify costs and the "
                  "target-only speed; until then an adaptive k runs target-only steps")


@dataclass(frozen=True)
class Judging:
    """The paraphrase judge of a direct-mode lookup, or None; ``note`` says why there is none (or is empty)."""
    judge: LLMJudge | None = None
    note: str = ""


NO_JUDGE = Judging()


def _kept(loaded: LoadedModel | None, name: str, precision: str) -> LoadedModel | None:
    """``loaded`` where a load asks for it again: the same name and precision, not run with fastest's settings."""
    same = loaded is not None and (loaded.name, loaded.precision) == (name, precision)
    return loaded if same and (app_settings(loaded) or not hasattr(loaded.backend, "settings")) else None


class PairSlot:
    def __init__(self, lock: ModelLock, cache_dir: Path | None = None, paraphrase_judge: bool = True,
                 beside: bool = True):
        self.cache_dir = cache_dir  # converted weights (engine/models/catalog.py); None: catalog.cache_root()
        self.paraphrase_judge = paraphrase_judge  # direct mode: the target judges near-hits (engine/cache/judge.py)
        self.pair: Pair | None = None
        self._load_lock = threading.RLock()  # one load at a time (a load's own measurement may switch the runner)
        self._swap = threading.Lock()  # one change of the installed pair at a time (a load, its figures, a mode)
        self.store = store_for(cache_dir_of(cache_dir))  # quiet load-time figures kept between launches
        self.measurer = Measurer(lock, self.store, self._measured)
        self.beside = beside  # measure a loaded pair's figures beside serving (else before load returns)
        self._judge: tuple[LoadedModel, LLMJudge | None] | None = None  # (its target, the judge)
        self._fp32: dict[str, LoadedModel] = {}  # fp32 copies (on the CPU) for "prove it", by name; this pair's only
        self._asked: str | None = None  # the verify mode the user chose for this pair; None: the figures' default
        self._runner = ""  # what choosing fastest changed in the target's llama.cpp settings; "" when nothing
        self._switched_from: weakref.ref | None = None  # the target a mode switch replaced: reused while it lives
        self._follows = False  # the pair was loaded here: a measured default of fastest runs fastest's settings

    def require(self) -> Pair:
        pair = self.pair
        if pair is None:
            raise NoPairError("no models loaded yet: load a target and a draft first")
        return pair

    def load(self, target: str, draft: str, target_precision: str | None, draft_precision: str | None) -> Pair:
        """Load (or reuse) both models, check they can pair and install them; on any error the previous pair stays.
        The precisions are planned for the pair together; the tokenizers are compared before any weights load."""
        asked = {"target": (target.strip(), target_precision), "draft": (draft.strip(), draft_precision)}
        with self._load_lock:
            plan, kept = self._plan(asked)
            if None in kept.values():
                check_pair_sources(asked["target"][0], asked["draft"][0], self.cache_dir)
            models = [kept[role] or load_model(asked[role][0], plan.precisions[role], role=role,
                                               cache_dir=self.cache_dir, chosen_by_auto=asked[role][1] in (None, AUTO))
                      for role in PAIR_ROLES]
            return self.install(*models, note=plan.reason, beside=self.beside, follows=True)

    def _plan(self, asked: dict[str, tuple[str, str | None]]):
        """The pair's precisions, refused when the device cannot run them (what a switch reuses or frees counts as
        free memory), and per role the loaded model a switch keeps (same name and precision) or None."""
        current = self.pair
        plan = plan_precisions(asked, cache_dir=self.cache_dir,
                               reclaimable_bytes=gpu_bytes(list(current.models) if current else []))
        check_target_precision(plan.precisions["target"])
        held = dict(zip(PAIR_ROLES, current.models)) if current else {}
        return plan, {role: _kept(held.get(role), asked[role][0], plan.precisions[role]) for role in PAIR_ROLES}

    def install(self, target: LoadedModel, draft: LoadedModel, note: str = "", beside: bool = True,
                mode: str | None = None, runner: str = "", follows: bool = False) -> Pair:
        """Install loaded models: one assignment, after the pair check. The figures measured on this machine come
        from an earlier launch's (the same files and build) or are measured beside serving (``Measurer``; not
        ``beside``: now, in this thread): until they are in, the pair says so. ``note``: the plan's sentence (what
        auto chose and why); '' for models loaded elsewhere, which are described as they are. ``mode``: the verify
        mode asked for (a mode switch's); None: the figures' default. ``runner``: what that switch changed.
        ``follows``: a default of fastest runs fastest's settings (``_follow``): a pair loaded here, not models handed
        in (a test's, a benchmark's: run as given)."""
        check_pair(target, draft)
        note = note or describe(detect_machine(target.device.type), {"target": target.precision,
                                                                      "draft": draft.precision},
                                {r for r, m in zip(PAIR_ROLES, (target, draft)) if m.auto_precision}, [])
        kept = self.store.get((target, draft))
        pair = Pair(target, draft, note, kept, verify_choice(kept, mode, runner, app_settings(target)))
        with self._swap:
            self._asked, self._runner = mode, runner
            if mode is None:
                self._follows = follows
            follow = self._following(pair)  # kept figures that choose fastest: measuring until its settings run
            shown = replace(pair, checks=None, verify=VerifyChoice()) if follow else pair
            switched, self.pair = self.pair is not None, shown
        if switched:
            self._release_all_but(shown)
        if follow:
            self.measurer.stop()
            return self._follow(shown, pair, beside)
        if kept is not None:
            self.measurer.stop()
        elif beside:
            self.measurer.start(pair.models)
        else:
            self.measurer.now(pair.models)
            return self.require()
        return pair

    def _measured(self, models: tuple[LoadedModel, LoadedModel], checks: LoadChecks) -> bool:
        """The Measurer's figures for ``models``, installed in one assignment; False when another pair was loaded
        meanwhile (nothing changes)."""
        with self._swap:
            pair = self.pair
            if pair is None or pair.target is not models[0] or pair.draft is not models[1]:
                return False
            priced = replace(pair, checks=checks, verify=verify_choice(checks, self._asked, self._runner,
                                                                         app_settings(pair.target)))
            follow = self._following(priced)
            if not follow:
                self.pair = priced
        if follow:  # still measuring until fastest's settings run, here: the measuring thread or the loading one
            self._follow(pair, priced, beside=False)
        return True

    def _following(self, pair: Pair) -> bool:
        """Whether ``pair``'s target should now run with fastest's llama.cpp settings: it was loaded here, nobody
        chose a mode, and its quiet figures choose ``fastest`` (or find no width identical: nothing to keep)."""
        checks = pair.checks
        return (self._follows and self._asked is None and checks is not None and not checks.busy
                and pair.verify.mode == FASTEST and (pair.verify.cap is not None or not checks.identity.identical)
                and app_settings(pair.target))

    def _follow(self, shown: Pair, priced: Pair, beside: bool) -> Pair:
        """The pair switched to fastest as if chosen (``_switch``), here or (``beside``) on a thread of its own while
        ``shown`` (the pair without figures: "measuring") serves; only if nothing changed the slot meanwhile. Where
        the switch fails, ``priced`` (the pair with its figures) serves on as loaded, and the log says why."""
        def switch() -> Pair:
            with self._load_lock:
                switched = None
                try:
                    switched = self._switch(priced, FASTEST) if self.pair is shown else self.pair
                except Exception:
                    log.exception("running the target with fastest's llama.cpp settings failed")
                with self._swap:
                    if switched is None and self.pair is shown:
                        self.pair = priced
                return self.require()
        if beside:  # the figures wait for it: launch.py says them once fastest's settings run
            self.measurer.beside(switch, "speclens-fastest")
            return shown
        return switch()

    def remeasure(self) -> Pair:
        """Measure the loaded pair again beside serving (its kept figures dropped); meanwhile it says "measuring"."""
        with self._swap:
            pair = self.require()
            self.store.forget(pair.models)
            self.pair = pair = replace(pair, checks=None, verify=VerifyChoice())
        self.measurer.start(pair.models)
        return pair

    def set_verify(self, mode: str) -> Pair:
        """The loaded pair in verify ``mode`` (engine/serve/verify_mode.py): one assignment; requests already
        running keep the mode they started with. Where the mode runs a llama.cpp target with other settings
        (``target_settings``), the target is loaded again with them and installed as a load is, its figures kept
        or measured; the target it replaces is reused on the way back while anything still holds it."""
        check_mode(mode)
        with self._load_lock:
            switched = self._switch(self.require(), mode)
            if switched is not None:
                return switched
        with self._swap:
            pair = self.require()
            if pair.checks is None:
                raise InvalidSettingError("the verify widths are being measured on this machine: the identical/fastest "
                                          "choice comes with the figures")
            self.pair = pair = replace(pair, verify=pair.verify.with_mode(mode))
            self._asked = mode
        return pair

    def _switch(self, pair: Pair, mode: str) -> Pair | None:
        """``pair`` with its target loaded again with ``mode``'s llama.cpp settings and installed in ``mode``, or None
        where they are the ones it has (or torch runs it). Under the load lock."""
        settings, runner = target_settings(pair.target.backend, mode)
        if settings is None or settings == pair.target.backend.settings:
            return None
        before = self._switched_from() if self._switched_from else None
        same = before is not None and before.name == pair.target.name and before.backend.settings == settings
        target = before if same else with_gguf_settings(pair.target, settings)
        self._switched_from = weakref.ref(pair.target)
        return self.install(target, pair.draft, pair.precision_note, self.beside, mode, runner)

    def _release_all_but(self, pair: Pair) -> None:
        """Let go of what only the previous pair used (its judge, its fp32 copies), and of the device memory it
        held: nothing here refers to the previous pair any more."""
        judge = self._judge
        if judge is not None and judge[0] is not pair.target:  # the judge holds its target (and a KV cache)
            self._judge = None
        self._fp32 = {name: m for name, m in self._fp32.items() if name in (pair.target.name, pair.draft.name)}
        release_memory(pair.target.device)

    def judge(self, pair: Pair, lock: ModelLock) -> Judging:
        """The target judges near-hits of a direct-mode lookup, only at a (model, precision) with a calibrated
        threshold; otherwise the note says the hits it would have decided are verified. One judge per target:
        it keeps its prompt's KV, and takes the model lock for each verdict."""
        if not self.paraphrase_judge:
            return NO_JUDGE
        cached = self._judge
        if cached is None or cached[0] is not pair.target:
            held = lock.over([pair.target], "while judging a cache hit")
            cached = self._judge = (pair.target, judge_for(pair.target, held))
        return Judging(cached[1], "" if cached[1] is not None else uncalibrated_note(pair.target))

    def fp32_copies(self, pair: Pair) -> tuple[tuple[LoadedModel, LoadedModel], float]:
        """fp32 copies of the pair on the CPU (two fp32 copies, about 8 GB for the default pair, must not take GPU
        memory), loaded once and kept while this pair stays; and the seconds their loading took (0: kept)."""
        with self._load_lock:
            start = time.perf_counter()
            copies = self._fp32_copy(pair.target), self._fp32_copy(pair.draft)
            return copies, time.perf_counter() - start

    def _fp32_copy(self, loaded: LoadedModel) -> LoadedModel:
        if loaded.precision == "fp32":
            return loaded
        if loaded.name not in self._fp32:
            self._fp32[loaded.name] = load_model(loaded.name, "fp32", device=torch.device("cpu"),
                                                 cache_dir=self.cache_dir)
        return self._fp32[loaded.name]

    def fp32_models(self) -> list[LoadedModel]:
        """The fp32 copies held now (tests check that a switch lets them go)."""
        return list(self._fp32.values())
