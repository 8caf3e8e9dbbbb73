"""The ``floor`` path of ``bench.speed.serving``: what a chat page must cost Chromium, measured in the same run.

A plain Gradio page with no model (the kind ``shared/tools/gradio_floor.py`` measures): a ``gr.Chatbot`` and a
``gr.HTML`` live box under it. Each answer streams as coloured ``<span title=...>`` tokens into the live box, redrawn 5
times a second, and the Chatbot is written at the start and at the end, the whole conversation as its value: the
design the app's chat has, with nothing else on the page. It streams as many spans as the app's answer to the same
prompt had, at that answer's decode rate, in the same headless Chromium, so the two pages' CPU per token compare.
"""
from __future__ import annotations

import threading
import time
from contextlib import ExitStack

from bench.peer.server import free_port
from bench.speed.page_clock import PageClock

FRAME_S = 0.2
WORDS = ("def", " merge", "(a", ",", " b", "):", "\n   ", " result", " =", " []", "\n   ", " while", " a", " and",
         " b", ":", "\n       ", " if", " a", "[0]", " <", " b", "[0]", ":")
KINDS = ("accepted", "accepted", "accepted", "corrected", "bonus", "plain")
CSS = ".tok-accepted{background:#d4f7d4}.tok-corrected{background:#ffd8b0}.tok-bonus{background:#cfe3ff}"
DONE_JS = "t => document.querySelector('#floor-done textarea').value === t"


def span(i: int) -> str:
    word = WORDS[i % len(WORDS)].replace("<", "&lt;")
    return (f'<span class="tok tok-{KINDS[i % len(KINDS)]}" title="p_target 0.{i % 97:02d} · q_draft '
            f'0.{i % 89:02d} · step {i}">{word}</span>')


def answer_html(parts: list[str]) -> str:
    return "<div class='tokstream'>" + "".join(parts) + "</div>"


def stream(history: list, prompt: str, tokens: float, rate: float):
    """``tokens`` spans at ``rate`` a second into the live box; the Chatbot at the start and at the end."""
    history = [*history, {"role": "user", "content": prompt}]
    yield history, "", ""
    parts, last, start = [], 0.0, time.perf_counter()
    for i in range(int(tokens)):
        time.sleep(max(0.0, start + (i + 1) / rate - time.perf_counter()))
        parts.append(span(i))
        if time.perf_counter() - last >= FRAME_S:
            last = time.perf_counter()
            yield history, answer_html(parts), ""
    yield [*history, {"role": "assistant", "content": answer_html(parts)}], "", prompt


def floor_demo():
    import gradio as gr

    with gr.Blocks(analytics_enabled=False) as demo:
        chatbot = gr.Chatbot(elem_id="floor-chat", height=470, render_markdown=False, sanitize_html=True)
        live = gr.HTML(elem_id="floor-live")
        with gr.Row():
            msg = gr.Textbox(elem_id="floor-msg")
            tokens = gr.Number(elem_id="floor-tokens")
            rate = gr.Number(elem_id="floor-rate")
        done = gr.Textbox(elem_id="floor-done")
        send = gr.Button("Send", elem_id="floor-send")
        send.click(stream, [chatbot, msg, tokens, rate], [chatbot, live, done], show_progress="hidden")
    return demo


class FloorPage:
    """The floor page served from this process, open in a tab of the bench's Chromium."""

    def __init__(self, stack: ExitStack, browser):
        demo = floor_demo()
        port = free_port()
        threading.Thread(target=lambda: demo.launch(server_name="127.0.0.1", server_port=port,
                                                    prevent_thread_lock=True, css=CSS, quiet=True,
                                                    run_history=False),  # as the app
                         daemon=True).start()
        stack.callback(demo.close)
        self.page = browser.new_page(viewport={"width": 1500, "height": 1000})
        deadline = time.monotonic() + 120
        while True:
            try:
                self.page.goto(f"http://127.0.0.1:{port}")
                self.page.wait_for_selector("#floor-msg textarea", timeout=30_000)
                break
            except Exception:  # the server is not up yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.clock = PageClock(self.page)
        self.turn = 0

    def ask(self, tokens: int, rate: float, profile: bool = False) -> dict:
        """One answer of ``tokens`` spans at ``rate`` tokens a second; its seconds as the page saw them, and what it
        cost the page (``PageClock``; ``profile``: with its JavaScript CPU profile)."""
        page, self.turn = self.page, self.turn + 1
        prompt = f"question {self.turn}"
        page.fill("#floor-msg textarea", prompt)
        page.fill("#floor-tokens input", str(max(1, tokens)))
        page.fill("#floor-rate input", f"{max(rate, 0.5):.3f}")
        page.locator("#floor-rate input").blur()
        with self.clock.spending(profile) as spent:
            began = time.perf_counter()
            page.click("#floor-send")
            page.wait_for_function(DONE_JS, arg=prompt, timeout=1_800_000, polling=200)
            seconds = time.perf_counter() - began
        return {"tokens": max(1, tokens), "seconds": seconds, "ttft_s": None, "decode_tokens_per_s": None, **spent}
