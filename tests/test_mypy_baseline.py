"""scripts/mypy_check.py's comparison of mypy's findings with the baseline: a new finding fails, a fixed one fails
until the baseline shrinks, a moved one (another line) does not. Pure units: mypy does not run here."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mypy_check", ROOT / "scripts" / "mypy_check.py")
assert _spec is not None and _spec.loader is not None
mypy_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mypy_check)
Finding, Located = mypy_check.Finding, mypy_check.Located


def mypy_line(file: str, line: int, code: str, message: str, severity: str = "error") -> str:
    return json.dumps(
        {"file": file, "line": line, "column": 4, "message": message, "hint": None, "code": code, "severity": severity}
    )


UNION = Finding("lakestream/a.py", "union-attr", 'Item "None" of "str | None" has no attribute "strip"')
ARG = Finding("lakestream/b.py", "arg-type", 'Argument 1 to "f" has incompatible type "int"; expected "str"')


def test_json_output_is_keyed_without_line_numbers_and_notes_are_skipped():
    out = "\n".join(
        [
            mypy_line("lakestream/a.py", 10, "union-attr", UNION.message),
            mypy_line("lakestream/a.py", 11, "misc", "a note", severity="note"),
            mypy_line("lakestream/c.py", 7, "no-redef", 'Name "out" already defined on line 82'),
            "Found 2 errors in 2 files",  # what a plain summary line would look like: not JSON, skipped
        ]
    )
    found = mypy_check.parse_mypy_json(out)
    assert [loc.finding for loc in found] == [
        UNION,
        Finding("lakestream/c.py", "no-redef", 'Name "out" already defined on line N'),
    ]
    assert [loc.line for loc in found] == [10, 7]


def test_baseline_round_trips_with_multiplicity():
    text = mypy_check.format_baseline([ARG, UNION, UNION])
    assert text.startswith("#")
    assert mypy_check.parse_baseline(text) == Counter({UNION: 2, ARG: 1})


def test_a_malformed_baseline_line_names_the_line():
    with pytest.raises(ValueError, match="line 2"):
        mypy_check.parse_baseline("# header\nlakestream/a.py union-attr no tabs here\n")


def test_same_findings_on_other_lines_pass():
    result = mypy_check.compare([Located(UNION, 99), Located(ARG, 1)], Counter({UNION: 1, ARG: 1}))
    assert result.ok


def test_a_new_finding_fails_and_is_reported_with_its_line():
    result = mypy_check.compare([Located(UNION, 10), Located(ARG, 20)], Counter({UNION: 1}))
    assert not result.ok
    assert result.new == [Located(ARG, 20)]
    assert not result.gone
    assert "lakestream/b.py:20" in mypy_check.report(result)


def test_one_more_occurrence_of_a_known_finding_fails():
    result = mypy_check.compare([Located(UNION, 10), Located(UNION, 30)], Counter({UNION: 1}))
    assert result.new == [Located(UNION, 30)]


def test_a_fixed_finding_fails_until_the_baseline_shrinks():
    result = mypy_check.compare([Located(UNION, 10)], Counter({UNION: 2, ARG: 1}))
    assert not result.ok
    assert not result.new
    assert result.gone == Counter({UNION: 1, ARG: 1})
    assert mypy_check.UPDATE_COMMAND in mypy_check.report(result)


def test_mypy_failing_to_run_is_told_from_findings():
    assert mypy_check.mypy_failed(2, [])  # a crash or a bad config
    assert mypy_check.mypy_failed(1, [])  # `No module named mypy`: exit 1, no finding
    assert not mypy_check.mypy_failed(1, [Located(UNION, 3)])
    assert not mypy_check.mypy_failed(0, [])


def test_the_committed_baseline_parses_and_is_sorted():
    text = mypy_check.BASELINE.read_text()
    counts = mypy_check.parse_baseline(text)
    assert text == mypy_check.format_baseline(counts.elements()), (
        f"{mypy_check.BASELINE.name} is not as --update writes it: run {mypy_check.UPDATE_COMMAND}"
    )
