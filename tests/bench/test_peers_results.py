"""The peers bench's results file: one system per run, the report built from the latest line of each, and refused
when two systems ran with different parameters (bench/peers/run.py --results / --report). Pure: no stack."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]

from run import append_result, latest_results  # noqa: E402

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
