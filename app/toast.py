"""Gradio's toasts (gr.Info / gr.Warning / gr.Error) render their message as HTML: every one goes through here."""
from __future__ import annotations

import gradio as gr

from app.views.render import esc


def warn(message: str) -> None:
    gr.Warning(esc(message))


def info(message: str) -> None:
    gr.Info(esc(message))


def error(message: str) -> gr.Error:
    """An exception to raise from a handler; the message is shown escaped."""
    return gr.Error(esc(message))
