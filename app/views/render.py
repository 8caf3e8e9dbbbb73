"""Engine events -> HTML. Every piece of user or model text goes through ``esc`` before it becomes HTML.

Pure functions, no gradio: tests call them on hand-made events.
"""
from __future__ import annotations

import html

from engine.errors import EngineError
from engine.events import TOKEN_KINDS, CacheEvent, TokenEvent

KIND_HELP = {
    "accepted": "draft token the target kept",
    "corrected": "the target's token where it rejected the draft",
    "bonus": "free extra target token after a fully accepted draft",
    "plain": "the target's own step (nothing drafted)",
    "cached": "served from the semantic cache",
}
REJECTED_HELP = "draft token the target threw away"
SPECIAL_LABELS = {"end": "end of answer"}  # a rejected special token's badge; others show their own name
CACHE_LABELS = {
    "exact": "exact cache hit",
    "verified": "cache hit, verified by the target",
    "cached": "cache hit, served unverified",
    "miss": "cache miss",
    "off": "cache off",
}
FINISH_LABELS = {"eos": "", "length": "stopped at the max new tokens limit", "cancelled": "stopped by you"}


def esc(text: object) -> str:
    """HTML-escape text (quotes too, so it is safe inside attributes)."""
    return html.escape("" if text is None else str(text), quote=True)


def esc_text(text: object) -> str:
    """Escape text for a pre-wrap block: newlines become <br> so Gradio's dedenting cannot touch them."""
    return esc(text).replace("\r\n", "\n").replace("\n", "<br>")


def _prob(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def token_title(ev: TokenEvent) -> str:
    parts = [ev.kind, f"step {ev.step}", f"p_target {_prob(ev.p_target)}", f"q_draft {_prob(ev.q_draft)}"]
    if ev.draft_pos is not None:
        parts.append(f"draft position {ev.draft_pos + 1}")
    if ev.rejected_text is not None:
        parts.append(f"rejected draft token {ev.rejected_text!r}")
    return " · ".join(parts)


def kind_class(kind: str) -> str:
    safe = kind if kind in TOKEN_KINDS else "unknown"
    return f"tok tok-{safe}"


def ghost_html(ev: TokenEvent) -> str:
    """The struck-through draft token a corrected token replaced ("" for other tokens). A special token is a small
    badge: "end of answer" for one that would have ended it, its name (escaped) for any other."""
    if ev.kind != "corrected" or not ev.rejected_text:
        return ""
    if ev.rejected_special:
        label = SPECIAL_LABELS.get(ev.rejected_special, ev.rejected_text)
        title = esc(f"rejected draft token {ev.rejected_text}")
        return f'<span class="tok tok-rejected tok-special" title="{title}">{esc(label)}</span>'
    return f'<span class="tok tok-rejected" title="{esc("rejected draft token")}">{esc_text(ev.rejected_text)}</span>'


def render_token(ev: TokenEvent) -> str:
    """One token as a coloured span; a corrected token comes after its struck-through draft token (the
    "show rejected" switch hides those with CSS)."""
    if not ev.text:  # an incomplete multi-byte character: its text arrives with a later token
        return ""
    title = esc(token_title(ev))
    return f'{ghost_html(ev)}<span class="{kind_class(ev.kind)}" title="{title}">{esc_text(ev.text)}</span>'


def render_tokens(tokens: list[TokenEvent]) -> str:
    return "".join(render_token(ev) for ev in tokens)


def render_cache_note(cache: CacheEvent | None) -> str:
    """Names the prompt a cached or verified answer matched, with its similarity; warns when the cache could not
    be used (a miss with a reason, e.g. Redis unreachable)."""
    if cache is not None and cache.outcome == "miss" and cache.reason:
        return f'<div class="cache-note cache-warning" data-outcome="miss">\u26a0 {esc(cache.reason)}</div>'
    if cache is None or cache.outcome in ("miss", "off"):
        return ""
    label = CACHE_LABELS.get(cache.outcome, cache.outcome)
    sim = "" if cache.similarity is None else f" (similarity {cache.similarity:.3f})"
    matched = "" if cache.matched_prompt is None else f": matched “{esc(_clip(cache.matched_prompt, 160))}”"
    reason = f" — {esc(cache.reason)}" if cache.reason else ""
    return (f'<div class="cache-note" data-outcome="{esc(cache.outcome)}">♻ {esc(label)}{matched}{esc(sim)}'
            f"{reason}</div>")


def render_finish(finish_reason: str | None) -> str:
    label = FINISH_LABELS.get(finish_reason or "", "")
    return f'<div class="finish-note">{esc(label)}</div>' if label else ""


def render_answer(tokens: list[TokenEvent], cache: CacheEvent | None = None, finish_reason: str | None = None,
                  streaming: bool = False, markdown_html: str | None = None) -> str:
    """The assistant message: cache note, coloured tokens, and why it stopped.

    With ``markdown_html`` (app.views.markdown) the message holds both views, the rendered Markdown and the raw
    tokens; CSS shows one of them (the "view-tokens" class on the chat switches to the raw tokens)."""
    wait = '<span class="tok-wait">…</span>'
    body = render_tokens(tokens) or wait
    if markdown_html is not None:
        body = f'<div class="md-view">{markdown_html or wait}</div><div class="raw-view">{body}</div>'
    css = "tokstream streaming" if streaming else "tokstream"
    return f'{render_cache_note(cache)}<div class="{css}">{body}</div>{render_finish(finish_reason)}'


def render_user(text: str) -> str:
    return f'<div class="usertext">{esc_text(text)}</div>'


def _legend_item(css: str, name: str, help_text: str) -> str:
    return (f'<span class="legend-item" title="{esc(help_text)}"><span class="{css}">{esc(name)}</span>'
            f'<span class="legend-help">{esc(help_text)}</span></span>')


def legend_html() -> str:
    """Every token kind with its colour and meaning, plus the struck-through rejected draft token."""
    cells = [_legend_item(kind_class(k), k, KIND_HELP[k]) for k in TOKEN_KINDS]
    cells.append(_legend_item("tok tok-rejected", "rejected", REJECTED_HELP))
    return (f'<div class="legend">{"".join(cells)}<span class="legend-hint">Hover a token for its p_target, '
            f"q_draft and step.</span></div>")


def error_message(err: Exception) -> str:
    """What a person reads for a failed request: an engine error as is (its message is written for people),
    anything else with its type, so a bug is not mistaken for bad input."""
    return str(err) if isinstance(err, EngineError) else f"unexpected error: {type(err).__name__}: {err}"


def error_html(message: str | None) -> str:
    if not message:
        return '<div class="error-box empty"></div>'
    return f'<div class="error-box" role="alert">⚠ {esc(message)}</div>'


def info_html(message: str) -> str:
    return f'<div class="info-box">{esc(message)}</div>'


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def chat_write(keep: int, messages: list[dict], write_id: str) -> str:
    """One write of the chat (a gr.HTML the page keeps, assets/chat.js): the page keeps its first ``keep`` messages
    and appends ``messages`` ({"role", "content"}: content already escaped HTML, "text" the answer's plain text for
    the copy button). A write carries only what changes, so its size does not grow with the conversation and the
    finished messages are never drawn again. ``write_id`` makes each write a new value (Gradio skips an equal one)."""
    rows = []
    for m in messages:
        role = "user" if m["role"] == "user" else "bot"
        copy = (f'<button class="chat-copy" type="button" title="Copy the answer" data-text="{esc(m["text"])}">'
                "⧉</button>" if m.get("text") is not None else "")
        rows.append(f'<div class="chat-msg chat-{role}">{copy}{m["content"]}</div>')
    return (f'<div class="chat-write" data-keep="{int(keep)}" data-write="{esc(write_id)}">'
            f'{"".join(rows)}</div>')
