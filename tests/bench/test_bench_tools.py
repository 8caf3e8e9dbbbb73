"""The measuring CLIs: bench.speed.overhead (time outside the forwards) and bench.speed.quality, on real models,
and how a test reads the overhead table (by its header row and its --json, never by line offsets)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.helpers.constants import SMOL

real = pytest.mark.real


def overhead_table(out: str) -> dict[str, list[str]]:
    """bench.speed.overhead's printed rows by mode, found below its header row: the lines above it (the pair and
    its precision note) take as many lines as the machine's note needs."""
    from bench.speed.overhead import HEADER
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == HEADER.split())
    return {line.split()[0]: line.split() for line in lines[header + 1:] if line.strip()}


def test_the_overhead_table_is_read_by_its_header_whatever_lines_come_above(monkeypatch, capsys, tmp_path):
    """A precision note of several lines (as on an AVX2 machine) shifts the table down; the rows read the same,
    printed and in --json. The old reader (``lines[2:]``) took the header for a row here."""
    import bench.speed.overhead as overhead
    note = "AVX2 CPU (no AVX-512) -> target int4, draft int4\n  (chosen by you)\nmode steps: not a row"
    info = SimpleNamespace(target=SMOL, draft=SMOL, target_precision="int4", draft_precision="int4",
                           precision_note=note)
    measured = [overhead.Overhead("target", 16, 0.8, 0.7), overhead.Overhead("default", 8, 0.6, 0.45)]
    monkeypatch.setattr(overhead, "ChatEngine", lambda **kw: SimpleNamespace(load_pair=lambda *names: info))
    monkeypatch.setattr(overhead, "measure", lambda engine, prompts, modes, max_new_tokens: measured)
    overhead.main(["--target", SMOL, "--draft", SMOL, "--json", str(tmp_path / "o.json")])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines.index(overhead.HEADER) == 3  # the note took three lines, not one
    assert {line.split()[0] for line in lines[2:]} >= {"mode", "target"}  # so lines[2:] would hold the header
    rows = overhead_table(out)
    assert rows == {"target": ["target", "16", "50.0", "43.8", "6.25", "12.5%"],
                    "default": ["default", "8", "75.0", "56.2", "18.75", "25.0%"]}
    written = {r["mode"]: r for r in json.loads((tmp_path / "o.json").read_text())["rows"]}
    assert written["default"] == {"mode": "default", "steps": 8, "seconds": 0.6, "forward_s": 0.45,
                                  "ms_per_step": pytest.approx(75.0), "forward_ms_per_step": pytest.approx(56.25),
                                  "outside_ms_per_step": pytest.approx(18.75), "outside_share": pytest.approx(0.25)}


@real
def test_overhead_reports_the_share_of_each_step_outside_the_forwards(capsys, tmp_path):
    from bench.speed.overhead import main
    main(["--target", SMOL, "--draft", SMOL, "--dtype", "gguf", "--draft-dtype", "gguf", "--max-new-tokens", "8",
          "--json", str(tmp_path / "o.json")])
    rows = {r["mode"]: r for r in json.loads((tmp_path / "o.json").read_text())["rows"]}
    assert set(rows) == {"target", "default"}
    for row in rows.values():
        per_step, inside, outside = row["ms_per_step"], row["forward_ms_per_step"], row["outside_ms_per_step"]
        assert row["steps"] > 0 and 0 < inside < per_step and outside == pytest.approx(per_step - inside)
        assert outside / per_step == pytest.approx(row["outside_share"]) and 0 < row["outside_share"] < 1
    printed = overhead_table(capsys.readouterr().out)
    assert {mode: int(cells[1]) for mode, cells in printed.items()} == {m: r["steps"] for m, r in rows.items()}


@real
def test_quality_compares_precisions_with_the_first_one(capsys, tmp_path):
    from bench.speed.quality import main
    out = tmp_path / "q.json"
    assert main(["--model", SMOL, "--precisions", "bf16,int4", "--ctx", "64", "--chunks", "3",
                 "--json", str(out)]) == 0
    rows = {r["precision"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["bf16"]["top1_agreement"] == 1.0 and rows["bf16"]["scored"] == 3 * 31
    assert 0.5 < rows["int4"]["top1_agreement"] <= 1.0
    assert 0.8 < rows["int4"]["perplexity"] / rows["bf16"]["perplexity"] < 1.25
    assert "bf16" in capsys.readouterr().out


@real
def test_quality_refuses_a_bad_text_file_with_a_sentence(tmp_path, capsys):
    from bench.speed.quality import main
    with pytest.raises(SystemExit) as exit_info:
        main(["--text", str(tmp_path / "missing.txt")])
    assert exit_info.value.code == 2 and "cannot read --text" in capsys.readouterr().err


@real
def test_quality_runs_llamas_own_perplexity_on_the_same_chunks(capsys, tmp_path, llama_perplexity_binary):
    from bench.speed.quality import main
    out = tmp_path / "q.json"
    assert main(["--model", SMOL, "--precisions", "int4", "--ctx", "64", "--chunks", "3", "--llama-perplexity",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    ours, peer = result["rows"][0]["perplexity"], result["llama_perplexity"]
    assert 0.8 < peer / ours < 1.25  # the same Q4_1 weights, scored the same way
    assert "llama.cpp" in capsys.readouterr().out


@real
@pytest.mark.parametrize("role", ["target", "draft"])
def test_forward_costs_table_for_each_precision(capsys, tmp_path, role):
    from bench.speed.forward import main
    out = tmp_path / "f.json"
    main(["--models", SMOL, "--precisions", "int4,int8-weight", "--tokens", "1,2", "--repeats", "1",
          "--context", "600", "--role", role, "--attention", "eager,sdpa", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["precision"] for r in rows] == ["int4/eager", "int4/sdpa", "int8-weight/eager", "int8-weight/sdpa"]
    assert all(r["ms"]["1"] > 0 and r["ms"]["2"] > 0 for r in rows)
    assert "int4" in capsys.readouterr().out


@real
def test_forward_costs_under_each_verify_modes_llama_cpp_settings(capsys, tmp_path):
    """A GGUF model under the settings identical and fastest run it with, and fastest's two candidates (the weights
    as stored, repacked where they run here): a wide forward at context 0 is a prompt's prefill (docs/bench.md
    compares them)."""
    from bench.speed.forward import main
    from engine.backends.llama_cpp import repack_fault
    from engine.models.sources import gguf_file
    out = tmp_path / "f.json"
    main(["--models", SMOL, "--precisions", "gguf", "--verify-modes",
          "identical,fastest,fastest-as-stored,fastest-repacked", "--tokens", "1,32", "--repeats", "1",
          "--context", "0", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    repacked = ["gguf/fastest-repacked"] if repack_fault(gguf_file(SMOL)) is None else []
    assert [r["precision"] for r in rows] == ["gguf/identical", "gguf/fastest", "gguf/fastest-as-stored", *repacked]
    assert all(r["ms"]["1"] > 0 and r["ms"]["32"] > 0 for r in rows)
    assert "gguf/fastest-as-stored" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--models", SMOL, "--precisions", "gguf", "--verify-modes", "fastest,quickest"])
    assert "--verify-modes takes identical, fastest, fastest-as-stored, fastest-repacked, not quickest" in capsys.readouterr().err
