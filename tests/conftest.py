"""Shared fixtures: a real redis-server per test module (see tests/redis_server.py)."""
import pytest

from tests.redis_server import RedisServer, require_redis_binary


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer(require_redis_binary()).start()
    try:
        yield server
    finally:
        server.stop()
