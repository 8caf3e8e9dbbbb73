"""bench.speed.serving: the browser chat, the app's /v1, the engine in-process and llama-server's /v1 on one
conversation. Its argument checks run everywhere; the whole bench runs on SmolLM2 (GGUF, as target and draft) with
a real launch.py, Debian's Chromium and the peer extra's llama-server."""
from __future__ import annotations

import json

import pytest

from bench.speed import serving
from tests.helpers.browser import needs_chromium
from tests.helpers.constants import SMOL
from tests.helpers.server import link_models


def test_bad_modes_and_lengths_are_refused_before_anything_starts(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    for argv, said in ((["--modes", "browser,teleport"], "teleport"), (["--max-new-tokens", "0"], "at least 1")):
        with pytest.raises(SystemExit) as exit_:
            serving.main(["--prompts", str(prompts), *argv])
        assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_the_summary_divides_what_each_path_gave():
    runs = [{"mode": "browser", "tokens": 10, "seconds": 2.0, "ttft_s": 0.5, "decode_tokens_per_s": 6.0,
             "panel_tokens_per_s": 5.5, "app_cpu_s": 2.0, "browser_cpu_s": 0.2},
            {"mode": "v1", "tokens": 10, "seconds": 1.0, "ttft_s": 0.2, "decode_tokens_per_s": 11.0,
             "app_cpu_s": 1.9, "browser_cpu_s": 0.0},
            {"mode": "browser", "tokens": 10, "seconds": 2.0, "ttft_s": 0.5, "decode_tokens_per_s": 3.0,
             "panel_tokens_per_s": 5.0, "app_cpu_s": 2.0, "browser_cpu_s": 0.2},
            {"mode": "v1", "tokens": 10, "seconds": 1.0, "ttft_s": 0.4, "decode_tokens_per_s": 11.0,
             "app_cpu_s": 2.1, "browser_cpu_s": 0.0}]
    summary = serving.summarize(runs, ["browser", "v1"])
    assert summary["modes"]["browser"]["tokens_per_s"] == pytest.approx(5.0)
    assert summary["ratios"]["browser / v1"] == pytest.approx(0.5)
    assert summary["ratios"]["browser last / first (decode)"] == pytest.approx(0.5)
    assert summary["ratios"]["panel / browser-seen tok/s (worst)"] == pytest.approx(1.1)
    assert summary["modes"]["v1"]["ttft_median_s"] == pytest.approx(0.3)
    assert summary["modes"]["browser"]["browser_cpu_s_per_token"] == pytest.approx(0.02)
    assert "| browser | 5.00 |" in serving.format_summary(summary)


def test_the_summary_compares_the_pages_chromium_cpu_with_the_floors_on_the_first_and_last_answer():
    runs = [{"mode": "browser", "turn": 0, "tokens": 10, "seconds": 1.0, "browser_cpu_s": 0.3, "app_cpu_s": 1.0,
             "panel_tokens_per_s": 10.0},
            {"mode": "floor", "turn": 0, "tokens": 10, "seconds": 1.0, "browser_cpu_s": 0.2},
            {"mode": "browser", "turn": 1, "tokens": 20, "seconds": 2.0, "browser_cpu_s": 1.2, "app_cpu_s": 1.0,
             "panel_tokens_per_s": 10.0},
            {"mode": "floor", "turn": 1, "tokens": 20, "seconds": 2.0, "browser_cpu_s": 0.3}]
    ratios = serving.summarize(runs, ["browser", "floor"])["ratios"]
    assert ratios["Chromium CPU/token browser / floor, first answer"] == pytest.approx(1.5)
    assert ratios["Chromium CPU/token browser / floor, last answer"] == pytest.approx(4.0)


def test_floor_needs_the_browser(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    with pytest.raises(SystemExit):
        serving.main(["--prompts", str(prompts), "--modes", "v1,floor"])
    assert "give browser too" in capsys.readouterr().err


@pytest.mark.real
@pytest.mark.browser
@needs_chromium
@pytest.mark.usefixtures("llama_cpp")
def test_the_serving_bench_runs_every_path_on_one_conversation(tmp_path, llama_server_binary):
    pytest.importorskip("playwright.sync_api")
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    link_models(cache_dir)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "one", "kind": "prose", "prompt": "Say hello."}\n'
                       '{"id": "two", "kind": "code", "prompt": "Write a Python loop that prints 1 to 3."}\n')
    out = tmp_path / "serving.json"
    serving.main(["--prompts", str(prompts), "--max-new-tokens", "8", "--target", SMOL, "--draft", SMOL,
                  "--cache-dir", str(cache_dir), "--llama-server", str(llama_server_binary), "--json", str(out)])
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert sorted({r["mode"] for r in runs}) == sorted(serving.MODES)
    assert [r["turn"] for r in runs] == [0] * 5 + [1] * 5  # one conversation, every path at every turn
    assert [r["mode"] for r in runs[:4]] != [r["mode"] for r in runs[5:9]]  # the order rotates
    assert runs[4]["mode"] == runs[9]["mode"] == "floor"  # the browser's answer again, on the plain page
    browser_tokens = [r["tokens"] for r in runs if r["mode"] == "browser"]
    assert [r["tokens"] for r in runs if r["mode"] == "floor"] == browser_tokens
    assert all(r["browser_cpu_s"] > 0 for r in runs if r["mode"] == "floor")
    assert "Chromium CPU/token browser / floor, last answer" in result["summary"]["ratios"]
    assert all(r["tokens"] > 0 and r["seconds"] > 0 for r in runs)
    assert all(r["ttft_s"] is not None for r in runs if r["mode"] != "floor")  # the floor page has no model
    browser = [r for r in runs if r["mode"] == "browser"]
    assert all(r["panel_tokens_per_s"] > 0 and r["browser_cpu_s"] > 0 for r in browser)
    assert all(r["app_cpu_s"] > 0 for r in runs if r["mode"] in ("browser", "v1"))
    assert {"browser / v1", "v1 / engine", "v1 / llama-server"} <= set(result["summary"]["ratios"])
