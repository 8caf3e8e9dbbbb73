"""Test tiers and shared fixtures.

Tiers (markers): ``fast`` is every test without another tier: tiny random models, fakes, no real weights,
no browser, no launch.py process. It is what a plain ``python -m pytest`` runs (pyproject's addopts).
``slow`` is the same kind of test that takes thousands of tiny decodes (the sampling distributions through the
whole loop), ``real`` loads real weights or starts launch.py, ``browser`` drives Chromium. ``-m slow``, ``-m real``
and ``-m browser`` run those; the README's command runs all four: ``-m "fast or slow or real or browser"``.
"""
from __future__ import annotations

import gc
from pathlib import Path

import pytest

from tests.helpers.redis_server import SERVERS, RedisServer, missing_binary

TIERS = ("slow", "real", "browser")


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything
def pytest_collection_modifyitems(items):
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.fast)


def pytest_collection_finish(session):
    """What collecting imported (torch, transformers, Gradio, every test module) lives as long as the run: out of the
    collector's way, so that each gen-2 collection, and each gc.collect() the code makes, walks only what the tests
    made (seconds fewer in the fast tier)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the item (``item.rep_call``): a fixture's teardown can tell that its test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="module", params=SERVERS)
def redis_kind(request) -> str:
    """Each Redis test runs on both servers: "redis7" (in-memory index), "redis8" (vector sets)."""
    return request.param


@pytest.fixture(scope="module")
def redis_server(redis_kind):
    server = RedisServer(redis_kind).start()
    try:
        yield server
    finally:
        server.stop()


def require_llama_binary(name: str) -> Path:
    """A llama.cpp binary from the ``peer`` extra. Missing: the test skips, unless SPECLENS_REQUIRE_PEER=1 (CI),
    where it fails."""
    from bench.peer.server import find_llama_binary
    found = find_llama_binary(name)
    if found is None:
        missing_binary(name, "pip install '.[peer]', recipe in docs/bench.md", "SPECLENS_REQUIRE_PEER")
    return found


@pytest.fixture(scope="session")
def llama_cpp() -> None:
    """llama-cpp-python (a dependency, built at install) for the llama.cpp runner's tests. Missing: they skip, unless
    SPECLENS_REQUIRE_GGUF=1 (CI), where they fail."""
    from engine.backends.llama_cpp import llama_cpp_available
    if not llama_cpp_available():
        missing_binary("llama-cpp-python", "a dependency: pip install -e . builds it", "SPECLENS_REQUIRE_GGUF")


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    return require_llama_binary("llama-server")


@pytest.fixture(scope="session")
def llama_perplexity_binary() -> Path:
    return require_llama_binary("llama-perplexity")


class RealModels:
    """Real models loaded once per test run, by (name, precision). Models hold no per-generation state (each
    generation makes its own KV cache), so tests may share them; engines built from them are fresh."""

    def __init__(self):
        self._loaded = {}

    def model(self, name: str, precision: str):
        from engine.models.loading import load_model
        key = (name, precision)
        if key not in self._loaded:
            self._loaded[key] = load_model(name, precision)  # explicit precisions only: "auto" depends on the role
        return self._loaded[key]

    def engine(self, target: str, target_precision: str, draft: str, draft_precision: str, **kwargs):
        """A new ChatEngine on the pooled models (``kwargs`` go to ChatEngine: cache, paraphrase_judge); a pair it
        loads later is measured before load_pair returns (nothing measures beside the next test)."""
        from engine.chat_engine import ChatEngine
        from tests.helpers.pooled import use_pooled
        engine = ChatEngine(**{"measure_beside": False, **kwargs})
        use_pooled(engine, self.model(target, target_precision), self.model(draft, draft_precision))
        return engine


@pytest.fixture(scope="session")
def real_models() -> RealModels:
    return RealModels()
