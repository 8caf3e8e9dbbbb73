"""The measuring CLIs on real models: bench.speed.overhead (time outside the forwards) and bench.speed.quality."""
from __future__ import annotations

import pytest

SMOL = "smollm2-135m-instruct"
pytestmark = pytest.mark.real


def test_overhead_reports_the_share_of_each_step_outside_the_forwards(capsys):
    from bench.speed.overhead import main
    main(["--target", SMOL, "--draft", SMOL, "--dtype", "int4", "--draft-dtype", "int4", "--max-new-tokens", "8"])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"target", "default"}
    for row in rows.values():
        steps, per_step, inside, outside = int(row[1]), float(row[2]), float(row[3]), float(row[4])
        assert steps > 0 and 0 < inside < per_step and outside == pytest.approx(per_step - inside, abs=0.11)  # printed to 0.1 ms
        assert 0 < float(row[5].rstrip("%")) < 100


def test_quality_compares_precisions_with_the_first_one(capsys, tmp_path):
    import json

    from bench.speed.quality import main
    out = tmp_path / "q.json"
    assert main(["--model", SMOL, "--precisions", "bf16,int4", "--ctx", "64", "--chunks", "3",
                 "--json", str(out)]) == 0
    rows = {r["precision"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["bf16"]["top1_agreement"] == 1.0 and rows["bf16"]["scored"] == 3 * 31
    assert 0.5 < rows["int4"]["top1_agreement"] <= 1.0
    assert 0.8 < rows["int4"]["perplexity"] / rows["bf16"]["perplexity"] < 1.25
    assert "bf16" in capsys.readouterr().out


def test_quality_refuses_a_bad_text_file_with_a_sentence(tmp_path, capsys):
    from bench.speed.quality import main
    with pytest.raises(SystemExit) as exit_info:
        main(["--text", str(tmp_path / "missing.txt")])
    assert exit_info.value.code == 2 and "cannot read --text" in capsys.readouterr().err


def test_quality_runs_llamas_own_perplexity_on_the_same_chunks(capsys, tmp_path, llama_perplexity_binary):
    import json

    from bench.speed.quality import main
    out = tmp_path / "q.json"
    assert main(["--model", SMOL, "--precisions", "int4", "--ctx", "64", "--chunks", "3", "--llama-perplexity",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    ours, peer = result["rows"][0]["perplexity"], result["llama_perplexity"]
    assert 0.8 < peer / ours < 1.25  # the same Q4_1 weights, scored the same way
    assert "llama.cpp" in capsys.readouterr().out


@pytest.mark.parametrize("role", ["target", "draft"])
def test_forward_costs_table_for_each_precision(capsys, tmp_path, role):
    import json

    from bench.speed.forward import main
    out = tmp_path / "f.json"
    main(["--models", SMOL, "--precisions", "int4,int8-weight", "--tokens", "1,2", "--repeats", "1",
          "--context", "600", "--role", role, "--attention", "eager,sdpa", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["precision"] for r in rows] == ["int4/eager", "int4/sdpa", "int8-weight/eager", "int8-weight/sdpa"]
    assert all(r["ms"]["1"] > 0 and r["ms"]["2"] > 0 for r in rows)
    assert "int4" in capsys.readouterr().out
