"""Start, stop and report the embedded local stack: `python -m binlog_assets.dev.stack up`.

Only what the config leaves local is started: with `kafka.bootstrap.servers` set, the
user's cluster is used and no broker starts here; with `spark.remote` naming a port on
this machine, a Spark Connect server is started there (any other address is the user's).
The handler example's Redis (`binlog_assets.examples.customer_cache`) starts with `up`
when a source names that example and `REDIS_URL` does not point elsewhere. With
`schema_registry.url` on this machine (`http://127.0.0.1:<port>/apis/ccompat/v7`), the
dev schema registry (Apicurio) is started on that port, its store under `var/`.
`source-up` adds the binlog source in front of the embedded broker (MariaDB with a ROW
binlog, and Debezium in a Kafka Connect standalone worker); it too is skipped when the
user's own Kafka is configured, since it exists only to feed the embedded broker. State
lives under `var/`.
"""

from __future__ import annotations

import argparse
import os
import sys
from urllib.parse import urlsplit

from binlog_assets.config import PipelineConfig, load_config
from binlog_assets.dev.connect import DebeziumConnector, KafkaConnect
from binlog_assets.dev.kafka import KafkaBroker
from binlog_assets.dev.mariadb import MariaDBServer
from binlog_assets.dev.redis import REDIS_URL_ENV, RedisServer
from binlog_assets.dev.registry import CCOMPAT_PATH, SchemaRegistryServer
from binlog_assets.dev.s3 import S3Server
from binlog_assets.dev.spark_cluster import SparkCluster
from binlog_assets.dev.spark_connect import SparkConnectServer
from binlog_assets.environment import embedded_broker_dir, var_dir


def local_broker() -> KafkaBroker:
    return KafkaBroker(embedded_broker_dir())


def local_mariadb() -> MariaDBServer:
    return MariaDBServer(var_dir() / "mariadb")


def local_connect(
    bootstrap_servers: str = "", connector: DebeziumConnector | None = None
) -> KafkaConnect:
    """The dev Connect worker; without a connector it can be stopped or reported on."""
    return KafkaConnect(var_dir() / "connect", bootstrap_servers, connector)


def local_spark(pipeline: PipelineConfig) -> SparkConnectServer | None:
    """The Spark Connect server the stack runs for this config, None when it runs none."""
    if pipeline.spark.remote_port is None:
        return None
    return SparkConnectServer.for_config(pipeline, var_dir() / "spark-connect")


def local_spark_cluster(pipeline: PipelineConfig) -> SparkCluster | None:
    """The standalone cluster `spark.master` names on this machine, None for any other
    master (`local[N]`, or a cluster elsewhere)."""
    if pipeline.spark.master_port is None:
        return None
    cluster = SparkCluster(var_dir() / "spark-cluster")
    cluster.master.port = pipeline.spark.master_port
    return cluster


def local_s3(pipeline: PipelineConfig) -> S3Server | None:
    """The S3-compatible server for an `s3a://` lakehouse when the environment names no
    store of its own (`AWS_ENDPOINT_URL` unset, or on this machine); None otherwise."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    if not pipeline.lakehouse.path.startswith("s3a://") or (
            endpoint and "127.0.0.1" not in endpoint and "localhost" not in endpoint):
        return None
    return S3Server(var_dir() / "s3")


def s3_env(pipeline: PipelineConfig) -> str:
    """`export` lines pointing S3 clients at the local server (`eval` them in the shell
    that runs Dagster), starting it and the lakehouse's bucket when needed."""
    if (s3 := local_s3(pipeline)) is None:
        return "# no local S3: the lakehouse is not on s3a://, or AWS_ENDPOINT_URL names a store"
    if not s3._reuse_port():  # a running server keeps its port
        s3.start()
        s3.create_bucket(pipeline.lakehouse.path[len("s3a://"):].split("/", 1)[0])
    return "\n".join(f"export {k}={v}" for k, v in s3.env().items())


def local_redis(pipeline: PipelineConfig) -> RedisServer | None:
    """The Redis the stack runs for the handler example, None when nothing needs it."""
    from binlog_assets.examples.customer_cache import HANDLERS_SPEC

    if os.environ.get(REDIS_URL_ENV) or not any(
            s.handlers == HANDLERS_SPEC for s in pipeline.sources):
        return None
    return RedisServer(var_dir() / "redis")


def redis_url(pipeline: PipelineConfig) -> str:
    """`REDIS_URL` for the handlers of this config: the user's, or the local server's."""
    if (redis := local_redis(pipeline)) is None:
        return os.environ.get(REDIS_URL_ENV, "")
    redis.start()
    return redis.url


def local_registry(pipeline: PipelineConfig) -> SchemaRegistryServer | None:
    """The schema registry the stack runs for this config: when `schema_registry.url`
    names a port on this machine; None for a registry elsewhere, or none configured."""
    url = str(pipeline.schema_registry.get("url") or "")
    parts = urlsplit(url.split(",", 1)[0])
    if parts.hostname not in ("127.0.0.1", "localhost"):
        return None
    if parts.port is None or parts.scheme != "http":
        raise ValueError(f"schema_registry.url={url}: a registry on this machine needs "
                         f"http:// and a port, e.g. http://127.0.0.1:8081{CCOMPAT_PATH}")
    if parts.path.rstrip("/") != CCOMPAT_PATH:
        raise ValueError(f"schema_registry.url={url}: the local registry (Apicurio) answers "
                         f"Confluent's API under {CCOMPAT_PATH}, not at {parts.path or '/'}")
    return SchemaRegistryServer(var_dir() / "schema-registry", port=parts.port)


def registry_wanted(pipeline: PipelineConfig) -> str:
    """`yes` when `up` starts the schema registry (so `make stack-up` builds it first)."""
    return "yes" if local_registry(pipeline) is not None else "no"


def source_skip_reason(pipeline: PipelineConfig) -> str | None:
    """Why the local source stack does not run for this config, or None when it does."""
    if pipeline.bootstrap_servers:
        return (
            f"source stack: skipped, kafka.bootstrap.servers={pipeline.bootstrap_servers} is "
            "configured; the local MariaDB + Debezium source only feeds the embedded broker"
        )
    return None


def up(pipeline: PipelineConfig) -> str:
    lines = []
    if pipeline.bootstrap_servers:
        lines.append(f"kafka: using configured bootstrap.servers={pipeline.bootstrap_servers}")
    else:
        broker = local_broker()
        seconds = broker.start()
        lines.append(f"{broker.status()} (ready in {seconds:.1f}s)")
    if (cluster := local_spark_cluster(pipeline)) is not None:
        seconds = cluster.start()
        lines.append(f"{cluster.status()}\n(spark cluster ready in {seconds:.1f}s)")
    if (s3 := local_s3(pipeline)) is not None:
        s3_env(pipeline)
        lines.append(f"{s3.status()} (for its environment: eval \"$(stack s3-env)\")")
    if (spark := local_spark(pipeline)) is not None:
        seconds = spark.start()
        lines.append(f"{spark.status()} (ready in {seconds:.1f}s)")
    if (redis := local_redis(pipeline)) is not None:
        seconds = redis.start()
        lines.append(f"{redis.status()} (ready in {seconds:.1f}s; {REDIS_URL_ENV} for "
                     f"handlers: make dev sets it, or `stack redis-url`)")
    if (registry := local_registry(pipeline)) is not None:
        seconds = registry.start()
        lines.append(f"{registry.status()} (ready in {seconds:.1f}s)")
    return "\n".join(lines)


def down(pipeline: PipelineConfig) -> str:
    """Stop everything local; the source stack first, or Connect would keep retrying
    against a broker that is gone."""
    spark = local_spark(pipeline)
    if spark is not None:
        spark.stop()
    if (cluster := local_spark_cluster(pipeline)) is not None:
        cluster.stop()
    S3Server(var_dir() / "s3").stop()
    redis = RedisServer(var_dir() / "redis")
    redis.stop()
    registry = SchemaRegistryServer(var_dir() / "schema-registry")
    registry.stop()
    if pipeline.bootstrap_servers:
        return "kafka: configured cluster, nothing local to stop"
    source = source_down(pipeline)
    local_broker().stop()
    return "\n".join([source, local_broker().status(), *([spark.status()] if spark else []),
                      redis.status(), registry.status()])


def status(pipeline: PipelineConfig) -> str:
    spark = local_spark(pipeline)
    kafka = (f"kafka: configured bootstrap.servers={pipeline.bootstrap_servers}"
             if pipeline.bootstrap_servers else local_broker().status())
    redis = local_redis(pipeline)
    cluster = local_spark_cluster(pipeline)
    registry = local_registry(pipeline)
    return "\n".join([kafka, *([cluster.status()] if cluster else []),
                      *([spark.status()] if spark else []),
                      *([redis.status()] if redis else []),
                      *([registry.status()] if registry else [])])


def source_up(pipeline: PipelineConfig) -> str:
    """Start the broker (if needed), MariaDB and the Debezium worker; report timings."""
    skipped = source_skip_reason(pipeline)
    if skipped:
        return skipped
    broker = local_broker()
    broker.start()
    mariadb = local_mariadb()
    mariadb_seconds = mariadb.start()
    connect = local_connect(broker.bootstrap_servers, DebeziumConnector.for_server(mariadb))
    connect_seconds = connect.start()
    return "\n".join([
        broker.status(),
        f"{mariadb.status()} (ready in {mariadb_seconds:.1f}s)",
        f"{connect.status()} (ready in {connect_seconds:.1f}s)",
    ])


def source_down(pipeline: PipelineConfig) -> str:
    """Stop the Debezium worker, then MariaDB; the broker is left to `down`."""
    skipped = source_skip_reason(pipeline)
    if skipped:
        return skipped
    local_connect().stop()
    local_mariadb().stop()
    return source_status(pipeline)


def source_status(pipeline: PipelineConfig) -> str:
    return source_skip_reason(pipeline) or "\n".join(
        [local_mariadb().status(), local_connect().status()]
    )


_ACTIONS = {
    "up": up,
    "down": down,
    "status": status,
    "source-up": source_up,
    "source-down": source_down,
    "source-status": source_status,
    "redis-url": redis_url,
    "registry-wanted": registry_wanted,
    "s3-env": s3_env,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="binlake-stack", description=__doc__)
    parser.add_argument("action", choices=list(_ACTIONS))
    args = parser.parse_args(argv)
    pipeline = load_config()
    print(_ACTIONS[args.action](pipeline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
