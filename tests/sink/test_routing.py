"""Routing by topic pattern: a topic created while the pipeline runs gets its table without a restart."""

from __future__ import annotations

import json
import threading
import time
import uuid

from conftest import produce_records

from lakestream.engine.loop import run_pipeline


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_topic_pattern_picks_up_a_topic_created_while_running(stack, spark, pipeline_config_factory):
    uid = uuid.uuid4().hex[:8]
    ns = f"pat_{uid}"
    first, second = f"pat{uid}.public.first", f"pat{uid}.public.second"
    config = pipeline_config_factory(
        [{"topic_pattern": rf"pat{uid}\..*", "mode": "append", "namespace": ns, "table": "{table}"}],
        name=f"pattern{uid}",
    )
    produce_records(stack.bootstrap_servers, first, [(None, json.dumps({"n": 1}))])
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_pipeline(config, stop=stop, spark=spark)
        except BaseException as exc:  # noqa: BLE001 — surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: errors or spark.catalog.tableExists(f"lake.{ns}.first"), 300, "the first table")
        assert not errors, errors
        started = time.monotonic()
        produce_records(
            stack.bootstrap_servers, second, [(None, json.dumps({"m": "x"})), (None, json.dumps({"m": "y"}))]
        )

        def second_landed() -> bool:
            if errors or not spark.catalog.tableExists(f"lake.{ns}.second"):
                return bool(errors)
            return spark.table(f"lake.{ns}.second").count() == 2

        _wait_for(second_landed, 300, "the table of the topic created while running")
        assert not errors, errors
        assert thread.is_alive(), "the pipeline stopped on its own"
        print(f"new topic landed {time.monotonic() - started:.1f}s after its first record")
        assert sorted(r["m"] for r in spark.table(f"lake.{ns}.second").collect()) == ["x", "y"]
        assert [r["n"] for r in spark.table(f"lake.{ns}.first").collect()] == [1]
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive()
    assert not errors, errors
