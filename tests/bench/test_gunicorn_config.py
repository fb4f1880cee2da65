"""The benchmark's gunicorn configuration: each gthread worker holds at most its share of a
load's connections, so the rounds measure the app on every worker, not gunicorn's accept
loop (bench/ANALYSIS.md, "Balanced connections")."""

from __future__ import annotations

from bench.common import GunicornConfig


def test_a_gthread_worker_holds_its_share_of_the_connections() -> None:
    config = GunicornConfig(workers=2, worker_class="gthread", threads=4)
    assert config.worker_connections is None  # gunicorn's default until balanced
    assert config.balanced(16).worker_connections == 8
    assert config.balanced(32).worker_connections == 16
    assert config.balanced(17).worker_connections == 9  # every connection has a worker
    assert "--worker-connections 8" in config.balanced(16).describe()
    assert config.balanced(16).threads == 4 and config.balanced(16).workers == 2


def test_sync_workers_are_left_as_they_are() -> None:
    sync = GunicornConfig(workers=4, worker_class="sync", threads=1)
    assert sync.balanced(16) == sync
    assert "--worker-connections" not in sync.balanced(16).describe()
