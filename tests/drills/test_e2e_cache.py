"""The handler example end to end: a Redis cache of `shop.customers` kept in step by
`binlog_assets.examples.customer_cache` from a real binlog (seeded random DML with
inserts, updates, deletes, an added column, a primary-key change and a truncate, through
MariaDB and Debezium), equal to the table row for row, also after consumer runs that
were SIGKILLed mid-run (handlers done, nothing committed; and inside the handling) and
rerun. Replays are what the kills cause: the cache's position guard makes them no-ops.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import yaml
from drill_lib import shop_config, wait_published, workload

from binlog_assets.config import PipelineConfig
from binlog_assets.dev import drills, shop
from binlog_assets.dev.connect import DebeziumFence, KafkaConnect
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.examples.customer_cache import HANDLERS_SPEC, customers
from binlog_assets.faults import ENV_DELAY, ENV_HIT, ENV_POINT, MARKER
from binlog_assets.orchestration.partitions import partition_key

SEED = 20261124
STATEMENTS = 300
CUSTOMER_STATEMENTS = 1500
KEY = partition_key("shop.shop.customers", 0)
CHILD = Path(__file__).with_name("cache_child.py")


def _customer_changes(conn, seed: int, statements: int) -> int:
    """A primary-key change and a truncate of shop.customers, then `statements` random
    inserts, updates and deletes of it (seeded)."""
    rng = random.Random(seed)
    with conn.cursor() as cur:
        cur.execute("SELECT MIN(id), MAX(id) FROM shop.customers")
        low, high = cur.fetchone()
        cur.execute("UPDATE shop.customers SET id = %s WHERE id = %s", (high + 1000, low))
        cur.execute("TRUNCATE TABLE shop.customers")
        live: set[int] = set()
        for _ in range(statements):
            roll = rng.random()
            if roll < 0.4 or not live:
                cid = rng.randrange(1, 2000)
                cur.execute("REPLACE INTO shop.customers (id, name, email, tier) VALUES "
                            "(%s, %s, %s, %s)", (cid, f"c{cid}-{rng.randrange(99)}",
                                                 rng.choice([None, f"{cid}@example.com"]),
                                                 rng.choice([None, "gold", "basic"])))
                live.add(cid)
            elif roll < 0.85:
                cid = rng.choice(sorted(live))
                cur.execute("UPDATE shop.customers SET name = %s, email = %s WHERE id = %s",
                            (f"u{rng.randrange(10**6)}", rng.choice([None, "x@y.z"]), cid))
            else:
                cid = rng.choice(sorted(live))
                cur.execute("DELETE FROM shop.customers WHERE id = %s", (cid,))
                live.discard(cid)
    return statements + 2


def _run(config_path: Path, env: dict[str, str], **fault: str) -> tuple[int, dict | None, str]:
    proc = subprocess.run([sys.executable, str(CHILD), str(config_path), KEY],
                          env={**env, **fault}, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CACHE-RESULT ")]
    return proc.returncode, json.loads(lines[-1].split(" ", 1)[1]) if lines else None, \
        proc.stderr


def test_the_redis_cache_equals_its_table_through_kills_and_reruns(
    debezium_connect: KafkaConnect, mariadb: MariaDBServer, debezium_fence: DebeziumFence,
    pipeline_config: PipelineConfig,
    redis_url: str, tmp_path: Path,
) -> None:
    conn = mariadb.connect()
    statements = workload(conn, SEED, STATEMENTS)
    statements += _customer_changes(conn, SEED, CUSTOMER_STATEMENTS)
    ends = wait_published(dict(pipeline_config.kafka), debezium_fence)
    pipeline = shop_config(pipeline_config, "cache_e2e", handlers=HANDLERS_SPEC, lanes=8)
    config_path = tmp_path / "binlake.yaml"
    config_path.write_text(yaml.safe_dump(pipeline.model_dump(mode="json", exclude_none=True)))
    env = {k: v for k, v in os.environ.items() if k not in (ENV_POINT, ENV_HIT, ENV_DELAY)}

    # 1. Killed at the commit point: every handler ran, nothing was committed, so the
    #    rerun replays every event into a cache that already holds them.
    code, result, err = _run(config_path, env, **{ENV_POINT: "after_handlers"})
    assert code == -9 and MARKER in err, err[-3000:]
    assert result is None
    # 2. Killed inside the handling of a rerun (a timer after the first fetch).
    code, result, err = _run(config_path, env, **{ENV_POINT: "after_fetch",
                                                  ENV_DELAY: "0.05"})
    assert code == -9 and MARKER in err, err[-3000:]
    # 3. The rerun that finishes.
    code, result, err = _run(config_path, env)
    assert code == 0 and result is not None, err[-4000:]

    cached = customers.rows_at(redis_url)
    comparison = shop.compare_cache(conn, cached)
    metrics = result["handlers"]["customer-cache"]
    figures = {
        "seed": SEED, "statements": statements, "events": result["events"],
        "source_rows": comparison.source_rows, "cached_rows": comparison.replica_rows,
        "mismatches": comparison.mismatched, "kills": 2,
        "handler_events": metrics["events"], "handler_calls": metrics["calls"],
        "handler_p50_ms": metrics["p50_ms"], "handler_p99_ms": metrics["p99_ms"],
        "rerun_cache_changes": result["cache_changes"],
        "run_seconds": round(result["seconds"], 2),
        "events_per_s": round(result["events"] / result["seconds"], 1),
    }
    drills.record("e2e_redis_cache", figures)
    print(f"\nredis cache: {figures}")
    assert result["committed"] == ends[KEY]
    assert result["dead_lettered"] == 0
    # The first run applied every event before it was killed: everything since was a
    # replay, and the position guard made each one a no-op.
    assert result["cache_changes"] == 0, result
    assert metrics["events"] == result["events"]
    assert comparison.source_rows > 0 and comparison.matches, comparison
