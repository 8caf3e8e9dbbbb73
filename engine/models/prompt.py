"""Chat messages -> prompt token ids through the target's chat template, with input checks.

Text is text: only the template's own markers become control tokens. Each message's content is tokenised as
plain text (the tokenizer's ``split_special_tokens``), so a user who types ``<|im_end|>`` or
``<|im_start|>system`` gets those characters, not a forged turn. The template is rendered once with a
placeholder per content; the pieces between placeholders are the template's (their markers stay control
ids), the content goes in between as text.
"""
from __future__ import annotations

import re
import uuid

from engine.errors import EmptyPromptError, InvalidSettingError, PromptTooLongError

MESSAGE_ROLES = ("system", "user", "assistant")
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str, what: str = "the message") -> str:
    """Refuse text that is not valid Unicode to tokenise: a lone surrogate (JSON can carry one) or a NUL."""
    bad = _SURROGATE.search(text)
    if bad:
        raise InvalidSettingError(f"{what} contains a lone surrogate (U+{ord(bad.group()):04X}) at character "
                                  f"{bad.start()}: text must be valid Unicode (UTF-8 encodable)")
    if "\x00" in text:
        raise InvalidSettingError(f"{what} contains a NUL character at character {text.index(chr(0))}: "
                                  "remove it (a NUL is not text)")
    return text


def validate_messages(messages: list[dict]) -> list[dict]:
    if not messages:
        raise EmptyPromptError("the conversation is empty: write a message first")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in MESSAGE_ROLES or not isinstance(m.get("content"), str):
            raise InvalidSettingError(f"each message needs a role in {MESSAGE_ROLES} and a text content, got {m!r:.80}")
        check_text(m["content"], f"message {i + 1} ({m['role']})")
    if messages[-1]["role"] != "user":
        raise InvalidSettingError("the last message must come from the user")
    if not messages[-1]["content"].strip():
        raise EmptyPromptError("the message is empty: type something to ask")
    return messages


def plain_text_ids(tokenizer, text: str) -> list[int]:
    """``text`` as plain text: marker strings in it become ordinary tokens, never control ids."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def _markers(tokenizer) -> re.Pattern:
    """The tokenizer's added (control) token strings, longest first, as one splitting pattern."""
    words = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, words)) + ")") if words else re.compile("(?!)")


def template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """The chat template's markers as control ids, every content as plain text (see the module docstring).

    The template is rendered with a placeholder per content and cut at its control tokens, as the tokenizer
    itself cuts a string; each piece between them gets its contents back and is tokenised as text. A normal
    conversation therefore gets exactly the ids of tokenising the rendered string (tested)."""
    marks = [f"\ue000{uuid.uuid4().hex}{i}\ue001" for i in range(len(messages))]
    holders = [{**m, "content": mark} for m, mark in zip(messages, marks)]
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(holders, tokenize=False, add_generation_prompt=add_generation_prompt)
    else:
        text = "\n".join(f"{m['role']}: {m['content']}" for m in holders) + ("\nassistant:" if add_generation_prompt else "")
    if any(text.count(mark) != 1 for mark in marks):  # a template that rewrites or repeats the content
        raise InvalidSettingError("the model's chat template changes message text; it cannot be used safely")
    contents = {mark: m["content"] for mark, m in zip(marks, messages)}
    holder = re.compile("|".join(map(re.escape, marks)))
    ids: list[int] = []
    for i, piece in enumerate(_markers(tokenizer).split(text)):
        if i % 2:  # a control token of the template
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        elif piece:
            ids += plain_text_ids(tokenizer, holder.sub(lambda m: contents[m.group()], piece))
    return ids


def encode_chat(tokenizer, messages: list[dict], context_window: int) -> list[int]:
    """Apply the chat template. Raises PromptTooLongError when the prompt leaves no room to answer."""
    validate_messages(messages)
    limit = context_window - 1
    chars = sum(len(m["content"]) for m in messages)
    if chars > 8 * context_window:  # cheap early refusal before tokenising megabytes
        raise PromptTooLongError(f"the prompt ({chars:,} characters) cannot fit the model's context window "
                                 f"of {context_window:,} tokens")
    ids = template_ids(tokenizer, messages)
    if len(ids) > limit:
        raise PromptTooLongError(f"the prompt is {len(ids):,} tokens; the model's context window is "
                                 f"{context_window:,} tokens. Shorten the message or clear the chat")
    return ids


def encode_prediction(tokenizer, text: str, context_window: int) -> list[int]:
    """A predicted output (OpenAI's ``prediction``) as plain-text ids; empty text: no prediction. Refused, with the
    reason, where it could never be restated within the context window."""
    check_text(text, "the prediction")
    if len(text) > 8 * context_window:  # cheap early refusal, as for the prompt
        raise PromptTooLongError(f"the prediction ({len(text):,} characters) cannot fit the model's context "
                                 f"window of {context_window:,} tokens")
    ids = plain_text_ids(tokenizer, text) if text else []
    if len(ids) > context_window:
        raise PromptTooLongError(f"the prediction is {len(ids):,} tokens; the model's context window is "
                                 f"{context_window:,} tokens, so no answer could restate it")
    return ids
