"""bench.speed.launch_time: a real launch.py timed until the page and /v1 answer, on an empty cache directory and
again on what it left, quiet and with a busy loop on every CPU; what the pair said while it measured."""
import json

import pytest

from bench.speed.launch_time import main
from tests.helpers.constants import SMOL

SMOL_BOTH = ["--target", SMOL, "--draft", SMOL, "--no-semantic-cache"]


@pytest.mark.real
def test_a_first_and_a_second_launch_serve_before_the_figures_and_the_second_has_them_kept(tmp_path, capsys):
    first, second = main(["--launches", "2", "--figures-timeout", "240", "--json", str(tmp_path / "l.json"), "--",
                          *SMOL_BOTH])
    assert not first.converted and not second.converted  # precision gguf converts nothing
    assert first.page_s <= first.v1_s and first.while_serving == "measuring"
    assert first.figures_s is not None and first.figures  # in, beside serving
    if "busy" in first.figures:  # a busy first measurement is not kept: the second measures again
        assert second.while_serving == "measuring"
    else:
        assert "kept" in second.while_serving and second.figures_s is not None
    assert [r["page_s"] for r in json.loads((tmp_path / "l.json").read_text())["launches"]] == \
        [first.page_s, second.page_s]
    assert "while serving -> figures" in capsys.readouterr().out


@pytest.mark.real
def test_beside_a_busy_loop_on_every_cpu_it_serves_and_keeps_no_busy_figure(tmp_path):
    (run,) = main(["--busy", "--launches", "1", "--figures-timeout", "240", "--cache-dir", str(tmp_path), "--",
                   *SMOL_BOTH])
    assert run.while_serving == "measuring" and run.figures_s is not None
    assert "busy" in run.figures and not (tmp_path / "measured.json").exists()


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--launches", "0"])
    assert "--launches" in capsys.readouterr().err
