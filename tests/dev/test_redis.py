"""The dev Redis: starts on a free loopback port with a password, is reused by a second
`start()`, and `stop()` really ends it (Redis rewrites its process title unless told not
to, which once hid the marker that `stop()` looks for)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from binlog_assets.dev.redis import RedisServer


def test_start_reuse_and_stop(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        pid = server.running_pid()
        assert pid is not None
        assert server.client().ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0)).ping()  # password
        again = RedisServer(tmp_path / "redis")
        again.start()
        assert (again.port, again.running_pid()) == (server.port, pid)
    finally:
        server.stop()
    assert server.running_pid() is None
    gone = not Path(f"/proc/{pid}").exists()
    assert gone or Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z"
