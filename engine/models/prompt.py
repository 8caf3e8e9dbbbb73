"""Chat messages -> prompt token ids through the target's chat template, with input checks."""
from __future__ import annotations

from engine.errors import EmptyPromptError, InvalidSettingError, PromptTooLongError

ROLES = ("system", "user", "assistant")


def validate_messages(messages: list[dict]) -> list[dict]:
    if not messages:
        raise EmptyPromptError("the conversation is empty: write a message first")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise InvalidSettingError(f"each message needs a role in {ROLES} and a text content, got {m!r:.80}")
    if messages[-1]["role"] != "user":
        raise InvalidSettingError("the last message must come from the user")
    if not messages[-1]["content"].strip():
        raise EmptyPromptError("the message is empty: type something to ask")
    return messages


def encode_chat(tokenizer, messages: list[dict], context_window: int) -> list[int]:
    """Apply the chat template. Raises PromptTooLongError when the prompt leaves no room to answer."""
    validate_messages(messages)
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"
    limit = context_window - 1
    if len(text) > 8 * context_window:  # cheap early refusal before tokenising megabytes
        raise PromptTooLongError(f"the prompt ({len(text):,} characters) cannot fit the model's context window "
                                 f"of {context_window:,} tokens")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > limit:
        raise PromptTooLongError(f"the prompt is {len(ids):,} tokens; the model's context window is "
                                 f"{context_window:,} tokens. Shorten the message or clear the chat")
    return ids
