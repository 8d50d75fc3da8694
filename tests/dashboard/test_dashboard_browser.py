"""`lakestream dashboard` in a real headless Chromium against a running pipeline: the page refreshes
itself as batches commit, its numbers match `lakestream health --json`, its charts and maintenance
history are drawn, and a screenshot is kept in `.lakestream/artifacts/dashboard.png`."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import load_debezium_fixture, produce_records, run_lakestream, write_pipeline_yaml

from lakestream.capture.process import LAKESTREAM_COMMAND
from lakestream.engine.loop import metrics_path, run_pipeline
from lakestream.maintenance.history import read_maintenance_log
from lakestream.maintenance.runner import maintain_tables
from lakestream.stack.process import free_ports

CHROMIUM = "/usr/bin/chromium"
# What works on this closed network (no background fetches of Google's hosts); see STACK.md.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACT = Path(__file__).resolve().parents[2] / ".lakestream" / "artifacts" / "dashboard.png"


def change(template: dict, row_id: int, op: str) -> tuple[str, str | None]:
    """A Debezium change of row ``row_id`` made from a recorded event, committed at the source now."""
    key = json.loads(template["key"])
    key["payload"]["id"] = row_id
    value = json.loads(template["value"])
    payload = value["payload"]
    payload["op"] = op
    payload["source"]["ts_ms"] = int(time.time() * 1000)
    if op == "d":
        payload["before"], payload["after"] = dict(payload["after"], id=row_id), None
    else:
        payload["after"] = dict(payload["after"], id=row_id, note=f"dashboard {row_id}")
    return json.dumps(key), json.dumps(value)


def retimed(value: str | None) -> str | None:
    """A recorded Debezium event as if committed at the source now (freshness in seconds, not days)."""
    if value is None:
        return None
    event = json.loads(value)
    event["payload"]["source"]["ts_ms"] = int(time.time() * 1000)
    return json.dumps(event)


def page_row(page, table: str) -> dict[str, str]:
    """The cells of ``table``'s row as the page shows them (field → raw value), and under "collected_ms"
    when the round they come from was measured; read in one go, between two refreshes."""
    return page.evaluate(
        """table => { const cells = document.querySelectorAll(`#tables tr[data-table="${table}"] td[data-field]`);
                      const row = Object.fromEntries([...cells].map(
                          c => [c.dataset.field, c.dataset.value ?? c.textContent]));
                      row.collected_ms = document.body.dataset.collectedMs; return row; }""",
        table,
    )


# Three JVMs (the test's, the dashboard's, `lakestream health`'s): ~2 min on a quiet machine, far more on a
# loaded one; the waits below are generous for the same reason.
@pytest.mark.timeout(1800)
def test_dashboard_in_chromium_matches_health(stack, spark, pipeline_config_factory, tmp_path):
    sync_playwright = pytest.importorskip(
        "playwright.sync_api", reason="pip install -r requirements.lock"
    ).sync_playwright
    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/bootstrap.sh installs the Debian package chromium"
    events = load_debezium_fixture()
    insert = next(e for e in events if e["value"] and '"op":"c"' in e["value"].replace(" ", ""))
    topic = f"dash{uuid.uuid4().hex[:6]}.public.all_types"
    ns = f"dash_{topic[4:10]}"
    table = f"{ns}.all_types"
    produce_records(
        stack.bootstrap_servers,
        topic,
        [(e["key"], retimed(e["value"])) for e in events] + [(events[0]["key"], "{not json")],
        partition=0,
    )  # one dead letter
    # A low snapshot threshold, so that the page has a crossed threshold to show.
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": ns, "table": "{table}"}],
        name=f"dash{topic[4:10]}",
        health={"thresholds": {"max_snapshots": 2, "max_freshness_s": 3600}},
    )
    pipeline_yaml = write_pipeline_yaml(config, stack, tmp_path / "pipeline.yaml")

    batches: list = []
    committed = threading.Condition()
    stop = threading.Event()
    failure: list[BaseException] = []

    def on_batch(result):
        with committed:
            batches.append(result)
            committed.notify_all()

    def wait_for_records(n: int, what: str) -> None:
        with committed:
            assert committed.wait_for(
                lambda: failure or sum(b.table_records.get(table, 0) for b in batches) >= n, 600
            ), f"timed out waiting for {what}"
        assert not failure, failure

    def run():
        try:
            run_pipeline(config, stop=stop, spark=spark, on_batch=on_batch)
        except BaseException as exc:  # noqa: BLE001 — reported by the test thread
            failure.append(exc)
            with committed:
                committed.notify_all()

    runner = threading.Thread(target=run, name="pipeline", daemon=True)
    runner.start()
    [port] = free_ports(1)
    dashboard_log = tmp_path / "dashboard.stderr"
    dashboard = None
    try:
        wait_for_records(7, "the first batch")
        maintain_tables(spark, config, [table])  # the maintenance history gets its first entries
        produce_records(stack.bootstrap_servers, topic, [change(insert, i, "c") for i in range(100, 120)], partition=0)
        wait_for_records(27, "the second batch")

        with dashboard_log.open("wb") as err:
            dashboard = subprocess.Popen(
                [
                    *LAKESTREAM_COMMAND,
                    "dashboard",
                    str(pipeline_yaml),
                    "--port",
                    str(port),
                    "--interval",
                    "3",
                    "--table",
                    table,
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 600
        while True:
            assert dashboard.poll() is None, dashboard_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the dashboard served no health round in time"
            try:
                if json.loads(urllib.request.urlopen(url + "api/state", timeout=5).read())["collected_ms"]:
                    break
            except OSError:
                pass  # not listening yet: the JVM is starting
            time.sleep(0.5)

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url)
            page.wait_for_selector(f'#tables tr[data-table="{table}"] td[data-field="rows"]', timeout=300_000)
            before = page_row(page, table)

            # The page refreshes itself: new changes commit and show up without a reload.
            produce_records(
                stack.bootstrap_servers,
                topic,
                [change(insert, 1, "u"), change(insert, 100, "d"), change(insert, 101, "d")],
                partition=0,
            )
            wait_for_records(30, "the third batch")
            page.wait_for_function(
                "([table, snapshots]) => { const c = document.querySelector("
                '`#tables tr[data-table="${table}"] td[data-field="snapshots"]`);'
                " return c && Number(c.dataset.value) > snapshots; }",
                arg=[table, int(before["snapshots"])],
                timeout=300_000,
            )

            # The pipeline is idle now (still running): numbers hold still, so the page and a separate
            # `lakestream health --json` process must agree.
            health_run = run_lakestream("health", str(pipeline_yaml), "--json", "--table", table, timeout=900)
            assert health_run.returncode == 0, health_run.stderr[-3000:]
            health = json.loads(health_run.stdout)
            page.wait_for_function(
                "ms => Number(document.body.dataset.collectedMs) > ms", arg=health["collected_ms"], timeout=300_000
            )
            shown = page_row(page, table)
            charts = page.evaluate("""() => Object.fromEntries(['freshness', 'throughput', 'lag', 'files_per_partition']
                .map(n => { const d = document.getElementById('chart-' + n);
                            return [n, {svg: !!d.querySelector('svg.main-svg'),
                                        traces: (d.data || []).map(t => ({name: t.name, points: t.x.length}))}]; }))""")
            badges = page.eval_on_selector_all(
                f'#tables tr[data-table="{table}"] span.badge',
                "bs => Object.fromEntries(bs.map(b => [b.dataset.metric, b.dataset.state]))",
            )
            maintenance_rows = page.eval_on_selector_all(
                "#maintenance tbody tr[data-action]", "rows => rows.map(r => r.dataset.action)"
            )
            ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACT), full_page=True)
            print(f"dashboard screenshot: {ARTIFACT}")
            browser.close()
    finally:
        stop.set()
        runner.join(60)
        if dashboard is not None:
            dashboard.terminate()
            out, _ = dashboard.communicate(timeout=60)
    assert not failure, failure
    assert dashboard.returncode == 0, dashboard_log.read_text()[-3000:]
    assert out == b"", out[:500]
    assert not errors, errors

    [measured] = [t for t in health["tables"] if t["table"] == table]
    count = spark.sql(f"SELECT count(*) FROM lake.{table}").collect()[0][0]
    assert measured["rows"] == count == 5 - 1 + 20 - 2  # ids 1,3,4,5 and 100-119 less the two deleted
    for field in (
        "rows",
        "data_files",
        "snapshots",
        "metadata_bytes",
        "files_per_partition_max",
        "small_file_share",
        "kafka_lag",
    ):
        assert float(shown[field]) == float(measured[field]), (field, shown[field], measured[field])
    # Freshness keeps growing between the two measurements, by exactly the time between them.
    elapsed = (int(shown["collected_ms"]) - health["collected_ms"]) / 1000
    assert abs(float(shown["freshness_s"]) - measured["freshness_s"] - elapsed) <= 0.25
    dead = spark.sql(
        f"SELECT count(*) FROM lake.lakestream.dead_letter WHERE pipeline = '{config.name}' "
        f"AND target_table = '{table}'"
    ).collect()[0][0]
    assert int(shown["dead_letters"]) == dead == 1
    # Every threshold is shown; those `health` reports crossed are red, the rest green or off.
    alerted = {a["metric"] for a in health["alerts"] if a["table"] == table}
    assert alerted == {"snapshots"}
    assert badges == {
        "files_per_partition": "ok",
        "small_file_share": "off",
        "snapshots": "alert",
        "metadata_bytes": "ok",
        "compaction_lag_s": "ok",
        "freshness_s": "ok",
        "kafka_lag": "off",
    }

    # Charts: drawn by plotly.js, one point per batch in the metrics log, a trace for the table.
    logged = [json.loads(line) for line in metrics_path(config).read_text().splitlines()]
    assert all(c["svg"] for c in charts.values()), charts
    assert charts["freshness"]["traces"][0]["points"] == len(logged) == len(batches)
    assert {"name": table, "points": len(batches)} in charts["throughput"]["traces"]
    assert {"name": f"{table} max", "points": charts["files_per_partition"]["traces"][0]["points"]} in charts[
        "files_per_partition"
    ]["traces"]
    assert charts["files_per_partition"]["traces"][0]["points"] >= 2  # rounds before and after the third batch
    # The maintenance history: the round run above, newest first.
    logged_actions = [m["action"] for m in read_maintenance_log(config)]
    assert logged_actions and maintenance_rows == logged_actions[::-1]
    assert ARTIFACT.stat().st_size > 20_000
