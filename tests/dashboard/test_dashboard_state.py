"""The dashboard's data assembly without Spark: threshold states, charts from the batch log and the
health history, the maintenance log, and the incremental batch-log reader."""

from __future__ import annotations

import orjson

from lakestream.config import parse_config
from lakestream.dashboard.state import BatchLog, build_dashboard
from lakestream.health.checks import evaluate
from lakestream.health.history import read_health_history, record_health
from lakestream.health.model import HealthReport
from lakestream.maintenance.actions import MaintenanceResult
from lakestream.maintenance.history import read_maintenance_log, record_maintenance
from lakestream.read.inspection import PartitionMetrics, TableMetrics

NOW = 1_800_000_000_000


def config(tmp_path):
    return parse_config(
        {
            "name": "dash",
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "catalog": {"uri": "jdbc:postgresql://127.0.0.1:1/c", "warehouse": f"file://{tmp_path}/wh"},
            "streams": [{"topics": ["t"], "namespace": "ns", "table": "t"}],
            "health": {"thresholds": {"max_snapshots": 10, "max_freshness_s": 60}},
            "state_dir": str(tmp_path / "state"),
        },
        "<test>",
    )


def batch(n: int, commit_ms: int, records: int, lag: int) -> dict:
    # Changes committed at the source 1-3 s before the batch commits.
    return {
        "batch": n,
        "records": records,
        "seconds": 0.5,
        "commit_ts_ms": commit_ms,
        "lag": lag,
        "source_ts_quantiles": [commit_ms - 3000, commit_ms - 2000, commit_ms - 1000, commit_ms - 3000],
        "table_records": {"ns.t": records},
        "table_lag": {"ns.t": lag},
    }


def test_dashboard_state_from_its_inputs(tmp_path):
    cfg = config(tmp_path)
    crowded = TableMetrics(
        "ns.t",
        NOW,
        rows=40,
        data_files=12,
        small_files=12,
        snapshots=25,
        metadata_bytes=9000,
        freshness_s=5.0,
        kafka_lag=None,
        last_compaction_ms=NOW - 60_000,
        partitions=[PartitionMetrics({}, 0, 12, 12_000, 0, None)],
    )
    broken = TableMetrics("ns.gone", NOW, error="table not found")
    alerts = evaluate(crowded, cfg.health.thresholds) + evaluate(broken, cfg.health.thresholds)
    report = HealthReport(NOW, [crowded, broken], alerts, {"ns.t": 0.0, "ns.gone": 0.0})
    batches = [
        batch(1, NOW - 7_200_000 * 4, 5, 9),  # older than the 6 h window: left out
        batch(2, NOW - 20_000, 100, 50),
        batch(3, NOW - 10_000, 300, 0),
    ]
    record_health(
        cfg,
        HealthReport(
            NOW - 30_000,
            [TableMetrics("ns.t", NOW - 30_000, data_files=4, partitions=[PartitionMetrics({}, 0, 4, 4000, 0, None)])],
        ),
    )
    record_health(cfg, report)
    record_maintenance(cfg, [MaintenanceResult("ns.t", "compact", "ok", 12, 1, seconds=2.0)], NOW - 5_000)

    state = build_dashboard(
        cfg, report, batches, read_health_history(cfg), read_maintenance_log(cfg), {"ns.t": 3, "-": 1}
    )
    state = orjson.loads(orjson.dumps(state))  # what the page receives
    rows = {r["table"]: r for r in state["tables"]}
    t = rows["ns.t"]
    assert (t["rows"], t["data_files"], t["snapshots"], t["dead_letters"]) == (40, 12, 25, 3)
    assert t["last_compaction_ms"] == NOW - 60_000
    states = {s["metric"]: s["state"] for s in t["thresholds"]}
    assert states == {
        "files_per_partition": "ok",
        "small_file_share": "off",
        "snapshots": "alert",
        "metadata_bytes": "ok",
        "compaction_lag_s": "ok",
        "freshness_s": "ok",
        "kafka_lag": "off",
    }
    assert rows["ns.gone"]["error"] == "table not found"
    assert state["healthy"] is False and state["summary"]["dead_letters"] == 4
    assert state["summary"]["batches"] == 2 and state["summary"]["records"] == 400
    summary = state["summary"]
    assert summary["freshness_batches"] == 2
    assert abs(summary["freshness_p50_s"] - 2.0) < 0.01 and abs(summary["freshness_p99_s"] - 3.0) < 0.05

    fresh = state["charts"]["freshness"]["data"]
    assert fresh[0]["x"] == [NOW - 20_000, NOW - 10_000]
    assert all(1.9 < v < 2.1 for v in fresh[0]["y"]) and all(2.9 < v <= 3.0 for v in fresh[1]["y"])
    throughput = state["charts"]["throughput"]["data"][0]
    assert throughput["y"] == [200.0, 30.0]  # 100 over its 0.5 s run, then 300 over the 10 s since
    lag = {tr["name"]: tr["y"] for tr in state["charts"]["lag"]["data"]}
    assert lag["ns.t"] == [50, 0]
    files = {tr["name"]: tr["y"] for tr in state["charts"]["files_per_partition"]["data"]}
    assert files["ns.t max"] == [4, 12]
    assert [(m["action"], m["files_before"], m["files_after"]) for m in state["maintenance"]] == [("compact", 12, 1)]


def test_batch_log_reads_only_complete_new_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    log = BatchLog(path, limit=3)
    assert log.read() == []
    path.write_bytes(b'{"batch": 1}\n{"batch": 2}\n{"bat')
    assert [b["batch"] for b in log.read()] == [1, 2]
    with path.open("ab") as fh:
        fh.write(b'ch": 3}\nnot json\n{"batch": 4}\n')
    assert [b["batch"] for b in log.read()] == [2, 3, 4]  # the torn line completed; the limit keeps 3
    path.write_bytes(b'{"batch": 9}\n')  # replaced by a shorter log
    assert [b["batch"] for b in log.read()] == [9]


def test_state_logs_stay_bounded(tmp_path):
    from lakestream.jsonlog import append_lines, read_lines

    path = tmp_path / "h.jsonl"
    for round_ in range(200):
        append_lines(path, [{"round": round_, "pad": "x" * 80}], max_bytes=4096)
    assert path.stat().st_size <= 4096
    kept = [r["round"] for r in read_lines(path, limit=1000)]
    assert kept[-1] == 199 and kept == list(range(kept[0], 200))  # the newest, contiguous, none torn
    assert [r["round"] for r in read_lines(path, limit=2, keep=lambda r: r["round"] % 2 == 0)] == [196, 198]
