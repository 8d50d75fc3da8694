"""The change feed (`lakestream.changes`) against an oracle: the difference of two full reads.

For every range checked, the net changes the feed gives equal, key by key, what a full read of the table at
``since`` and at ``until`` says changed (insert, update, delete, with the row before and after), and each change
names the commit that made it (the first snapshot after which the key's row stays as ``until`` has it, found by
reading every snapshot of the range). Tables changed by Spark SQL (merge-on-read, format v3: deletion vectors)
through updates, deletes, re-inserts, Iceberg's ``rewrite_data_files``, a column added with a default, a widened
column and a delete of every row; a table without a primary key (rows matched by ``_row_id``); a mirror written by
the pipeline, through its compaction and a TRUNCATE. Also: ``--all`` (every commit against its parent), an
expired ``since``, ``--to`` with its checkpoint, and the CLI's ``--format json``.
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import produce_records, run_lakestream, write_pipeline_yaml

from lakestream.changes import append_changes, plan_range, read_changes, read_changes_arrow
from lakestream.errors import ChangeFeedError
from lakestream.sink.catalog.sink import add_column_with_default, table_info

NS = "changes"
V3_MOR = (
    "'format-version'='3', 'write.delete.mode'='merge-on-read', "
    "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read'"
)

Match = tuple[Any, ...]
Changes = dict[Match, tuple[str, dict | None, dict | None]]


def _current(spark, name: str) -> int:
    return int(table_info(spark, "lake", NS, name)["snapshot_id"])


# A snapshot's rows never change: each is read once per set of columns, however many ranges and commit checks
# (every snapshot of a range) ask for it.
_SNAPSHOT_ROWS: dict[tuple, list[dict]] = {}


def _rows(spark, ident: str, snapshot: int, columns: list[str], defaults: dict[str, Any]) -> list[dict]:
    """Every live row at ``snapshot`` in the current ``columns`` (a column added later reads as its default)."""
    key = (ident, snapshot, tuple(columns), tuple(sorted(defaults.items())))
    if key not in _SNAPSHOT_ROWS:
        _SNAPSHOT_ROWS[key] = _read_rows(spark, ident, snapshot, columns, defaults)
    return [dict(r) for r in _SNAPSHOT_ROWS[key]]


def _read_rows(spark, ident: str, snapshot: int, columns: list[str], defaults: dict[str, Any]) -> list[dict]:
    df = spark.sql(f"SELECT *, _row_id, _last_updated_sequence_number FROM {ident} VERSION AS OF {snapshot}")
    out = []
    for r in df.collect():
        d = r.asDict()
        out.append(
            {
                **{c: d.get(c, defaults.get(c)) for c in columns},
                "_row_id": d["_row_id"],
                "_seq": d["_last_updated_sequence_number"],
            }
        )
    return out


def _by_match(rows: list[dict], keys: list[str]) -> dict[Match, dict]:
    out: dict[Match, dict] = {}
    for r in rows:
        m = tuple(r[k] for k in keys) if keys else (r["_row_id"],)
        assert m not in out, f"two live rows for {m}"
        out[m] = r
    return out


def _content(row: dict | None, columns: list[str]) -> dict | None:
    return None if row is None else {c: row[c] for c in columns}


def oracle(spark, ident: str, since: int, until: int, keys: list[str], columns: list[str], defaults) -> Changes:
    """The net changes of (since, until] by two full reads."""
    before = _by_match(_rows(spark, ident, since, columns, defaults), keys)
    after = _by_match(_rows(spark, ident, until, columns, defaults), keys)
    out: Changes = {}
    for m in before.keys() | after.keys():
        b, a = _content(before.get(m), columns), _content(after.get(m), columns)
        if b == a:
            continue
        kind = "insert" if b is None else "delete" if a is None else "update"
        out[m] = (kind, a, b)
    return out


def feed(table, keys: list[str], columns: list[str]) -> tuple[Changes, dict[Match, int]]:
    """The feed's changes by key, and the commit each names."""
    out: Changes = {}
    commits: dict[Match, int] = {}
    for r in table.to_pylist():
        after = None if r["_change_type"] == "delete" else {c: r[c] for c in columns}
        before = None if r["_before"] is None else {c: r["_before"][c] for c in columns}
        side = after if after is not None else before
        assert side is not None, r
        m = tuple(side[k] for k in keys) if keys else (r["_row_id"],)
        assert m not in out, f"the feed gives {m} twice: {out[m]} and {r}"
        out[m] = (r["_change_type"], after, before)
        commits[m] = r["_commit_snapshot_id"]
    return out, commits


def expected_commits(spark, ident, snapshots: list[int], keys, columns, defaults, changed) -> dict[Match, int]:
    """For each changed key, the first snapshot of the range after which its row stays as the last one has it."""
    states = [_by_match(_rows(spark, ident, s, columns, defaults), keys) for s in snapshots]

    def state(i: int, m: Match):
        r = states[i].get(m)
        return None if r is None else (tuple(r[c] for c in columns), r["_row_id"], r["_seq"])

    out = {}
    for m in changed:
        i = len(snapshots) - 1
        while i > 1 and state(i - 1, m) == state(len(snapshots) - 1, m):
            i -= 1
        out[m] = snapshots[i]
    return out


def _ancestry(spark, ident: str, since: int, until: int) -> list[int]:
    """since, then every snapshot up to until, oldest first."""
    parents = {
        r["snapshot_id"]: r["parent_id"]
        for r in spark.sql(f"SELECT snapshot_id, parent_id FROM {ident}.snapshots").collect()
    }
    chain = [until]
    while chain[-1] != since:
        chain.append(parents[chain[-1]])
    return chain[::-1]


def check_range(spark, name: str, since: int, until: int, keys, columns, defaults, commits: bool = False) -> int:
    ident = f"lake.{NS}.{name}"
    got = read_changes_arrow(spark, "lake", f"{NS}.{name}", since, until, key_columns=keys)
    changes, named = feed(got, keys, columns)
    want = oracle(spark, ident, since, until, keys, columns, defaults)
    assert changes == want, f"({since}, {until}]: feed {sorted(changes.items())} != full reads {sorted(want.items())}"
    if commits:
        chain = _ancestry(spark, ident, since, until)
        assert named == expected_commits(spark, ident, chain, keys, columns, defaults, want.keys())
    return len(changes)


@pytest.fixture
def twin(spark):
    name = f"twin_{uuid.uuid4().hex[:6]}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    spark.sql(
        f"CREATE TABLE lake.{NS}.{name} (id bigint NOT NULL, v int, s string) USING iceberg TBLPROPERTIES ({V3_MOR})"
    )
    spark.sql(f"ALTER TABLE lake.{NS}.{name} SET IDENTIFIER FIELDS id")
    return name


def test_net_changes_equal_the_full_read_diff_through_compaction_schema_evolution_and_truncate(spark, twin):
    t = f"lake.{NS}.{twin}"
    snaps: list[int] = []
    at: dict[str, int] = {}  # a step's name -> the index of the snapshot it made

    def step(sql: str, label: str = "") -> None:
        spark.sql(sql.format(t=t))
        snaps.append(_current(spark, twin))
        at[label] = len(snaps) - 1

    step("INSERT INTO {t} SELECT id, 0, 'a' FROM range(0, 200)")
    step(
        "MERGE INTO {t} x USING (SELECT id, 1 AS v FROM range(0, 20)) y ON x.id = y.id "
        "WHEN MATCHED THEN UPDATE SET v = y.v"
    )
    step("DELETE FROM {t} WHERE id >= 20 AND id < 30")
    step("INSERT INTO {t} SELECT id, 2, 'b' FROM range(200, 210)")
    step("DELETE FROM {t} WHERE id = 200")
    step("INSERT INTO {t} VALUES (20, 3, 'back'), (200, 3, 'back')")  # re-inserts: new row ids
    step(
        f"CALL lake.system.rewrite_data_files(table => '{NS}.{twin}', options => map('rewrite-all', 'true'))", "rewrite"
    )
    step("UPDATE {t} SET s = 'after compaction' WHERE id BETWEEN 5 AND 9")
    add_column_with_default(spark, "lake", NS, twin, "w", "int", "7")  # a schema change makes no snapshot
    step("UPDATE {t} SET w = 1 WHERE id < 5", "added")
    step("INSERT INTO {t} VALUES (300, 0, 'w', 3)")
    spark.sql(f"ALTER TABLE {t} ALTER COLUMN w TYPE bigint")
    step("UPDATE {t} SET w = 1099511627776 WHERE id = 1", "widened")
    step("DELETE FROM {t}", "truncate")  # every row: whole files removed
    step("INSERT INTO {t} SELECT id, 4, 'new', 0 FROM range(0, 50)")
    step("DELETE FROM {t} WHERE id < 10")
    step("UPDATE {t} SET v = 5 WHERE id BETWEEN 10 AND 19")
    assert len(set(snaps)) == len(snaps)

    columns, defaults, keys = ["id", "v", "s", "w"], {"w": 7}, ["id"]
    rewrite, added, widened, truncate = at["rewrite"], at["added"], at["widened"], at["truncate"]
    ranges = [(0, len(snaps) - 1), (rewrite - 1, rewrite), (rewrite - 1, rewrite + 1), (added - 2, widened)]
    ranges += [(truncate - 1, truncate), (truncate - 2, truncate + 2)]
    rng = random.Random(59)
    ranges += [tuple(sorted(rng.sample(range(len(snaps)), 2))) for _ in range(4)]  # type: ignore[misc]
    sizes = {}
    for i, j in ranges:
        sizes[(i, j)] = check_range(
            spark, twin, snaps[i], snaps[j], keys, columns, defaults, commits=(i, j) in ranges[1:6]
        )
    assert sizes[(rewrite - 1, rewrite)] == 0  # a rewrite changes no row
    assert sizes[(0, len(snaps) - 1)] > 0 and sizes[(truncate - 1, truncate)] > 100

    # --all: every commit against its parent, each change once per commit that made it.
    i, j = truncate - 2, truncate + 2
    every = read_changes_arrow(spark, "lake", f"{NS}.{twin}", snaps[i], snaps[j], all_changes=True).to_pylist()
    chain = _ancestry(spark, t, snaps[i], snaps[j])
    for parent, commit in zip(chain, chain[1:], strict=False):
        mine = [r for r in every if r["_commit_snapshot_id"] == commit]
        want = oracle(spark, t, parent, commit, keys, columns, defaults)
        got, _ = feed(_arrow(mine), keys, columns)
        assert got == want, f"--all, commit {commit}"
    assert len({r["_commit_snapshot_id"] for r in every}) == 4


def _arrow(rows: list[dict]):
    import pyarrow as pa

    return pa.Table.from_pylist(rows) if rows else pa.table({"_change_type": pa.array([], pa.string())})


def test_a_table_without_a_key_is_a_multiset_matched_by_row_id(spark):
    name = f"keyless_{uuid.uuid4().hex[:6]}"
    t = f"lake.{NS}.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{NS}")
    spark.sql(f"CREATE TABLE {t} (a int, b string) USING iceberg TBLPROPERTIES ({V3_MOR})")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'x'), (1, 'x'), (1, 'x'), (2, 'y'), (3, 'z')")
    since = _current(spark, name)
    spark.sql(f"INSERT INTO {t} VALUES (1, 'x'), (4, 'w')")
    spark.sql(f"UPDATE {t} SET b = 'Y' WHERE a = 2")
    spark.sql(f"DELETE FROM {t} WHERE a = 3")
    spark.sql(f"CALL lake.system.rewrite_data_files(table => '{NS}.{name}', options => map('rewrite-all', 'true'))")
    until = _current(spark, name)
    n = check_range(spark, name, since, until, [], ["a", "b"], {}, commits=True)
    got = read_changes_arrow(spark, "lake", f"{NS}.{name}", since, until).to_pylist()
    assert n == 4 and sorted(r["_change_type"] for r in got) == ["delete", "insert", "insert", "update"]


def test_an_expired_since_names_the_oldest_possible(spark, twin):
    t = f"lake.{NS}.{twin}"
    for i in range(3):
        spark.sql(f"INSERT INTO {t} VALUES ({i}, {i}, 'e')")
    first = int(spark.sql(f"SELECT snapshot_id FROM {t}.history ORDER BY made_current_at LIMIT 1").first()[0])
    current = _current(spark, twin)
    spark.sql(
        f"CALL lake.system.expire_snapshots(table => '{NS}.{twin}', "
        "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 2)"
    )
    oldest = [r[0] for r in spark.sql(f"SELECT snapshot_id FROM {t}.snapshots").collect()]
    with pytest.raises(ChangeFeedError, match=r"oldest --since still possible is (\d+)") as info:
        plan_range(spark, "lake", f"{NS}.{twin}", first)
    assert int(info.value.args[0].rsplit(" ", 1)[-1]) in oldest
    with pytest.raises(ChangeFeedError, match="has no snapshot 12345"):
        plan_range(spark, "lake", f"{NS}.{twin}", first, until=12345)
    assert read_changes(spark, "lake", f"{NS}.{twin}", current, current).count() == 0


def test_mirror_written_by_the_pipeline(stack, spark, pipeline_config_factory):
    """A mirror written by the pipeline (its deletion vectors, its compaction, a TRUNCATE) against the oracle;
    ``--to`` appends the changes with the checkpoint, and the CLI prints them as JSON."""
    from lakestream.engine.pipeline import Pipeline

    suffix = uuid.uuid4().hex[:6]
    topic = f"cf{suffix}.public.items"
    name = f"items_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": NS, "table": name}], name=f"cf{suffix}", engine={"overlap_commits": False}
    )
    pipeline = Pipeline(config, spark)
    live: set[int] = set()
    snaps: list[int] = []

    def batch(changes: list[tuple[int, int | None]] | None) -> None:
        records = []
        if changes is None:
            records.append((None, json.dumps({"before": None, "after": None, "op": "t"})))
            live.clear()
        for key, v in changes or []:
            if v is None:
                records.append((json.dumps({"id": key}), json.dumps({"before": {"id": key}, "after": None, "op": "d"})))
                live.discard(key)
            else:
                op = "u" if key in live else "c"
                records.append(
                    (json.dumps({"id": key}), json.dumps({"before": None, "after": {"id": key, "v": v}, "op": op}))
                )
                live.add(key)
        produce_records(stack.bootstrap_servers, topic, records)
        pipeline.run_batch()
        snaps.append(_current(spark, name))

    batch([(k, 0) for k in range(40)])
    batch([(k, 1) for k in range(10)] + [(10, None), (11, None), (40, 0)])
    batch([(10, 2), (12, None), (12, 2), (13, 2), (13, 3), (41, 0), (41, None)])
    spark.sql(f"CALL lake.system.rewrite_data_files(table => '{NS}.{name}', options => map('rewrite-all', 'true'))")
    snaps.append(_current(spark, name))
    batch([(k, 4) for k in (1, 5, 20)] + [(21, None)])
    batch(None)  # TRUNCATE
    batch([(k, 5) for k in range(5)])
    pipeline.close()

    columns, keys = ["id", "v"], ["id"]
    for i, j in [(0, len(snaps) - 1), (0, 2), (2, 3), (1, 4), (3, 5), (4, 6)]:
        check_range(spark, name, snaps[i], snaps[j], keys, columns, {}, commits=True)

    # --to: the changes and the checkpoint in one commit; the next run starts after it.
    target = f"feed_{suffix}"
    first = append_changes(spark, "lake", f"{NS}.{name}", f"{NS}.{target}", since=snaps[0], until=snaps[2])
    second = append_changes(spark, "lake", f"{NS}.{name}", f"{NS}.{target}")
    assert (first["until"], second["since"], second["until"]) == (snaps[2], snaps[2], snaps[-1])
    stored = spark.table(f"lake.{NS}.{target}").collect()
    assert len(stored) == first["rows"] + second["rows"] > 0
    assert {r["_commit_snapshot_id"] for r in stored} <= set(snaps)

    # The CLI: JSON on stdout only.
    yaml_path = write_pipeline_yaml(config, stack, Path(config.state_dir) / "pipeline.yaml")
    out = run_lakestream(
        "changes", str(yaml_path), f"{NS}.{name}", "--since", str(snaps[3]), "--format", "json", "--limit", "0"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)
    want = oracle(spark, f"lake.{NS}.{name}", snaps[3], snaps[-1], keys, columns, {})
    assert {((r["_before"] or r)["id"],): r["_change_type"] for r in rows} == {m: w[0] for m, w in want.items()}
