"""Capture's offsets file across SIGKILLs (`lakestream/java/capture/AtomicFileOffsetBackingStore.java`): real
PostgreSQL → ``lakestream capture`` → Kafka → Spark → Iceberg.

Kafka's FileOffsetBackingStore rewrote the file in place every second, and read a file cut short as no offsets: a
kill inside that write made the next start take a new snapshot, after which the rows deleted while capture was
down stayed in the mirror (their deletes were never published). Here: capture killed at the pause point between
writing the new offsets and replacing the file resumes from the stored ones (the deletes made while it was down
are published, nothing is snapshotted again, `verify` passes); and a file cut short (what Kafka's store left)
stops capture with the fix instead of a silent new snapshot.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from capture_harness import start_captured_source, stop_captured_source, verify_ok

from lakestream.faults import PAUSE_MARKER

SETUP = [
    "CREATE TABLE offs_acct (id int PRIMARY KEY, v text)",
    "INSERT INTO offs_acct SELECT g, 'v' || g FROM generate_series(1, 20) g",
]


def _wait_for(predicate, what: str, source, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {timeout:.0f}s:\n{source.capture.log_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture
def paused(stack, spark, tmp_path, monkeypatch):
    arm = tmp_path / "arm"
    monkeypatch.setenv("LAKESTREAM_PAUSE_AT", f"capture.offsets.written:120@{arm}")
    source = start_captured_source(stack, SETUP, ["offs_acct"], "offs")
    try:
        source.sync({"offs_acct": 20})
        yield source, arm
    finally:
        stop_captured_source(source)


def test_a_kill_while_offsets_are_saved_keeps_the_stored_ones(paused, spark):
    source, arm = paused
    offsets = Path(source.config.state_dir) / "capture" / f"{source.config.capture.slot_name}.offsets"
    source.sql("UPDATE offs_acct SET v = 'changed' WHERE id <= 3")
    source.wait_for_events({"offs_acct": 23})
    arm.touch()
    source.sql("UPDATE offs_acct SET v = 'again' WHERE id = 4")  # a new position for the next save
    _wait_for(lambda: f"{PAUSE_MARKER} capture.offsets.written" in source.capture.log_text(), "the pause", source)
    stored = offsets.read_bytes()
    source.capture.kill()
    assert stored and offsets.read_bytes() == stored
    assert offsets.with_name(offsets.name + ".tmp").exists()

    arm.unlink()
    before = source.end_offset("offs_acct")
    source.sql("DELETE FROM offs_acct WHERE id BETWEEN 5 AND 9")  # while capture is down
    source.capture.start()
    source.capture.wait_until_streaming(timeout=300)
    source.wait_for_events({"offs_acct": before + 10})  # five deletes, each with its tombstone
    after = [m["value"] for m in source.published("offs_acct")[before:]]
    assert not [v for v in after if v and v["op"] == "r"], "capture took a new snapshot after the kill"
    deleted = sorted(v["before"]["id"] for v in after if v and v["op"] == "d")
    assert deleted == [5, 6, 7, 8, 9]
    source.run()
    verify_ok(source, spark, ["offs_acct"])

    # A file cut short, as Kafka's store left it when killed inside its write: capture refuses to start.
    source.capture.kill()
    offsets.write_bytes(stored[: len(stored) // 2])
    end = source.end_offset("offs_acct")
    source.capture.start()
    _wait_for(lambda: not source.capture.running, "capture stopping", source)
    log = source.capture.log_text()
    assert "is damaged" in log and str(offsets.resolve()) in log and "fix:" in log, log[-3000:]
    assert source.end_offset("offs_acct") == end, "capture published events from a damaged offsets file"
