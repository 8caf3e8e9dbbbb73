"""app/api/gradio_chat.py: the /chat endpoint for gradio_client streams the answer and cancels when closed."""
from app.api.gradio_chat import make_chat_api
from app.baseline import BaselineStore
from app.context import AppContext
from engine.events import CacheEvent
from tests.helpers.fakes import FakeEngine, done, stats, tok


def test_closing_an_api_request_cancels_the_engine(tmp_path):
    ctx = AppContext(FakeEngine([CacheEvent("miss"), tok("a"), stats(), tok("b"), stats(), done()]),
                     BaselineStore(tmp_path / "b.json"))
    answer = make_chat_api(ctx)("hi")
    assert next(answer)["cache"]["outcome"] == "miss"
    flag = ctx.engine.calls[0]["cancel"]
    assert not flag.is_set()
    answer.close()
    assert flag.is_set()
    finished = list(make_chat_api(ctx)("hi again"))[-1]
    assert finished["text"] == "ab" and finished["finish_reason"] == "eos"
