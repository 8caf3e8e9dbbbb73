"""bench.speed.footprint: the app's resident memory against a real llama-server's on the same GGUF files, after N
concurrent and M sequential answers, each side a fresh process per job."""
import json
import os

import pytest

from bench.speed.footprint import main, memory_mb, parse_args, prompts
from tests.helpers.constants import SMOL


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
