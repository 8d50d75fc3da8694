"""docs/benchmarks.md is generated from the peers bench's results files, and every figure on it names the results
line it comes from (bench/peers/report_doc.py). Pure: no stack."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench" / "peers")]

from report_doc import DOC, check, render, results_files  # noqa: E402


def spread(median, low, high):
    return {"median": median, "min": low, "max": high, "n": 3}


def summary_line() -> dict:
    row = {
        "runs": 3,
        "errors": [],
        "changes_per_cpu_s": spread(41234.5, 40000, 43001),
        "drain_s": spread(60.25, 58.1, 70),
        "exact": [True, True, True],
        "peak_rss_mb": spread(2900, 2800, 3100),
        "compaction_s": spread(12.5, 11, 14),
        "compaction_cpu_s": spread(20, 19, 22),
        "reads": {
            "spark_point_lookup_s": spread(0.41, 0.4, 0.5),
            "spark_full_aggregate_s": spread(1.2, 1.1, 1.3),
            "duckdb_point_lookup_s": spread(0.2, 0.19, 0.25),
            "duckdb_full_aggregate_s": spread(0.9, 0.8, 1),
        },
        "load_1m": spread(1.5, 1.2, 2.1),
    }
    return {
        "kind": "summary",
        "invocation": "abc123",
        "started": "2026-12-08T00:00:00Z",
        "commit": "deadbee",
        "params": {"base_rows": 1000000, "backlog": 200000, "runs": 3, "commit_interval_s": 10.0},
        "by_config": {"lakestream": {"json-schemas": row}, "flink-changelog": {"json-schemas": row}},
        "lakestream_ratio_changes_per_cpu_s": {"json-schemas": {"flink-changelog": 1.0}},
    }


def test_the_page_is_the_generators_output_from_the_results_files():
    assert DOC.read_text() == render(results_files()), "regenerate it: python bench/peers/report_doc.py"


def test_every_figure_on_the_page_has_a_results_line():
    assert check(DOC) == []


def test_a_generated_page_passes_and_a_planted_figure_fails(tmp_path):
    results = tmp_path / "results-x.jsonl"
    results.write_text(json.dumps({"kind": "run"}) + "\n" + json.dumps(summary_line()) + "\n")
    page = tmp_path / "benchmarks.md"
    page.write_text(render([results]))
    assert "41,234.5 (40,000–43,001) [results-x.jsonl:2]" in page.read_text()
    assert check(page, tmp_path) == []

    planted = page.read_text() + "\nFlink's table could not finish a full aggregate in 300 s.\n"
    page.write_text(planted)
    [problem] = check(page, tmp_path)
    assert "300 with no results line" in problem

    # A figure beside a citation that does not hold it, and a citation of a line that does not exist.
    page.write_text(planted.replace("in 300 s.", "in 300 s [results-x.jsonl:2]. Spark 7.7 s [results-x.jsonl:9]."))
    problems = check(page, tmp_path)
    assert any("300, 7.7 not in the cited results line" in p for p in problems)
    assert any("results-x.jsonl has no line 9" in p for p in problems)


def test_code_and_inline_code_hold_no_figures(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("Run `make bench-peers PEERS_SCALE=1m` on two cores.\n```\nrun.py --runs 3\n```\n")
    assert check(page, tmp_path) == []
