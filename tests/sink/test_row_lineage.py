"""Row lineage kept (issue 39), with Spark SQL as the oracle.

A mirror written by the pipeline and a twin table in the same catalog, changed by Spark's own DELETE and MERGE
(merge-on-read, format v3) with the same changes batch by batch, must show the same identities: after every
batch the pairs (mirror ``_row_id``, twin ``_row_id``) of each key form one bijection over the whole run (a fresh
id is a fresh id on both sides, a kept id is kept on both), and a key's ``_last_updated_sequence_number``
advances in the mirror exactly when it advances in the twin. Through inserts, updates, deletes, re-inserts (in a
later batch and within one batch), a process death before a commit and one after it, a compaction (the
pipeline's own on the mirror, Iceberg's ``rewrite_data_files`` on the twin), and for a keyless table.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from conftest import produce_records, simulate_death

from lakestream.engine.pipeline import Pipeline

NS = "lineage"
TWIN_PROPERTIES = (
    "'format-version'='3', 'write.delete.mode'='merge-on-read', "
    "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read'"
)


# Plain Spark SQL over the lineage columns: the rows inserted or updated since snapshot S, and what each was at S (NULL:
# new since). (`lakestream changes` gives the same with deletes and commits, reading only the files a range touched.)
# S's own sequence number is not in Spark's `snapshots` table; the largest one among S's rows stands for it (a row
# live now that was last changed at or before S is live at S with that number). The coalesce keeps Iceberg's
# aggregate push-down away: it cannot bind a metadata column (1.12.0: "Cannot find field
# '_last_updated_sequence_number' in struct").
CHANGED_SINCE = """
WITH s AS (SELECT coalesce(max(coalesce(_last_updated_sequence_number, -1)), -1) AS seq
           FROM {table} VERSION AS OF {snapshot})
SELECT now.*, then.v AS v_then
FROM (SELECT *, _row_id, _last_updated_sequence_number FROM {table}
      WHERE _last_updated_sequence_number > (SELECT seq FROM s)) now
LEFT JOIN (SELECT v, _row_id FROM {table} VERSION AS OF {snapshot}) then ON now._row_id = then._row_id
"""

DELETED_SINCE = "SELECT id FROM {table} VERSION AS OF {snapshot} WHERE _row_id NOT IN (SELECT _row_id FROM {table})"


class ProcessDeath(BaseException):
    """The process dies (nothing in it catches this)."""


def _lineage(spark, table: str, key: str = "id") -> dict[Any, tuple[int, int, Any]]:
    rows = spark.sql(f"SELECT {key}, v, _row_id, _last_updated_sequence_number FROM {table}").collect()
    assert len(rows) == len({r[0] for r in rows}), f"{table}: a key has two rows"
    ids = [r["_row_id"] for r in rows]
    assert None not in ids and len(ids) == len(set(ids)), f"{table}: row ids missing or not unique: {sorted(ids)}"
    return {r[0]: (r["_row_id"], r["_last_updated_sequence_number"], r["v"]) for r in rows}


def _compare(history: list[tuple[str, dict, dict]]) -> None:
    """The mirror's and the twin's observations after each step: same rows, one bijection of row ids, and
    the sequence number of a key advancing at the same steps."""
    pairs: dict[int, int] = {}
    back: dict[int, int] = {}
    previous: tuple[dict, dict] | None = None
    for step, mirror, twin in history:
        assert {k: v[2] for k, v in mirror.items()} == {k: v[2] for k, v in twin.items()}, step
        for key in mirror:
            m, t = mirror[key][0], twin[key][0]
            assert pairs.setdefault(m, t) == t and back.setdefault(t, m) == m, (
                f"{step}: key {key} has mirror row id {m} and twin row id {t}, but {m} was paired with "
                f"{pairs.get(m)} and {t} with {back.get(t)} before: the mirror gave it another identity than Spark"
            )
        if previous is not None:
            for key in mirror.keys() & previous[0].keys():
                advanced_m = mirror[key][1] != previous[0][key][1]
                advanced_t = twin[key][1] != previous[1][key][1]
                assert advanced_m == advanced_t, (
                    f"{step}: key {key}: sequence number advanced in the mirror: "
                    f"{advanced_m}, in the twin: {advanced_t}"
                )
        latest = max(v[1] for v in mirror.values())
        changed = [k for k in mirror if previous is None or k not in previous[0] or mirror[k][1] != previous[0][k][1]]
        assert all(mirror[k][1] == latest for k in changed), step  # a change reads as the commit that wrote it
        previous = (mirror, twin)


class Twin:
    """A table changed by Spark SQL with a batch's changes: the keys deleted in it are deleted, then the last
    image of every key not deleted last is merged (an update keeps its row, a new key is inserted)."""

    def __init__(self, spark, name: str):
        self.spark, self.name = spark, name
        spark.sql(f"CREATE TABLE {name} (id bigint, v bigint) USING iceberg TBLPROPERTIES ({TWIN_PROPERTIES})")

    def apply(self, batch: list[tuple[int, int | None]]) -> None:
        deleted = sorted({k for k, v in batch if v is None})
        final = {k: v for k, v in batch}
        if deleted:
            self.spark.sql(f"DELETE FROM {self.name} WHERE id IN ({', '.join(map(str, deleted))})")
        images = [(k, v) for k, v in final.items() if v is not None]
        if images:
            values = ", ".join(f"({k}, {v})" for k, v in images)
            self.spark.sql(
                f"MERGE INTO {self.name} t USING (SELECT * FROM VALUES {values} AS s(id, v)) s "
                "ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"
            )


@pytest.fixture
def keyed(stack, spark, pipeline_config_factory):
    suffix = uuid.uuid4().hex[:6]
    topic = f"ln{suffix}.public.items"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": NS, "table": f"items_{suffix}"}],
        name=f"ln{suffix}",
        engine={"overlap_commits": False},
        maintenance={
            "mode": "inline",
            "interval_s": 3600,
            "start_delay_s": 0,
            "policies": [
                {
                    "tables": ".*",
                    "compaction": {
                        "max_files_per_partition": 2,
                        "quiet_time_s": 600,
                        "target_file_size_bytes": 64 * 1024 * 1024,
                    },
                }
            ],
        },
    )
    model: set[int] = set()

    def send(batch: list[tuple[int, int | None]]) -> None:
        records = []
        for key, v in batch:
            if v is None:
                records.append((json.dumps({"id": key}), json.dumps({"before": {"id": key}, "after": None, "op": "d"})))
                model.discard(key)
            else:
                records.append(
                    (
                        json.dumps({"id": key}),
                        json.dumps({"before": None, "after": {"id": key, "v": v}, "op": "u" if key in model else "c"}),
                    )
                )
                model.add(key)
        produce_records(stack.bootstrap_servers, topic, records)

    return config, f"lake.{NS}.items_{suffix}", send, Twin(spark, f"lake.{NS}.twin_{suffix}")


def test_updates_keep_row_ids_as_spark_merge_does(spark, keyed, monkeypatch):
    from lakestream.engine import commits as commits_module
    from lakestream.maintenance.runner import plan_table, write_compaction
    from lakestream.sink.catalog import sink as files_module

    config, mirror, send, twin = keyed
    history: list[tuple[str, dict, dict]] = []
    pipeline = Pipeline(config, spark)

    def batch(step: str, changes: list[tuple[int, int | None]]) -> None:
        send(changes)
        pipeline.run_batch()
        twin.apply(changes)
        history.append((step, _lineage(spark, mirror), _lineage(spark, twin.name)))

    batch("inserts", [(k, 0) for k in range(30)])
    batch("updates, deletes, inserts", [(k, 1) for k in range(10)] + [(10, None), (11, None), (30, 0), (31, 0)])
    batch(
        "re-insert, update twice, delete and re-insert in one batch",
        [(10, 2), (30, 2), (1, 2), (12, None), (12, 2), (13, 2), (13, 3), (14, 2)],
    )
    since = spark.sql(f"SELECT snapshot_id FROM {mirror}.snapshots ORDER BY committed_at DESC LIMIT 1").first()[0]
    touched = {1, 2, 15, 30, 3, 17, 4, 18, 40, 5, 20}  # written by the steps below and still live

    # A death after the files were written (and rewritten with the kept ids), before the Iceberg commit.
    real_commit = files_module.commit_files
    monkeypatch.setattr(
        files_module, "commit_files", lambda *a, **k: (_ for _ in ()).throw(ProcessDeath("died before the commit"))
    )
    send([(k, 4) for k in (1, 2, 15, 30)] + [(16, None)])
    with pytest.raises(ProcessDeath):
        pipeline.run_batch()
    simulate_death(pipeline)
    monkeypatch.setattr(files_module, "commit_files", real_commit)
    pipeline = Pipeline(config, spark)
    pipeline.run_batch()
    twin.apply([(k, 4) for k in (1, 2, 15, 30)] + [(16, None)])
    history.append(("after a death before the commit", _lineage(spark, mirror), _lineage(spark, twin.name)))

    # A death after the commit landed, before the key index was saved: the restart refreshes it by diff.
    real_write = commits_module.write_table

    def landed_then_died(*args, **kwargs):
        real_write(*args, **kwargs)
        raise ProcessDeath("died after the commit")

    monkeypatch.setattr(commits_module, "write_table", landed_then_died)
    send([(k, 5) for k in (2, 3, 17)])
    with pytest.raises(ProcessDeath):
        pipeline.run_batch()
    simulate_death(pipeline)
    monkeypatch.setattr(commits_module, "write_table", real_write)
    twin.apply([(k, 5) for k in (2, 3, 17)])
    history.append(("after a death after the commit", _lineage(spark, mirror), _lineage(spark, twin.name)))
    pipeline = Pipeline(config, spark)
    batch("after the restart", [(k, 6) for k in (3, 4, 18)] + [(19, None), (40, 6)])

    # Compaction: the pipeline's own on the mirror, Iceberg's rewrite_data_files on the twin; nothing changes.
    name = mirror.removeprefix("lake.")
    plan = plan_table(spark, config, name)
    prepared = write_compaction(
        spark,
        config.catalog.name,
        name,
        plan.hot_skipped + plan.compact,
        config.maintenance.policy_for(name),
        pipeline.compacted_here()[name],
    )
    assert prepared is not None
    [result] = pipeline.commit_compactions([prepared])
    assert result.status == "ok", result.describe()
    spark.sql(
        f"CALL lake.system.rewrite_data_files(table => '{twin.name.removeprefix('lake.')}', "
        "options => map('rewrite-all', 'true'))"
    )
    history.append(("compacted", _lineage(spark, mirror), _lineage(spark, twin.name)))
    assert history[-1][1] == history[-2][1] and history[-1][2] == history[-2][2]  # both moved rows, kept lineage
    assert spark.sql(f"SELECT count(*) FROM {mirror}.data_files").collect()[0][0] == 1
    # Updates of rows that now live in a file holding their ids explicitly.
    batch("updates after the compaction", [(k, 7) for k in (1, 5, 20, 40)] + [(21, None)])
    pipeline.close()
    _compare(history)

    # The lineage columns in plain Spark SQL: the rows changed since a snapshot, each with its row at it.
    changed = spark.sql(CHANGED_SINCE.format(table=mirror, snapshot=since)).collect()
    assert {r["id"] for r in changed} == touched  # the compaction changed nothing
    final = history[-1][1]
    at_since = history[2][1]
    for r in changed:
        assert r["_row_id"] == final[r["id"]][0]
        assert r["v_then"] == (at_since[r["id"]][2] if r["id"] in at_since else None)
    deleted = spark.sql(DELETED_SINCE.format(table=mirror, snapshot=since)).collect()
    assert {r["id"] for r in deleted} == {16, 19, 21}

    # DuckDB reads the same lineage (its iceberg_scan exposes both fields); pyiceberg reads the rows (it does not
    # expose the fields), neither sees the lineage columns as data.
    from lakestream.identifiers import TableName
    from lakestream.read.query import duckdb_connection, load_iceberg_table, read_table

    metadata = load_iceberg_table(config.catalog, TableName.parse(name, "lake")).metadata_location
    with duckdb_connection() as con:
        rows = con.execute(
            "SELECT id, _row_id, _last_updated_sequence_number FROM iceberg_scan(?)", [metadata]
        ).fetchall()
    assert {r[0]: (r[1], r[2]) for r in rows} == {k: v[:2] for k, v in final.items()}
    assert read_table(config, name, "pyiceberg").column_names == ["id", "v"]


def test_keyless_update_keeps_the_id_of_the_row_it_replaces(stack, spark, pipeline_config_factory):
    """Three equal rows; an update of one of them: that row keeps its id, the other two are untouched. Spark
    can only name one of several equal rows by its id, so the twin's update does (the mirror picks one itself:
    the comparison is of which ids survive and which advanced)."""
    suffix = uuid.uuid4().hex[:6]
    topic, mirror = f"lk{suffix}.public.log", f"lake.{NS}.log_{suffix}"
    config = pipeline_config_factory(
        [{"topics": [topic], "namespace": NS, "table": f"log_{suffix}"}],
        name=f"lk{suffix}",
        engine={"overlap_commits": False},
    )
    lsn = iter(range(100, 100_000))

    def event(op: str, before: dict | None, after: dict | None) -> tuple[None, str]:
        return None, json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": next(lsn)}})

    pipeline = Pipeline(config, spark)
    try:
        produce_records(
            stack.bootstrap_servers, topic, [event("c", None, {"msg": m, "n": 1}) for m in ("a", "a", "a", "b")]
        )
        pipeline.run_batch()
        before = {
            r[0]: (r[1], r[2], r[3])
            for r in spark.sql(f"SELECT _row_id, msg, n, _last_updated_sequence_number FROM {mirror}").collect()
        }
        produce_records(stack.bootstrap_servers, topic, [event("u", {"msg": "a", "n": 1}, {"msg": "a", "n": 2})])
        pipeline.run_batch()
        after = {
            r[0]: (r[1], r[2], r[3])
            for r in spark.sql(f"SELECT _row_id, msg, n, _last_updated_sequence_number FROM {mirror}").collect()
        }
    finally:
        pipeline.close()
    twin = f"lake.{NS}.log_twin_{suffix}"
    spark.sql(f"CREATE TABLE {twin} (msg string, n bigint) USING iceberg TBLPROPERTIES ({TWIN_PROPERTIES})")
    spark.sql(f"INSERT INTO {twin} VALUES ('a', 1), ('a', 1), ('a', 1), ('b', 1)")
    twin_before = {
        r[0]: (r[1], r[2], r[3])
        for r in spark.sql(f"SELECT _row_id, msg, n, _last_updated_sequence_number FROM {twin}").collect()
    }
    spark.sql(f"UPDATE {twin} SET n = 2 WHERE _row_id = (SELECT max(_row_id) FROM {twin} WHERE msg = 'a')")
    twin_after = {
        r[0]: (r[1], r[2], r[3])
        for r in spark.sql(f"SELECT _row_id, msg, n, _last_updated_sequence_number FROM {twin}").collect()
    }
    for old, new in ((before, after), (twin_before, twin_after)):
        assert set(new) == set(old)  # every row kept its id, the updated one included
        changed = [i for i in new if new[i] != old[i]]
        assert len(changed) == 1 and new[changed[0]][:2] == ("a", 2)
        assert new[changed[0]][2] > old[changed[0]][2]  # its sequence number advanced; the others' did not


def test_a_file_rewritten_with_lineage_keeps_its_columns_exactly(tmp_path):
    """The in-place rewrite (`write_lineage`) changes only the two lineage columns: every other column keeps its
    Parquet type, field id and values, nested and required ones included."""
    import datetime as dt
    import decimal
    import uuid as uuid_

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakestream.sink.commit.lineage import LAST_UPDATED, ROW_ID, read_lineage, write_lineage
    from lakestream.sink.types import arrow_schema
    from lakestream.sink.write.files import write_data_file

    schema = arrow_schema(
        {
            "fields": [
                {"id": 1, "name": "id", "type": "long", "required": True},
                {"id": 2, "name": "amount", "type": "decimal(10,2)"},
                {"id": 3, "name": "at", "type": "timestamptz"},
                {"id": 4, "name": "local", "type": "timestamp"},
                {"id": 5, "name": "day", "type": "date"},
                {"id": 6, "name": "u", "type": "uuid"},
                {
                    "id": 7,
                    "name": "tags",
                    "type": {"type": "list", "element-id": 8, "element": "string", "element-required": False},
                },
                {
                    "id": 9,
                    "name": "attrs",
                    "type": {
                        "type": "map",
                        "key-id": 10,
                        "key": "string",
                        "value-id": 11,
                        "value": "int",
                        "value-required": False,
                    },
                },
                {
                    "id": 12,
                    "name": "s",
                    "type": {"type": "struct", "fields": [{"id": 13, "name": "x", "type": "double"}]},
                },
                {"id": 14, "name": "t", "type": "time"},
                {"id": 15, "name": "b", "type": "fixed[3]"},
            ]
        }
    )
    rows = pa.Table.from_pylist(
        [
            {
                "id": i,
                "amount": decimal.Decimal("1.25") * i,
                "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
                "local": dt.datetime(2026, 1, 2),
                "day": dt.date(2026, 1, 3),
                "u": uuid_.UUID(int=i).bytes,
                "tags": ["a", None],
                "attrs": [("k", i)],
                "s": {"x": 0.5},
                "t": dt.time(1, 2, 3),
                "b": b"abc",
            }
            for i in range(3)
        ],
        schema=schema,
    )
    written = write_data_file(rows, f"file://{tmp_path}", schema, "t")
    path = written["path"]
    before = pq.ParquetFile(str(tmp_path / path.rsplit("/", 1)[1]))
    write_lineage(path, np.array([7, -1, 9], np.int64))
    after = pq.ParquetFile(str(tmp_path / path.rsplit("/", 1)[1]))
    assert after.schema_arrow.names == before.schema_arrow.names + [ROW_ID, LAST_UPDATED]
    n = len(before.schema_arrow)

    # The Parquet schema (types, logical types, field ids, repetition) is the old one with two more columns.
    def described(parquet: pq.ParquetFile) -> str:
        return str(parquet.schema).split("\n", 1)[1]  # (without the object's address)

    assert described(after).startswith(described(before).rstrip().removesuffix("}"))
    table = after.read()
    assert table.select(range(n)).equals(before.read())
    ids, seqs = read_lineage(table)
    assert ids.tolist() == [7, -1, 9] and seqs.tolist() == [-1, -1, -1]
    assert [f.metadata[b"PARQUET:field_id"] for f in after.schema_arrow][n:] == [b"2147483540", b"2147483539"]


def test_the_explicit_id_cache_is_bounded_and_reads_a_file_once(tmp_path, monkeypatch):
    import numpy as np

    from lakestream.sink.commit import lineage

    reads: list[str] = []
    monkeypatch.setattr(lineage, "_read_row_ids", lambda p: reads.append(p) or np.arange(3, dtype=np.int64))
    ids = lineage.RowIds(max_ids=5, max_files=3)
    ids.remember("written", np.array([1, -1], np.int64))
    assert ids.explicit(["written", "old"])["old"].tolist() == [0, 1, 2] and reads == ["old"]
    assert ids.explicit(["old"])["old"].tolist() == [0, 1, 2] and reads == ["old"]  # kept
    ids.remember("more", np.arange(3, dtype=np.int64))  # 2 + 3 + 3 ids > 5: the least recently used go
    assert ids._held <= 5 and "written" not in ids._explicit
    for name in ("a", "b", "c"):
        ids.remember(name, None)
    assert len(ids._explicit) == 3
