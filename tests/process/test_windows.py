"""The IoT example end to end: readings (some late within the allowed lateness, some ten minutes late)
→ tumbling and hopping windows per machine; both windows tables equal a reference aggregation that
counts the late readings and leaves out the too-late ones, which are dead letters "late"."""

from __future__ import annotations

import uuid

from lakestream.demo.iot import IotSettings, run_iot_demo


def _reference(readings: list[dict], key: str, size_ms: int, slide_ms: int) -> dict[tuple[str, int], tuple]:
    windows: dict[tuple[str, int], list[dict]] = {}
    for r in readings:
        last = r["ts"] // slide_ms * slide_ms
        for start in range(last - size_ms + slide_ms, last + 1, slide_ms):
            windows.setdefault((r[key], start), []).append(r)
    return {
        k: (len(v), round(sum(r["temperature"] for r in v), 6), max(r["temperature"] for r in v))
        for k, v in windows.items()
    }


def test_iot_windows_match_a_reference_aggregation_with_late_readings(stack, spark, service_dir_factory, capsys):
    uid = uuid.uuid4().hex[:6]
    result = run_iot_demo(
        IotSettings(state_dir=service_dir_factory("iot"), readings=160, seed=11, namespace=f"iot_{uid}"),
        info=stack,
        spark=spark,
    )
    assert len(result.config.windows) == 2 and result.too_late
    for w in result.config.windows:
        rows = result.windows[w.table]
        got = {
            (r[w.key], int(r["window_start"].timestamp() * 1000)): (
                r["count"],
                round(r["temperature_sum"], 6),
                r["temperature_max"],
            )
            for r in rows
        }
        assert got == _reference(result.kept, w.key, w.size_s * 1000, w.slide * 1000), w.name
        for r in rows:
            assert abs(r["temperature_avg"] - r["temperature_sum"] / r["temperature_count"]) < 1e-9
            assert (r["window_end"] - r["window_start"]).total_seconds() == w.size_s
    assert result.late_dead_letters == len(result.too_late) * len(result.config.windows)
    for w, second in zip(result.config.windows, ["equipment_id", "equipment_id_bucket"], strict=True):
        fields = [f.name for f in spark.table(f"lake.{w.table}.partitions").schema["partition"].dataType.fields]
        assert fields == ["window_start_day", second]
    out = capsys.readouterr().out
    assert "the latest window per machine" in out and "late readings refused" in out
