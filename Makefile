# binlake set-up and entry points. Every target installs what it needs, idempotently.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
JARS := .cache/jars
export DAGSTER_HOME := $(CURDIR)/var/dagster

.PHONY: setup registry class-archive demo test test-long drills-long soak test-unit stack-up stack-down stack-status source-up source-down source-status dev lint bench bench-catchup bench-load

setup: .cache/apt.stamp $(VENV)/.installed $(JARS)/kafka/.stamp $(JARS)/delta/.stamp $(JARS)/connect/.stamp $(JARS)/s3/.stamp $(DAGSTER_HOME)/dagster.yaml class-archive

# The Spark driver's class archive (binlog_assets/dev/class_archive.py): built once
# per JDK, PySpark and Delta (about a minute), a no-op when present.
class-archive: $(VENV)/.installed $(JARS)/delta/.stamp
	$(PY) -m binlog_assets.dev.class_archive

.cache/apt.stamp: setup/apt.sh
	@mkdir -p .cache
	bash setup/apt.sh
	@touch $@

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

$(JARS)/%/.stamp: setup/maven/%/pom.xml | .cache/apt.stamp
	rm -rf $(JARS)/$*
	cd setup/maven/$* && mvn -q -B dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(JARS)/$*
	@touch $@

## The dev schema registry (Apicurio 2.4.2, binlog_assets/dev/registry.py): a Quarkus build
## from Maven Central, about 3 minutes the first time; only the Avro tests and a config
## whose schema_registry.url is on this machine need it, so `make demo` never builds it.
REGISTRY_JAR := $(JARS)/registry/apicurio-registry-2.4.2.Final-runner.jar
registry: $(REGISTRY_JAR)

$(REGISTRY_JAR): setup/maven/registry/pom.xml setup/maven/registry/src/main/resources/application.properties | .cache/apt.stamp
	rm -rf $(JARS)/registry
	cd setup/maven/registry && mvn -q -B package -DskipTests -Dbinlake.build.dir=$(CURDIR)/$(JARS)/registry/build
	mv $(JARS)/registry/build/binlake-registry-1-runner.jar $@
	rm -rf $(JARS)/registry/build

$(DAGSTER_HOME)/dagster.yaml: setup/dagster.yaml
	@mkdir -p $(DAGSTER_HOME)
	cp setup/dagster.yaml $@

## The main job, end to end on the embedded local stack.
demo: setup
	$(PY) -m binlog_assets.dev.demo

## The test suite: ruff and the rooms' import order first, then unit + integration on the real broker, Spark/Delta,
## MariaDB and Debezium.
## Three workers (TEST_WORKERS) on the 2 cores, each with its own stack: while one waits
## on a broker, a child process or a Spark job, the others run (docs/testing.md). A file
## goes to one worker whole, so a module's fixture (a built lake, a broker) is made once.
TEST_WORKERS ?= 3
test: setup registry
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -m "not long" -n $(TEST_WORKERS) --dist loadfile --durations=20

## The long variants: the daemon-driven end-to-end pipeline (backfill + automation), the
## seeded schema-change drills and the replica tests' rewrite variants; on the same
## workers as `make test` (one process took over an hour).
test-long: setup registry
	$(PY) -m pytest -q -m long -n $(TEST_WORKERS) --dist loadfile --durations=20

## The long drill variants (more SIGKILL trials, fuzz examples, fencing races); their
## figures go to var/drills/report.json and report.md (BINLAKE_DRILL_REPORT moves them).
drills-long: setup registry
	$(PY) -m pytest -q -s -m long tests/drills tests/orchestration/test_fencing.py

## The soak (tests/soak/soak.py): the shipped automation on a PostgreSQL instance under a
## MariaDB workload and faults on a seeded schedule, SOAK_MINUTES of workload, then the
## drain and its checks; the report goes to var/soak/report.json and report.md.
SOAK_MINUTES ?= 30
SOAK_SEED ?= 1
soak: setup
	$(PY) tests/soak/soak.py --minutes $(SOAK_MINUTES) --seed $(SOAK_SEED)

test-unit: setup
	$(PY) -m pytest -q -m "not integration"

stack-up: setup
	@if [ "$$($(PY) -m binlog_assets.dev.stack registry-wanted)" = yes ]; then \
		$(MAKE) --no-print-directory registry; fi
	$(PY) -m binlog_assets.dev.stack up

stack-down:
	$(PY) -m binlog_assets.dev.stack down

stack-status:
	$(PY) -m binlog_assets.dev.stack status

## The binlog source in front of the embedded broker: MariaDB + Debezium (Connect standalone).
source-up: setup
	$(PY) -m binlog_assets.dev.stack source-up

source-down:
	$(PY) -m binlog_assets.dev.stack source-down

source-status:
	$(PY) -m binlog_assets.dev.stack source-status

## The Dagster UI over workspace.yaml (starts the local broker first).
dev: stack-up
	REDIS_URL="$${REDIS_URL:-$$($(PY) -m binlog_assets.dev.stack redis-url)}" \
		$(PY) -m binlog_assets.dev.dagster_dev

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

## The benchmarks (bench/README.md); each prints its ratio against a baseline of the same run.
## Spark's Kafka source is for the benches only (E3's anchor, bench/anchor_spark.py).
bench: setup $(JARS)/spark-kafka/.stamp
	$(PY) bench/bench_pipeline.py && $(PY) bench/bench_slow_handlers.py && $(PY) bench/bench_memory.py \
	  && $(PY) bench/bench_merge.py

## L1: a big table's initial load beside a plain Spark JDBC copy (MariaDB Connector/J,
## bench only, .cache/jars/jdbc).
bench-load: setup $(JARS)/jdbc/.stamp
	$(PY) bench/bench_load.py

## E3, quick: binlake's catch-up beside the baseline and the Spark job one would write instead.
bench-catchup: setup $(JARS)/spark-kafka/.stamp
	$(PY) bench/bench_catchup.py
