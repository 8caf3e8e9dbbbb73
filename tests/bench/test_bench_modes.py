"""bench.speed.modes measures what a user gets: per run the time to first token and the decode rate beside
end-to-end speed, each prompt ``--repeats`` times in a rotated mode order, from a fresh or a ``--warm`` state.

The fast tests run the bench's own modes on tiny random models (no weights); the real ones run the command line on
SmolLM2-135M (gguf: pooled llama.cpp contexts, what ``--warm`` reuses)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bench.speed.mode_runs import FirstTokenClock, ModeCall, decode_rate, timed_stream
from bench.speed.modes import _timed_run, rotated, run_bench
from engine.config import SamplingConfig, SpecConfig
from tests.helpers.constants import SMOL

PROMPTS = [{"id": "a", "kind": "code", "prompt": "Write a loop."}, {"id": "b", "kind": "prose", "prompt": "Hello."}]


@pytest.fixture(scope="module")
def tiny_engine():
    from engine.chat_engine import ChatEngine
    from tests.helpers.tiny import tiny_pair
    engine = ChatEngine()
    engine.use_models(*tiny_pair())
    return engine


def test_decode_rate_counts_the_tokens_after_the_first_over_the_seconds_after_it():
    assert decode_rate(11, 3.0, 1.0) == 5.0
    assert decode_rate(1, 3.0, 1.0) is None and decode_rate(0, 3.0, None) is None  # no token after the first
    assert decode_rate(5, 3.0, None) is None  # no first-token time: no decode rate


def test_the_first_token_is_timed_on_the_bench_clock_from_before_the_call():
    """The engine's own ``t`` starts inside the generation; the bench's clock starts before the call, so work done
    before the first event (here a sleep in the generator) counts in the time to first token."""
    import time
    from tests.helpers.fakes import done, tok

    def events():
        time.sleep(0.05)
        yield tok("a")
        yield tok("b")
        yield done(ids=(1, 2))

    streamed = timed_stream(events)
    assert streamed.ttft_s >= 0.05 and streamed.seconds >= streamed.ttft_s
    assert streamed.fields()["tokens"] == [1, 2]


def test_the_streamer_clock_takes_the_second_put_the_first_put_is_the_prompt():
    clock = FirstTokenClock(0.0)
    clock.put([1, 2, 3])
    assert clock.ttft_s is None
    clock.put([4])
    first = clock.ttft_s
    clock.put([5])
    assert first is not None and clock.ttft_s == first


def test_repeat_r_starts_at_mode_r():
    modes = ["target", "spec", "lookup"]
    assert [rotated(modes, r) for r in range(4)] == [modes, ["spec", "lookup", "target"],
                                                     ["lookup", "target", "spec"], modes]


@pytest.mark.parametrize("warm", [False, True])
def test_a_warm_run_primes_the_mode_with_the_prompt_first_and_a_fresh_one_forgets(warm):
    """Both empty the pooled contexts and the memory of earlier answers first; warm then runs the mode once, untimed,
    on the same messages with a short answer (the primer), and times the second call."""
    calls, forgotten, memory = [], [], []
    backend = SimpleNamespace(forget_prompts=lambda: forgotten.append(len(calls)))
    model = SimpleNamespace(backend=backend)
    engine = SimpleNamespace(target=model, draft=model,
                             memory_clear=lambda: memory.append(len(calls)))

    def runner(call):
        calls.append(call.sampling.max_new_tokens)
        return {"tokens": [1, 2, 3], "seconds": 2.0, "ttft_s": 0.5}

    call = ModeCall(engine, [{"role": "user", "content": "hi"}], SamplingConfig(max_new_tokens=16), SpecConfig(),
                    PROMPTS[0], warm)
    run, tokens = _timed_run(runner, "spec", call, reference=[1, 2, 3])
    assert calls == ([2, 16] if warm else [16]) and forgotten == [0] and memory == [0]
    assert tokens == [1, 2, 3] and run["identical_to_target"] is True
    assert run["ttft_s"] == 0.5 and run["decode_tokens_per_s"] == 2 / 1.5 and run["tokens_per_s"] == 1.5


def test_a_related_item_runs_its_history_first_untimed_and_only_the_memory_of_it_stays():
    """The earlier request is answered by the same mode first (its memory, a peer's table, hold it), then the pooled
    prompts are emptied but not the memory, and the second request is timed; a peer with state starts anew first."""
    calls, memory, restarted = [], [], []
    backend = SimpleNamespace(forget_prompts=lambda: calls.append("forget prompts"))
    model = SimpleNamespace(backend=backend)
    engine = SimpleNamespace(target=model, draft=model,
                             memory_clear=lambda: calls.append("forget memory"))

    def runner(call):
        calls.append(call.messages[0]["content"])
        return {"tokens": [1, 2], "seconds": 1.0, "ttft_s": 0.2}
    runner.forget = lambda: calls.append("restart")

    item = {"id": "r", "kind": "related", "history": "first", "prompt": "second"}
    call = ModeCall(engine, [{"role": "user", "content": "second"}], SamplingConfig(max_new_tokens=8), SpecConfig(),
                    item)
    run, _ = _timed_run(runner, "default", call, reference=[1, 2])
    assert calls == ["forget memory", "forget prompts", "restart", "first", "forget prompts", "second"]
    assert run["seconds"] == 1.0 and run["kind"] == "related"


@pytest.mark.parametrize("warm", [False, True])
def test_every_run_of_every_mode_has_its_ttft_and_decode_rate_in_the_rotated_order(tiny_engine, warm):
    modes = ["target", "spec", "default", "hf-assisted"]
    result = run_bench(tiny_engine, PROMPTS, modes, SpecConfig(k=3), max_new_tokens=12, repeats=2, warm=warm)
    runs = result["runs"]
    order = [(r["id"], r["repeat"], r["mode"]) for r in runs]
    assert order == [(p["id"], rep, m) for p in PROMPTS for rep in range(2) for m in rotated(modes, rep)]
    for r in runs:
        assert 0 < r["ttft_s"] <= r["seconds"], r
        if r["new_tokens"] >= 2:
            assert r["decode_tokens_per_s"] == pytest.approx((r["new_tokens"] - 1) / (r["seconds"] - r["ttft_s"]))
        # every repeat is compared with repeat 0's target run (greedy: the same tokens)
        assert r["identical_to_target"] is (None if r["mode"] == "target" else True)
    for mode in modes:
        summary = result["summary"][mode]
        assert summary["ttft_median_s"] > 0 and summary["decode_tokens_per_s"] > 0
        assert summary["decode_vs_target_geomean"] > 0
    assert json.loads(json.dumps(result))["runs"][0]["repeat"] == 0  # the JSON keeps every run


def test_bench_speed_refuses_zero_repeats_before_loading(tmp_path, capsys):
    from bench.speed.modes import main
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Say hi."}\n')
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit) as exit_:
            main(["--prompts", str(prompts), "--repeats", bad])
        assert exit_.value.code == 2
        assert "--repeats must be a whole number >= 1" in capsys.readouterr().err


# ---- the command line on a real model -------------------------------------------------------------------
def bench_json(directory, *args: str) -> tuple[dict, str]:
    """Run the command line on SmolLM2 (target and draft, precision auto: gguf): its JSON and what it printed."""
    import contextlib
    import io
    from bench.speed.modes import main
    prompts, out, printed = directory / "p.jsonl", directory / "bench.json", io.StringIO()
    prompts.write_text(json.dumps({"id": "count", "kind": "prose",
                                   "prompt": "Count from one to ten in words, separated by commas, and then say "
                                             "which of those numbers are prime and why each of them is."}) + "\n")
    with contextlib.redirect_stdout(printed):
        main(["--prompts", str(prompts), "--target", SMOL, "--draft", SMOL, "--max-new-tokens", "6",
              "--json", str(out), "--modes", "target,default", "--repeats", "2", *args])
    return json.loads(out.read_text()), printed.getvalue()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> tuple[dict, str]:
    return bench_json(tmp_path_factory.mktemp("fresh"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> tuple[dict, str]:
    return bench_json(tmp_path_factory.mktemp("warm"), "--warm")


@pytest.mark.real
def test_the_command_line_writes_ttft_and_decode_per_run_with_repeats(fresh):
    result, table = fresh
    assert result["header"]["warm"] is False and result["header"]["repeats"] == 2
    assert [(r["repeat"], r["mode"]) for r in result["runs"]] == [(0, "target"), (0, "default"), (1, "default"),
                                                                   (1, "target")]
    for r in result["runs"]:
        assert 0 < r["ttft_s"] < r["seconds"] and r["decode_tokens_per_s"] > 0
    for mode in ("target", "default"):
        assert result["summary"][mode]["ttft_median_s"] > 0 and result["summary"][mode]["decode_tokens_per_s"] > 0
    assert "\nfresh: each run starts from the state a new request finds; 2 run(s)" in table
    assert " ttft " in table and " decode " in table and "ttft median=" in table


@pytest.mark.real
def test_warm_runs_find_their_prompt_in_the_pooled_context(warm, fresh):
    """--warm: the header says so, each run has its time to first token, and target-only's first token comes
    after no prefill of the prompt (it is already in the pooled llama.cpp context): sooner than a fresh one's."""
    result, table = warm
    assert result["header"]["warm"] is True and "\nwarm: each run's prompt already in the mode's own state" in table
    for r in result["runs"]:
        assert 0 < r["ttft_s"] < r["seconds"] and r["decode_tokens_per_s"] > 0
    assert result["summary"]["target"]["ttft_median_s"] < fresh[0]["summary"]["target"]["ttft_median_s"]


def test_the_prediction_mode_sends_the_items_prediction_and_counts_its_tokens(tiny_engine):
    """Mode ``prediction``: the default spec with the item's prediction (else its prompt) as predicted output; the
    answer is the target's, and the run says how many predicted tokens were kept and replaced."""
    from bench.speed.mode_runs import predicted_text

    assert predicted_text({"prompt": "p", "prediction": "q"}) == "q" and predicted_text({"prompt": "p"}) == "p"
    from engine.config import SamplingConfig
    from engine.events import final_done
    from tests.helpers.tiny import VOCAB

    messages = [{"role": "user", "content": PROMPTS[0]["prompt"]}]
    reference = final_done(tiny_engine.generate_reference(messages, SamplingConfig(max_new_tokens=16)))
    # the text the tiny byte tokenizer encodes back to the answer's ids (its decode is not its inverse)
    answer = "".join(chr(t - 1 + VOCAB - 1) for t in reference.token_ids)
    items = [{**PROMPTS[0], "prediction": answer}]
    result = run_bench(tiny_engine, items, ["target", "prediction"], SpecConfig(k=3), max_new_tokens=16)
    run = result["runs"][1]
    assert run["mode"] == "prediction" and run["identical_to_target"] is True
    assert run["accepted_prediction_tokens"] > 0 and run["rejected_prediction_tokens"] >= 0
