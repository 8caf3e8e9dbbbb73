"""engine/surface.py's EngineSurface, the one door from the app to the engine: the engine and every fake the
app's tests use have exactly its members, and a fake that drifts from it is caught."""
from engine.chat_engine import ChatEngine
from engine.config import CacheConfig
from engine.surface import SURFACE_MEMBERS, EngineSurface, surface_problems
from tests.helpers.fakes import FakeEngine, PiecesEngine, RaceEngine


def _public_members(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")
            and (callable(getattr(cls, name)) or isinstance(getattr(cls, name), property))}


def test_fakes_and_the_engine_have_exactly_the_surface():
    """Names and parameters (names, kinds, defaults) as EngineSurface declares them; a fake has nothing more, so
    an app that called anything else on the engine would fail here, with the fakes."""
    assert set(SURFACE_MEMBERS) == {"load_pair", "info", "set_verify_mode", "generate", "generate_reference", "explain_divergence",
                                    "prove_fp32", "cache_info", "cache_stats", "cache_entries", "cache_delete",
                                    "cache_clear", "memory_clear", "run_experiment", "pair_doctor", "remeasure", "wait_measured",
                                    "use_models", "target", "draft", "encode"}
    for cls in (ChatEngine, FakeEngine, RaceEngine, PiecesEngine):
        assert surface_problems(cls) == [], cls
    for fake in (FakeEngine([]), RaceEngine([]), PiecesEngine()):
        assert isinstance(fake, EngineSurface)
        assert _public_members(type(fake)) == set(SURFACE_MEMBERS), type(fake)


def test_a_drifted_fake_is_caught():
    class Drifted(FakeEngine):
        def generate(self, messages, sampling, spec, cache=CacheConfig(), cancel=None):  # cache not keyword-only
            yield from ()

        def cache_entries(self, limit=10):  # another default
            return []

    class Partial:
        def info(self):
            return None

    class Unpropertied(FakeEngine):
        target = None  # a plain attribute where the surface has a property

    problems = surface_problems(Drifted)
    assert len(problems) == 2 and "Drifted.generate" in problems[0] and "Drifted.cache_entries" in problems[1]
    assert len(surface_problems(Partial)) == len(SURFACE_MEMBERS) - 1
    assert "Partial.load_pair is missing" in surface_problems(Partial)
    assert surface_problems(Unpropertied) == ["Unpropertied.target is not a property, as EngineSurface.target is"]
