"""The scale bench's parts on a real Redis 8: exactness against the exact scan, and a resumable fill."""
import pytest

from bench.cache.scale import BATCH, SCOPE, fill, measure_exactness
from engine.cache.semantic_cache import entry_key
from tests.helpers.embedders import PrefixBlindEmbedder

pytest.importorskip("redis")


@pytest.fixture
def redis8(redis_server):
    if redis_server.kind != "redis8":
        pytest.skip("vector sets only")
    return redis_server


def test_exactness_compares_the_server_search_with_the_exact_scan(redis8):
    pairs = [{"a": f"question {i}", "b": f"please question {i}", "same": True} for i in range(12)]
    report = measure_exactness(pairs, PrefixBlindEmbedder(), redis8.url, distractors=500, efs=[10, 100],
                               progress=False)
    assert report["search"].endswith("vector set") and report["exact_outcomes"]["miss"] == 0
    assert {ef: row["same"] for ef, row in report["by_ef"].items()} == {10: 12, 100: 12}
    assert not list(redis8.client().scan_iter(match="speclens-scale-*"))  # the throw-away namespace is gone


def test_a_fill_resumes_where_it_stopped(redis8):
    ns, n = "fill-resume", 2 * BATCH
    seconds, written = fill(redis8.url, ns, SCOPE, n, workers=1, progress=False)
    assert written == n and redis8.client().zcard(f"{ns}:order") == n
    assert fill(redis8.url, ns, SCOPE, n, workers=1, progress=False)[1] == 0  # all there: nothing written
    redis8.client().delete(f"{ns}:e:{entry_key(SCOPE, f'prompt {n - 1}')}")  # the last batch is incomplete
    assert fill(redis8.url, ns, SCOPE, n, workers=1, progress=False)[1] == BATCH


def test_exactness_in_a_kept_namespace_uses_the_latency_fill_as_distractors(redis8):
    """One million-entry fill serves both measurements: --exactness --namespace adds the pairs to it."""
    ns, n = "exact-kept", BATCH
    assert fill(redis8.url, ns, SCOPE, n, workers=1, progress=False)[1] == n
    pairs = [{"a": f"question {i}", "b": f"please question {i}", "same": True} for i in range(6)]
    report = measure_exactness(pairs, PrefixBlindEmbedder(), redis8.url, distractors=n, efs=[100],
                               progress=False, namespace=ns)
    assert report["distractor_kind"] == "synthetic (latency fill)" and report["by_ef"][100]["same"] == 6
    assert report["exact_outcomes"]["miss"] == 0
    assert redis8.client().zcard(f"{ns}:order") == n + 6  # kept: the fill's entries and the pairs
