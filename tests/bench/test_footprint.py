"""bench.speed.footprint: the app's resident memory against a real llama-server's on the same GGUF files, after N
concurrent and M sequential answers, each side a fresh process per job."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.speed.footprint import main, parse_args, prompts
from bench.speed.footprint_parts import memory_mb
from tests.helpers.constants import SMOL

ROOT = Path(__file__).resolve().parents[2]


def test_memory_is_read_from_proc_and_the_prompts_cycle():
    rss, peak = memory_mb(os.getpid())
    assert 0 < rss <= peak
    texts = prompts(20)
    assert len(texts) == 20 and texts[16] == texts[0] and len(set(texts)) == 16


@pytest.mark.parametrize("bad", [["--concurrent", "0"], ["--sequential", "-1"], ["--max-tokens", "0"]])
def test_a_job_of_no_answers_is_refused(bad, capsys):
    with pytest.raises(SystemExit):
        parse_args(bad)
    assert "take 1 or more" in capsys.readouterr().err


@pytest.mark.real
def test_both_sides_are_measured_after_each_job_with_the_peers_command(llama_server_binary, tmp_path, capsys):
    rows = main(["--concurrent", "2", "--sequential", "2", "--max-tokens", "8", "--llama-server",
                 str(llama_server_binary), "--json", str(tmp_path / "f.json"), "--", "--target", SMOL, "--draft", SMOL])
    assert [(r.side, r.job, r.answers) for r in rows] == [("app", "concurrent", 2), ("llama-server", "concurrent", 2),
                                                          ("app", "sequential", 2), ("llama-server", "sequential", 2)]
    assert all(0 < r.rss_mb <= r.peak_mb for r in rows)
    concurrent_peer, sequential_peer = rows[1].command.split(), rows[3].command.split()
    assert concurrent_peer[concurrent_peer.index("-np") + 1] == "2" and "32768" in concurrent_peer
    assert sequential_peer[sequential_peer.index("-np") + 1] == "1" and "8192" in sequential_peer
    assert "-md" in concurrent_peer and "--port PORT" in rows[1].command
    assert rows[0].command.startswith("python launch.py --no-browser --port PORT --cache-dir NEW_DIR")
    assert [r["rss_mb"] for r in json.loads((tmp_path / "f.json").read_text())["rows"]] == [r.rss_mb for r in rows]
    out = capsys.readouterr().out
    assert "x peer" in out and f"{rows[0].rss_mb / rows[1].rss_mb:.2f}" in out


@pytest.mark.real
def test_each_part_of_the_app_is_measured_in_a_fresh_process_in_launch_order(tmp_path):
    """bench.speed.footprint_parts as its command runs: torch is not loaded before its own row, and every part the
    app holds (the pair, an answer's contexts, MiniLM, the page) adds to the process's resident memory."""
    from tests.helpers.server import link_models

    link_models(tmp_path)
    out = tmp_path / "parts.json"
    done = subprocess.run([sys.executable, "-m", "bench.speed.footprint_parts", "--max-tokens", "4", "--cache-dir",
                           str(tmp_path), "--json", str(out), "--", "--target", SMOL, "--draft", SMOL],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["part"].split(" (")[0] for r in rows] == [
        "python and the bench's imports", "torch imported", "transformers imported",
        "the pair loaded, its figures measured or kept",
        "one answer", "MiniLM embedder", "Gradio and the app's page built"]
    added = {r["part"].split(" (")[0]: r["added_mb"] for r in rows}
    assert added["torch imported"] > 50  # a fresh process: nothing imported it before its row
    assert all(added[part] > 0 for part in ("the pair loaded, its figures measured or kept", "one answer",
                                            "MiniLM embedder"))
    assert all(b["total_mb"] == pytest.approx(a["total_mb"] + b["added_mb"]) for a, b in zip(rows, rows[1:]))
    assert "MiniLM embedder (the semantic cache)" in done.stdout


def test_the_parts_answer_needs_a_token(capsys):
    from bench.speed.footprint_parts import main as parts_main

    with pytest.raises(SystemExit):
        parts_main(["--max-tokens", "0"])
    assert "takes 1 or more" in capsys.readouterr().err
