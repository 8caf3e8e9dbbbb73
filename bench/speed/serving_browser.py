"""The app's Chat tab in headless Chromium for ``bench.speed.serving``: one conversation, and its clock in the page
(from the click to the first and the last token drawn)."""
from __future__ import annotations

from contextlib import ExitStack

from bench.speed.mode_runs import decode_rate
from bench.speed.page_clock import PageClock

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

# the page's clock: the click, the first token drawn and the last, for the answer being waited on
WATCH_JS = """() => {
  window.__bench = {want: -1, click: 0, first: 0, last: 0, n: 0};
  const count = () => {  // the tokens of the answer being waited on: in the live box, then in the chat
    const live = document.querySelector('#chat-live .tokstream');
    if (live) return live.querySelectorAll('.tok').length;
    const answers = document.querySelectorAll('#chat .tokstream');
    return answers.length === window.__bench.want ? answers[answers.length - 1].querySelectorAll('.tok').length : 0;
  };
  const seen = () => {
    const b = window.__bench, n = count();
    if (b.want < 0 || n === b.n) return;
    const now = performance.now();
    if (!b.first && n) b.first = now;
    b.last = now; b.n = n;
  };
  for (const id of ['#chat', '#chat-live'])
    if (document.querySelector(id))
      new MutationObserver(seen).observe(document.querySelector(id), {childList: true, subtree: true, characterData: true});
}"""
SEND_JS = """want => { window.__bench = {...window.__bench, want, click: performance.now(), first: 0, last: 0, n: 0};
  document.querySelector('#send').click(); }"""
FINISHED_JS = """n => document.querySelectorAll('#chat .tokstream').length === n &&
  document.querySelectorAll('#chat .tokstream.streaming').length === 0 &&
  document.querySelectorAll('#chat-live .tokstream').length === 0"""


class Browser:
    """One Chat tab in headless Chromium, one conversation."""

    def __init__(self, stack: ExitStack, url: str, max_new_tokens: int):
        from playwright.sync_api import sync_playwright

        self.pw = stack.enter_context(sync_playwright())
        self.browser = self.pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        stack.callback(self.browser.close)
        self.page = self.browser.new_page(viewport={"width": 1500, "height": 1000})
        self.page.goto(url)
        self.page.wait_for_selector("#msg textarea", timeout=120_000)
        self.page.fill("#max-new-tokens input", str(max_new_tokens))  # the chat's setting, as the other paths'
        self.page.locator("#max-new-tokens input").blur()
        self.page.evaluate(WATCH_JS)
        self.clock = PageClock(self.page)
        self.answers = 0

    def ask(self, prompt: str, profile: bool = False) -> dict:
        """One message and its answer, as the page saw it; ``profile``: with the page's JavaScript CPU profile."""
        page = self.page
        page.fill("#msg textarea", prompt)
        self.answers += 1
        with self.clock.spending(profile) as spent:
            page.evaluate(SEND_JS, self.answers)
            page.wait_for_function(FINISHED_JS, arg=self.answers, timeout=1_800_000, polling=200)
        clock = page.evaluate("() => window.__bench")
        tokens = int(self.stat("tokens"))
        seconds = (clock["last"] - clock["click"]) / 1000
        ttft = (clock["first"] - clock["click"]) / 1000 if clock["first"] else None
        panel_decode = self.stat("decode tok/s")  # None on an app that does not show one
        return {"tokens": tokens, "seconds": seconds, "ttft_s": ttft,
                "decode_tokens_per_s": decode_rate(tokens, seconds, ttft),
                "panel_tokens_per_s": float(self.stat("tokens/s")),
                "panel_decode_tokens_per_s": None if panel_decode in (None, "–") else float(panel_decode), **spent}

    def stat(self, label: str) -> str | None:
        """A number of the stats panel, as shown (None: the panel has no such number)."""
        found = self.page.locator(f'#stats [data-stat="{label}"] .stat-value')
        return found.inner_text() if found.count() else None
