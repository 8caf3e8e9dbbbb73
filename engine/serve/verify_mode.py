"""Identical or fastest: how wide a verify the adaptive k may use, where the load-time identity check found the
target bit-identical only up to some width (llama.cpp's tiled K-quant matmul from 8 rows, docs/models.md).

``identical`` keeps an adaptive k within that width (the step budget's, engine/decode/step.py): greedy speculation is
then the target's own tokens, bit for bit, at every position checked. ``fastest`` lets it draft up to k_max, where
a wider verify may be cheaper per token but is identical only up to rounding ties. Each is priced on the verify
costs measured at load, for a free draft (a lookup, a prediction) accepted ``ALPHA`` of the time, the case where
long drafts pay; the default is ``identical`` unless it would cost more than ``TOLERANCE`` of that speed.

Choosing ``fastest`` for a target llama.cpp runs also runs it with an f16 KV cache, on llama.cpp's repacked
weights or on the weights as stored, whichever a child process times cheaper for an answer on this machine
(engine/models/repack_probe.py: repacked won on Zen 5, lost on Zen 3); its forwards are faster but wider verifies
are identical to one-token forwards at fewer positions; ``identical`` runs it with the app's settings
(``GgufSettings()``). The switch loads the file again with the other settings and measures them as a load does
(engine/serve/pair_slot.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.backends.llama_cpp import GgufSettings
from engine.config import DEFAULT_SPEC, FREE_SPAN, VERIFY_MODES
from engine.costs.costmodel import StepCosts
from engine.decode.identity import IdentityCheck
from engine.models.load_checks import LoadChecks
from engine.models import repack_probe
from engine.models.loading import LoadedModel
from engine.errors import InvalidSettingError

IDENTICAL, FASTEST = VERIFY_MODES
ALPHA = 0.9  # a free draft's acceptance where wide verifies matter: an edit's unchanged lines
TOLERANCE = 0.03  # identical is the default while it keeps this share of fastest's modelled speed
K_MAX = DEFAULT_SPEC.k_max  # what fastest lets the app's adaptive k reach


@dataclass(frozen=True)
class VerifyChoice:
    mode: str = FASTEST
    cap: int | None = None  # the widest identical verify (IdentityCheck.width_cap); None: nothing to choose
    note: str = ""  # each mode's modelled speed and why the default is what it is; "" without a choice
    runner: str = ""  # fastest's llama.cpp settings for the target, where choosing it changed them, and why; else ""

    @property
    def width_cap(self) -> int | None:
        """What the decoder keeps an adaptive k to: the cap in ``identical`` mode, else nothing."""
        return self.cap if self.mode == IDENTICAL else None

    @property
    def offered(self) -> bool:
        """Whether the pair line shows a mode: identity holds up to some width only, or fastest changed the runner."""
        return self.cap is not None or bool(self.runner)

    def with_mode(self, mode: str) -> VerifyChoice:
        check_mode(mode)
        if self.cap is None and mode == IDENTICAL:
            raise InvalidSettingError("this pair has no identical/fastest choice: its verifies are identical at "
                                      "every width checked, or at none")
        return replace(self, mode=mode)


def check_mode(mode: str) -> None:
    if mode not in VERIFY_MODES:
        raise InvalidSettingError(f"verify mode must be one of {', '.join(VERIFY_MODES)}, not {mode!r}")


def target_settings(backend, mode: str) -> tuple[GgufSettings | None, str]:
    """The llama.cpp settings a target on ``backend`` runs with in ``mode`` and, for ``fastest``, what they are and
    why; (None, "") where llama.cpp does not run it (torch: one runner for both modes). ``fastest`` runs an f16 KV
    cache on repacked weights or the weights as stored, whichever ``fastest_weights`` (a child process that times
    both) finds cheaper here; as stored where repacked weights do not run."""
    if getattr(backend, "settings", None) is None:
        return None, ""
    if mode != FASTEST:
        return GgufSettings(), ""
    settings, why, fault = repack_probe.fastest_weights(backend.path)
    if fault is not None:
        return settings, f"fastest runs the target with an f16 KV cache but its weights as stored: {fault}"
    weights = "repacked weights (llama-server's settings)" if settings.repack else "its weights as stored"
    return settings, (f"fastest runs the target with an f16 KV cache and {weights}, its forwards identical to "
                      f"target-only decoding up to rounding ties (the identity line, measured with them); {why}")


def best_speed(costs: StepCosts, most_k: int) -> tuple[int, float]:
    """The k (1..most_k) with the most modelled tokens per second for a free draft accepted ``ALPHA`` of the
    time, and that speed."""
    free = replace(costs, draft_per_token_s=0.0)
    k = free.best_k(ALPHA, list(range(1, most_k + 1)))
    return k, free.tokens_per_s(ALPHA, k)


def choose_verify(identity: IdentityCheck, costs: StepCosts, quiet: bool = True) -> VerifyChoice:
    """The default mode for a pair, measured: ``identical`` where keeping to the identical width costs at most
    ``TOLERANCE`` of the modelled speed, else ``fastest``; no choice where the check found no partial width.
    Costs measured on a busy machine (not ``quiet``) price nothing: ``identical`` until quiet ones come."""
    cap = identity.width_cap
    if cap is None:
        return VerifyChoice()
    if not quiet:
        return VerifyChoice(IDENTICAL, cap, f"verify widths: identical (k <= {cap - 1}), the default while the verify "
                                            "costs come from a busy machine; quiet figures price both modes")
    k_same, same = best_speed(costs, cap - 1)
    k_fast, fast = best_speed(costs, FREE_SPAN)
    mode = IDENTICAL if same >= (1 - TOLERANCE) * fast else FASTEST
    widest = max((n for n, _ in costs.verify_table), default=0)
    table = ", ".join(f"t({n}) = {s / costs.verify_s(1):.1f}" for n, s in costs.verify_table if n > 1)
    note = (f"verify widths: identical (k <= {cap - 1}) {same:.1f} tok/s at best (k = {k_same}), fastest "
            f"(k <= {K_MAX}) {fast:.1f} tok/s (k = {k_fast}; known text up to {FREE_SPAN}), modelled for a free draft accepted {ALPHA:.0%} of the "
            f"time from the verify costs measured at load ({table} one-token forwards, up to {widest}); "
            f"default {mode}: " + ("keeping to the identical width costs "
                                   f"{max(0.0, 1 - same / fast):.0%} here" if mode == IDENTICAL else
                                   f"the identical width would cost {1 - same / fast:.0%} here"))
    return VerifyChoice(mode, cap, note)


def verify_choice(checks: LoadChecks | None, asked: str | None = None, runner: str = "",
                  on_app_settings: bool = False) -> VerifyChoice:
    """The verify mode the figures choose (from quiet figures only), or the one the user ``asked`` for where the
    figures allow it; none before they are in. ``runner``: what fastest changed in the target's settings;
    ``on_app_settings``: llama.cpp runs the target with the app's settings (a default of fastest says so)."""
    if checks is None:
        return VerifyChoice()
    choice = choose_verify(checks.identity, checks.costs, quiet=not checks.busy)
    if asked is not None and (choice.cap is not None or asked == FASTEST):
        choice = replace(choice, mode=asked)
    elif asked is None and choice.mode == FASTEST and choice.cap is not None and on_app_settings:
        # models handed in run as given; a loaded pair's target switches (PairSlot._follow)
        runner = "the target runs with the app's llama.cpp settings, not fastest's (yet)"
    return replace(choice, runner=runner)


def app_settings(loaded: LoadedModel) -> bool:
    """Whether llama.cpp runs ``loaded`` with the app's settings (``GgufSettings()``): not torch, not fastest's."""
    return getattr(loaded.backend, "settings", None) == GgufSettings()
