"""bench.speed.serving: the browser chat, the app's /v1, the engine in-process and llama-server's /v1 on one
conversation. Its argument checks run everywhere; the whole bench runs on SmolLM2 (GGUF, as target and draft) with
a real launch.py, Debian's Chromium and the peer extra's llama-server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.speed import serving
from tests.helpers.browser import needs_chromium
from tests.helpers.constants import SMOL
from tests.helpers.server import link_models


def test_bad_modes_and_lengths_are_refused_before_anything_starts(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    for argv, said in ((["--modes", "browser,teleport"], "teleport"), (["--max-new-tokens", "0"], "at least 1"),
                       (["--verify-mode", "sideways"], "invalid choice: 'sideways'")):
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


def test_the_summary_compares_v1_beside_the_floor_page_with_v1_alone_and_with_the_browser():
    runs = [{"mode": "browser", "turn": 0, "tokens": 90, "seconds": 10.0, "decode_tokens_per_s": 9.5,
             "panel_tokens_per_s": 9.0},
            {"mode": "v1", "turn": 0, "tokens": 100, "seconds": 10.0, "decode_tokens_per_s": 11.0},
            {"mode": "floor-v1", "turn": 0, "tokens": 100, "seconds": 12.5, "decode_tokens_per_s": 10.0}]
    ratios = serving.summarize(runs, ["browser", "v1", "floor-v1"])["ratios"]
    assert ratios["v1 beside the floor page / v1"] == pytest.approx(0.8)
    assert ratios["browser / v1 beside the floor page"] == pytest.approx(1.125)
    assert ratios["browser / v1 beside the floor page (decode)"] == pytest.approx(0.95)


@pytest.mark.parametrize("modes, said", [("v1,floor", "give browser too"),
                                         ("browser,floor-v1", "give browser and v1 too"),
                                         ("v1,floor-v1", "give browser and v1 too")])
def test_the_floor_modes_need_the_paths_they_repeat(tmp_path, capsys, modes, said):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    with pytest.raises(SystemExit):
        serving.main(["--prompts", str(prompts), "--modes", modes])
    assert said in capsys.readouterr().err


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
    out, profiles = tmp_path / "serving.json", tmp_path / "profiles"
    serving.main(["--prompts", str(prompts), "--max-new-tokens", "8", "--target", SMOL, "--draft", SMOL,
                  "--cache-dir", str(cache_dir), "--llama-server", str(llama_server_binary), "--json", str(out),
                  "--profile", str(profiles), "--verify-mode", "fastest"])
    result = json.loads(out.read_text())
    # the app and the engine in fastest, switched as the model panel does: the target on llama-server's KV cache
    assert result["setup"]["verify_mode"] == "fastest" and "V f16" in result["setup"]["target_runner"]
    runs = result["runs"]
    assert sorted({r["mode"] for r in runs}) == sorted(serving.MODES)
    assert [r["turn"] for r in runs] == [0] * 6 + [1] * 6  # one conversation, every path at every turn
    assert [r["mode"] for r in runs[:4]] != [r["mode"] for r in runs[6:10]]  # the order rotates
    assert runs[4]["mode"] == runs[10]["mode"] == "floor"  # the browser's answer again, on the plain page
    assert runs[5]["mode"] == runs[11]["mode"] == "floor-v1"  # v1's again, the plain page drawing beside it
    browser_tokens = [r["tokens"] for r in runs if r["mode"] == "browser"]
    assert [r["tokens"] for r in runs if r["mode"] == "floor"] == browser_tokens
    assert all(r["browser_cpu_s"] > 0 for r in runs if r["mode"] in ("floor", "floor-v1"))
    assert "Chromium CPU/token browser / floor, last answer" in result["summary"]["ratios"]
    assert all(r["tokens"] > 0 and r["seconds"] > 0 for r in runs)
    assert all(r["ttft_s"] is not None for r in runs if r["mode"] != "floor")  # the floor page has no model
    browser = [r for r in runs if r["mode"] == "browser"]
    assert all(r["panel_tokens_per_s"] > 0 and r["browser_cpu_s"] > 0 for r in browser)
    assert all(r["app_cpu_s"] > 0 for r in runs if r["mode"] in ("browser", "v1", "floor-v1"))
    assert {"browser / v1", "v1 / engine", "v1 / llama-server", "v1 beside the floor page / v1",
            "browser / v1 beside the floor page"} <= set(result["summary"]["ratios"])
    # each page's main-thread seconds by kind, from Chromium's own clocks, and its profile on the first and last answer
    pages = [r for r in runs if r["mode"] in ("browser", "floor")]
    assert all(r["page_task_s"] > 0 and r["page_nodes"] > 0 for r in pages)
    assert all(0 <= r[f"page_{kind}_s"] <= r["page_task_s"] for r in pages for kind in ("script", "style", "layout"))
    assert sorted(p.name for p in profiles.iterdir()) == sorted(f"{m}-answer{n}.cpuprofile" for m in
                                                                 ("browser", "floor") for n in (1, 2))
    assert all(r["page_profile_top"] and Path(r["page_profile_file"]).exists() for r in pages)


def test_a_profiles_functions_rank_by_self_time_and_the_page_costs_divide_by_tokens():
    from bench.speed.page_clock import profile_top

    frame = lambda name, url, line: {"functionName": name, "url": url, "lineNumber": line}  # noqa: E731
    profile = {"nodes": [{"id": 1, "callFrame": frame("(root)", "", -1), "children": [2, 3]},
                         {"id": 2, "callFrame": frame("snapshot", "http://x/assets/index.js", 20)},
                         {"id": 3, "callFrame": frame("", "http://x/assets/HTML.js", 4)}],
               "samples": [2, 3, 2, 2], "timeDeltas": [0, 1000, 2000, 3000]}  # µs before each sample
    top = profile_top(profile)
    # a sample's time is the delta to the next sample: 2 gets 1 + 3 + 0 ms, 3 gets 2 ms
    assert top == [{"function": "snapshot", "file": "index.js", "line": 21, "self_ms": 4.0},
                   {"function": "(anonymous)", "file": "HTML.js", "line": 5, "self_ms": 2.0}]
    runs = [{"turn": 0, "mode": "browser", "tokens": 10, "page_nodes": 100, "page_task_s": 0.5, "page_script_s": 0.2,
             "page_style_s": 0.05, "page_layout_s": 0.01},
            {"turn": 0, "mode": "v1", "tokens": 10}]
    assert serving.page_cost_rows(runs) == [{"turn": 0, "mode": "browser", "nodes": 100, "task": 50.0, "script": 20.0,
                                             "style": 5.0, "layout": 1.0}]
    assert "| browser, 1 | 50.0 | 20.0 | 5.0 | 1.0 | 100 |" in serving.format_page_costs(runs)
