"""Run mypy and hold its findings to a baseline that may only shrink (`make check`).

The modules pyproject.toml's [tool.mypy] checks are expected to be clean; what they are not yet is listed in
scripts/mypy_baseline.txt, one finding a line: file, error code and message, without the line number (so an edit
above a known finding does not count as a new one). The check fails on a finding the baseline does not list, and on a
baseline entry that no longer occurs: a fixed finding leaves the baseline with `--update`, so it only ever shrinks.

    python scripts/mypy_check.py            # check
    python scripts/mypy_check.py --update   # rewrite the baseline from the current findings
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "scripts" / "mypy_baseline.txt"
UPDATE_COMMAND = "python scripts/mypy_check.py --update"
HEADER = f"""\
# mypy findings not fixed yet: file, error code, message (tab-separated, one line per occurrence, no line numbers).
# Checked by scripts/mypy_check.py in `make check`: a finding not listed here fails it, and so does a line here that
# no longer occurs. Regenerate with `{UPDATE_COMMAND}` after fixing findings; never to admit new ones.
"""
# Messages that name another line ('already defined on line 82') would change with every edit above it.
_LINE_REFERENCE = re.compile(r"\bline \d+\b")


class Finding(NamedTuple):
    """One mypy error as the baseline keys it (no line number)."""

    file: str
    code: str
    message: str

    def line(self) -> str:
        return f"{self.file}\t{self.code}\t{self.message}"


class Located(NamedTuple):
    """A finding and where it is now, for the report."""

    finding: Finding
    line: int


def parse_mypy_json(output: str) -> list[Located]:
    """mypy's ``--output json`` lines (one object per error; notes ride on an error as its hint) as findings."""
    found = []
    for text in output.splitlines():
        if not text.startswith("{"):
            continue
        record = json.loads(text)
        if record.get("severity") != "error":
            continue
        message = _LINE_REFERENCE.sub("line N", str(record["message"]))
        finding = Finding(Path(record["file"]).as_posix(), str(record.get("code") or "misc"), message)
        found.append(Located(finding, int(record.get("line") or 0)))
    return found


def parse_baseline(text: str) -> Counter[Finding]:
    """The baseline file's findings, with their multiplicity (comments and blank lines skipped)."""
    counts: Counter[Finding] = Counter()
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        parts = raw.split("\t", 2)
        if len(parts) != 3:
            raise ValueError(f"{BASELINE.name} line {number}: expected file<TAB>code<TAB>message, got {raw!r}")
        counts[Finding(*parts)] += 1
    return counts


def format_baseline(findings: Iterable[Finding]) -> str:
    """The baseline file for ``findings``: the header, then one sorted line per occurrence."""
    return HEADER + "".join(f"{f.line()}\n" for f in sorted(findings))


class Comparison(NamedTuple):
    new: list[Located]  # found now, beyond what the baseline lists
    gone: Counter[Finding]  # listed in the baseline, no longer found

    @property
    def ok(self) -> bool:
        return not self.new and not self.gone


def compare(current: list[Located], baseline: Counter[Finding]) -> Comparison:
    """Findings beyond the baseline (by file, code and message, counting repeats) and baseline entries now gone.

    When a file has more occurrences of a finding than the baseline allows, the last ones (by line) are reported as
    new: which of several identical findings is the new one cannot be known without line numbers."""
    allowed = Counter(baseline)
    new = []
    for located in sorted(current, key=lambda loc: (loc.finding, loc.line)):
        if allowed[located.finding] > 0:
            allowed[located.finding] -= 1
        else:
            new.append(located)
    gone = +allowed  # the positive counts: baseline entries not matched by any current finding
    return Comparison(new, gone)


def run_mypy() -> tuple[int, str, str]:
    """mypy over pyproject.toml's [tool.mypy] files, with this interpreter (so the venv's stubs are seen)."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--output", "json"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return proc.returncode, proc.stdout, proc.stderr


def mypy_failed(status: int, found: list[Located]) -> bool:
    """Whether mypy itself failed (a bad config, a crash, mypy not installed) rather than reporting findings: exit 2,
    or exit 1 without a single finding."""
    return status not in (0, 1) or (status == 1 and not found)


def report(result: Comparison) -> str:
    lines = []
    if result.new:
        lines.append(f"mypy: {len(result.new)} finding(s) not in {BASELINE.relative_to(ROOT)} (fix them):")
        lines += [f"  {loc.finding.file}:{loc.line}: {loc.finding.message}  [{loc.finding.code}]" for loc in result.new]
    if result.gone:
        lines.append(
            f"mypy: {sum(result.gone.values())} baseline finding(s) no longer occur (fixed: shrink the "
            f"baseline with `{UPDATE_COMMAND}`):"
        )
        lines += [
            f"  {f.file}: {f.message}  [{f.code}]" + (f" (x{n})" if n > 1 else "")
            for f, n in sorted(result.gone.items())
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--update", action="store_true", help="rewrite the baseline from the current findings")
    args = parser.parse_args(argv)
    status, out, err = run_mypy()
    current = parse_mypy_json(out)
    if mypy_failed(status, current):
        sys.stderr.write(out + err)
        print(f"mypy failed to run (exit {status})", file=sys.stderr)
        return 2
    if args.update:
        BASELINE.write_text(format_baseline(loc.finding for loc in current))
        print(f"mypy: wrote {len(current)} finding(s) to {BASELINE.relative_to(ROOT)}")
        return 0
    baseline = parse_baseline(BASELINE.read_text()) if BASELINE.exists() else Counter()
    result = compare(current, baseline)
    if not result.ok:
        print(report(result), file=sys.stderr)
        return 1
    print(f"mypy: no new findings ({sum(baseline.values())} in the baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
