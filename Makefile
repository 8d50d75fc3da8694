.PHONY: setup check setup-spark4 setup-peers bench-peers demo demo-s3 test test-spark4 test-random test-examples test-storage test-snapshot test-engines test-mariadb chaos bench bench-scale bench-sustained clean example-fraud example-iot example-customer360
VENV ?= .venv

setup:
	./scripts/bootstrap.sh

demo: setup
	$(VENV)/bin/lakestream demo

# The same demo with the warehouse in a local S3-compatible store (Versity's S3 gateway) behind Apache Iceberg's REST catalog server.
demo-s3: setup
	$(VENV)/bin/lakestream demo --storage s3 --catalog rest

example-fraud: setup
	$(VENV)/bin/lakestream demo --pattern fraud

example-iot: setup
	$(VENV)/bin/lakestream demo --pattern iot

example-customer360: setup
	$(VENV)/bin/lakestream demo --pattern customer360

# Lint, format and types, first in `make test` (docs/development.md): ruff's rules and formatting over the whole
# tree, then mypy (pyproject.toml's [tool.mypy]) held to scripts/mypy_baseline.txt, which may only shrink.
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/python scripts/mypy_check.py

# Two pytest workers (pytest-xdist): a module's tests stay on one worker (--dist loadfile), each worker starts its own
# session stack and Spark session. Most of a test's time is spent waiting on the JVMs and servers it starts, so two
# share the two cores well. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: check
	$(VENV)/bin/python -m pytest -x -v --durations=15 $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) tests

# The suite with the tests of each module in random order and the modules shuffled (pytest-random-order): it finds a
# test that passes only after the tests before it. The seed is printed at the top; `make test-random RANDOM_SEED=<seed>`
# runs that order again.
test-random: setup
	$(VENV)/bin/python -m pytest -x -v --durations=15 --random-order-bucket=module \
		$(if $(RANDOM_SEED),--random-order-seed=$(RANDOM_SEED)) tests

# Spark 4.1 (Scala 2.13, Java 17): a second venv with pyspark $(SPARK4_PYSPARK) instead of requirements.lock's 3.5.9
# (everything else as pinned), Iceberg's 4.1 runtime (jars.toml group spark4, picked by the pyspark version), and the
# core suite on it: every engine, sink, maintenance and read test that starts Spark, and verify (Lakestream's own
# Spark SQL casts, under Spark 4's ANSI mode). Left out: tests that never start Spark (tests/decode and the pure units
# engine/test_units, sink/test_latest, test_disk_index, test_convert_defaults, maintenance/test_policy: nothing in them
# changes with Spark; the decoding itself runs inside the Spark tasks of the engine and sink tests here), the long
# engine/test_chaos, test_exactly_once and test_fuzz (minutes each; crash recovery is here at small size in
# test_crash_between_tables, test_dead_letter_durability, test_overlap and test_restart_positions; malformed records in
# test_isolation and test_strict_types), and the areas beyond the core (capture, stack, storage, snapshot, process,
# health, dashboard, demo, CLI).
SPARK4_VENV ?= .venv-spark4
SPARK4_PYSPARK ?= 4.1.4
SPARK4_TESTS = \
	tests/engine/test_pipeline_basic.py tests/engine/test_batch_ids.py tests/engine/test_commit_cadence.py \
	tests/engine/test_crash_between_tables.py tests/engine/test_dead_letter_durability.py \
	tests/engine/test_engine_metrics.py tests/engine/test_fatal_failures.py tests/engine/test_isolation.py \
	tests/engine/test_overlap.py tests/engine/test_restart_positions.py tests/runtime/test_spark_packages.py \
	tests/runtime/test_spark_session.py tests/engine/test_cluster.py \
	tests/sink/test_append_mode.py tests/sink/test_ddl.py tests/sink/test_dead_letter_replay.py \
	tests/sink/test_debezium_edge_cases.py tests/sink/test_files_commit.py tests/sink/test_index_exactness.py \
	tests/sink/test_index_identity.py tests/sink/test_routing.py tests/sink/test_schema_evolution.py \
	tests/sink/test_strict_types.py tests/sink/test_row_lineage.py \
	tests/maintenance/test_maintenance_actions.py tests/maintenance/test_line_history.py \
	tests/maintenance/test_metadata_bounded.py tests/maintenance/test_pipeline_compaction.py \
	tests/maintenance/test_concurrent_ingest.py tests/maintenance/test_inline_beside_ingest.py \
	tests/read/test_engines.py tests/read/test_fresh.py tests/verify/test_verify.py

setup-spark4:
	LAKESTREAM_VENV=$(SPARK4_VENV) LAKESTREAM_PYSPARK=$(SPARK4_PYSPARK) ./scripts/bootstrap.sh

test-spark4: setup-spark4
	$(SPARK4_VENV)/bin/python -m pytest -x -v --durations=15 $(SPARK4_TESTS)

# The Customer 360 example as a test (checked against its SQL run from scratch); kept out of `make test`
# to hold it under 25 min — derived tables are tested there by test_derived_tables.
test-examples: setup
	$(VENV)/bin/python -m pytest -x -v -m examples tests/process

# The long object-storage scenarios (tests/storage/test_object_storage_slow.py): the parallel snapshot into S3
# behind Apache Iceberg's REST catalog server, SIGKILLs of the pipeline under load, an outage of the object store;
# plus the fast ones.
test-storage: setup
	$(VENV)/bin/python -m pytest -x -v --durations=15 -m 'storage_slow or not storage_slow' tests/storage tests/config/test_storage_config.py

# The long snapshot scenarios (tests/snapshot): a partitioned parent and tables without a primary key loaded by the
# parallel snapshot, drifted by hand and re-snapshotted while streaming; plus the fast snapshot tests.
test-snapshot: setup
	$(VENV)/bin/python -m pytest -x -v --durations=15 -m 'snapshot_slow or not snapshot_slow' tests/snapshot

# The long MariaDB scenarios (tests/demo/test_mariadb_slow.py, tests/capture/test_mariadb_snapshot.py): the shop demo
# from MariaDB, `lakestream run` SIGKILLed under a write load streaming from MariaDB, and the parallel snapshot of
# MariaDB tables under writes handed over to the binlog; plus the fast MariaDB tests that `make test` runs too.
test-mariadb: setup
	$(VENV)/bin/python -m pytest -x -v --durations=15 -m 'mariadb_slow or not mariadb_slow' tests/demo/test_mariadb_slow.py \
		tests/capture/test_mariadb_snapshot.py tests/capture/test_mariadb_capture.py tests/capture/test_mariadb_start_checks.py tests/stack/test_mariadb_stack.py \
		tests/decode/test_binlog_events.py tests/capture/test_ddl_without_rows.py

# Other engines reading the tables (marker engines): a Trino node, assembled from Trino's
# modules by coordinates (jars.toml's trino-server and trino-plugin-iceberg, ~480 MB resolved on first use; it runs on
# the Temurin 25 JDK, or LAKESTREAM_TRINO_JAVA_HOME), reads the pipeline's tables through the JDBC catalog and Apache
# Iceberg's REST catalog server, against Spark (tests/read/test_trino.py); `lakestream stack up --trino` and `sql
# --engine trino` on a stack of their own (tests/stack/test_trino_stack.py).
test-engines: setup
	$(VENV)/bin/python -m lakestream.runtime.jars trino-server trino-plugin-iceberg
	$(VENV)/bin/python -m pytest -x -v --durations=15 -m engines tests/read/test_trino.py tests/stack/test_trino_stack.py

# The long chaos scenarios (tests/engine/test_chaos.py); sized by LAKESTREAM_CHAOS_KILLS (20),
# LAKESTREAM_CHAOS_COMMIT_KILLS (half), LAKESTREAM_CHAOS_BROKER_OUTAGE_S (30), LAKESTREAM_CHAOS_CATALOG_OUTAGE_S (15),
# LAKESTREAM_CHAOS_RATE (150 changes/s), LAKESTREAM_CHAOS_LOAD_S (10). Figures: .lakestream/chaos-report.json.
# tests/capture/test_capture_kill_loop.py: capture SIGKILLed LAKESTREAM_CAPTURE_KILLS times (8) under a write load.
chaos: setup
	mkdir -p .lakestream
	LAKESTREAM_CHAOS_REPORT=$${LAKESTREAM_CHAOS_REPORT:-.lakestream/chaos-report.json} \
		$(VENV)/bin/python -m pytest -x -v -m chaos -o log_cli=true --log-cli-level=INFO tests/engine/test_chaos.py \
		tests/engine/test_exactly_once.py tests/maintenance/test_inline_beside_ingest.py \
		tests/maintenance/test_maintenance_kills.py tests/capture/test_capture_kill_loop.py
	cat $${LAKESTREAM_CHAOS_REPORT:-.lakestream/chaos-report.json}

bench: setup
	$(VENV)/bin/python bench/e2e.py

# Upsert batches at 1M and 20M rows (thousands of data files), driver memory and the key index's full build
# (bench/scale.py; the last line is one JSON object). Long: not part of `make test`.
bench-scale: setup
	$(VENV)/bin/python bench/scale.py $(BENCH_SCALE_ARGS)

# A sustained run on a 100M-row mirror: 5,000 changes/s for 10 min, inline maintenance, one SIGKILL of
# `lakestream run` half-way (bench/sustained.py; the last line is one JSON object). The base takes long to build:
# BENCH_SUSTAINED_ARGS="--state-dir DIR --keep" keeps it, "--state-dir DIR --reuse" starts from it.
bench-sustained: setup
	$(VENV)/bin/python bench/sustained.py $(BENCH_SUSTAINED_ARGS)

# Lakestream beside Flink SQL's Iceberg sink (changelog and upsert mode) and a Spark Structured Streaming + MERGE job
# (merge-on-read with hash distribution, copy-on-write), each configured as its own docs say (bench/peers/configs.py;
# docs/benchmarks.md): every configuration drains the same CDC backlog on each input, PEERS_RUNS times, the order
# alternating; exactness checked per run; each table compacted by its own system before the reads. Not part of
# `make test`. PEERS_SCALE=10m (10M base rows, a 1M-change backlog): an estimated 8-20 hours on 2 cores for 5
# configurations x 3 inputs x 3 runs; PEERS_SCALE=1m (1M rows, 200k changes): 1.5-4 hours. PEERS_ARGS adds run.py's flags (e.g.
# "--configs lakestream,flink-changelog --inputs json-schemas --memory-cap 6g"). The Flink peer runs under PyFlink in
# .venv-peers (bench only: not made by `make setup`).
setup-peers:
	./scripts/peers_venv.sh

# First, in a few minutes, that each configuration still starts and writes (tests/bench/test_peers.py, marker bench).
# Each run is appended to PEERS_RESULTS as it ends; the report's last line is one JSON object, and its summary line is
# appended to the file too (the line docs/benchmarks.md cites once the file is kept as bench/peers/results-*.jsonl and
# the page regenerated: bench/peers/report_doc.py).
PEERS_SCALE ?= 10m
PEERS_RUNS ?= 3
PEERS_RESULTS ?= .lakestream/bench-peers.jsonl
bench-peers: setup setup-peers
	mkdir -p .lakestream
	$(VENV)/bin/python -m pytest -x -q -m bench tests/bench/test_peers.py
	$(VENV)/bin/python bench/peers/run.py --scale $(PEERS_SCALE) --runs $(PEERS_RUNS) --results $(PEERS_RESULTS) $(PEERS_ARGS)
	$(VENV)/bin/python bench/peers/run.py --report $(PEERS_RESULTS) --append-summary

clean:
	-$(VENV)/bin/lakestream stack down
	rm -rf .lakestream
