"""The peers bench's results file: one system per run, the report built from the latest line of each, and refused
when two systems ran with different parameters (bench/peers/phases.py --results / --report). Pure: no stack."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]

from phases import append_result, latest_results, rate_per_core, report  # noqa: E402

PARAMS = {"rows": 1000, "rate": 2000.0, "duration": 600.0, "kill_duration": 120.0, "ramp": [2000.0], "step_s": 300.0}


def summary(**params):
    load = {"loadavg_1m": 0.5, "loadavg_5m": 0.5, "loadavg_15m": 0.5, "cpus": 2}
    return {"params": {**PARAMS, **params}, "versions": {}, "commit": "abc", "started": "t", "load_start": load}


def test_the_report_takes_the_latest_line_of_each_system_in_first_run_order(tmp_path):
    path = tmp_path / "r.jsonl"
    append_result(path, summary(), {"system": "lakestream", "base": {"seconds": 9}})
    append_result(path, summary(), {"system": "flink", "base": {"seconds": 20}})
    append_result(path, summary(), {"system": "lakestream", "base": {"seconds": 8}})
    lines = latest_results(path)
    results = [line["result"] for line in lines]
    assert [r["system"] for r in results] == ["lakestream", "flink"]
    assert results[0]["base"]["seconds"] == 8
    assert lines[0]["commit"] == "abc" and "loadavg_1m" in lines[0]["load_end"]


def test_systems_run_with_other_parameters_are_refused_naming_them(tmp_path):
    path = tmp_path / "r.jsonl"
    append_result(path, summary(), {"system": "lakestream"})
    append_result(path, summary(rows=5000, rate=1000.0), {"system": "spark"})
    with pytest.raises(ValueError, match="spark ran with other rows, rate than lakestream"):
        latest_results(path)


def test_a_line_that_is_not_a_result_is_named_by_its_number(tmp_path):
    path = tmp_path / "r.jsonl"
    append_result(path, summary(), {"system": "lakestream"})
    with path.open("a") as fh:
        fh.write(json.dumps({"no": "result"}) + "\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:2: not a result line"):
        latest_results(path)
    with pytest.raises(ValueError, match="no results file"):
        latest_results(tmp_path / "missing.jsonl")


def test_the_rate_per_core_is_the_highest_kept_step_over_its_writer_cores(tmp_path, capsys):
    steps = [
        {"rate": 2000.0, "offered": 2000, "kept_up": True, "writer_cores": 0.4},
        {"rate": 5000.0, "offered": 4990, "kept_up": True, "writer_cores": 0.5},
        {"rate": 10000.0, "offered": 9000, "kept_up": False, "writer_cores": 1.9},
    ]
    assert rate_per_core({"ramp": {"steps": steps}}) == 9980
    assert rate_per_core({"ramp": {"steps": steps[2:]}}) is None  # kept up with no step
    assert rate_per_core({"system": "flink"}) is None  # no ramp ran
    path = tmp_path / "r.jsonl"
    append_result(path, summary(), {"system": "lakestream", "ramp": {"steps": steps}})
    assert report(path, tmp_path / "c.svg") == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["rate_per_core"] == {"lakestream": 9980}
    assert "changes/s per core" in (tmp_path / "c.svg").read_text()
