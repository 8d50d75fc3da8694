"""The fast sink path end to end on the real JDBC catalog: tables created through LakestreamSink,
Parquet data files written with pyarrow (lakestream.sink.write.files), committed with deletion vectors
and snapshot properties in one snapshot; Spark, pyiceberg and DuckDB read the same rows."""

from __future__ import annotations

import datetime as dt
import decimal
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from py4j.protocol import Py4JJavaError

from lakestream.sink.catalog.sink import commit_files, create_table, table_info
from lakestream.sink.types import arrow_schema, spark_ddl
from lakestream.sink.write.files import write_data_file
from lakestream.sink.write.partitioning import partition_values
from lakestream.storage import canonical_location

CATALOG = "lake"

COLUMNS = [
    {"name": "id", "type": "bigint", "required": True},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": "decimal(10,2)"},
    {"name": "ts", "type": "timestamp"},
    {"name": "region", "type": "string"},
    {"name": "tags", "type": "array<string>"},
    {"name": "attrs", "type": "struct<`a`:int,`b`:string>"},
]
UTC = dt.UTC


def _uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def ns() -> str:
    return f"files_{_uid()}"


def _rows(ids, base_ts=dt.datetime(2024, 3, 1, 12, tzinfo=UTC)) -> list[dict]:
    names = ["alpha", "béta", "γάμμα", "d", None, "ze", "日本語", "omega"]
    regions = ["eu", "us", None, "ap"]
    return [
        {
            "id": i,
            "name": names[i % len(names)],
            "amount": decimal.Decimal(i * 37 % 10000 - 2500).scaleb(-2),
            "ts": None if i % 11 == 5 else base_ts + dt.timedelta(hours=i % 1000 * 7 - 500),
            "region": regions[i % len(regions)],
            "tags": [f"t{i}"] if i % 2 else None,
            "attrs": {"a": i % 1000, "b": str(i)},
        }
        for i in ids
    ]


def _arrow(info: dict, rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=arrow_schema(info["schema"]))


def _write(info: dict, rows: list[dict], prefix: str = "t") -> tuple[dict, pa.Table]:
    """One data file per partition; returns the commit's data_files entries (in order) and the table."""
    table = _arrow(info, rows)
    files = []
    for values, indices in partition_values(info["spec"], info["schema"], table):
        written = write_data_file(
            table.take(pa.array(indices)), info["data_location"], arrow_schema(info["schema"]), prefix
        )
        files.append({**written, "spec_id": info["spec"]["spec-id"], "partition": values, "rows": indices})
    return files, table


def _request(files: list[dict], **extra) -> dict:
    return {"data_files": [{k: v for k, v in f.items() if k != "rows"} for f in files], **extra}


def _ids(spark, table: str) -> list[int]:
    return [r.id for r in spark.sql(f"SELECT id FROM {table} ORDER BY id").collect()]


def _new_table(spark, ns: str, name: str, **request) -> tuple[str, dict]:
    info = create_table(
        spark,
        CATALOG,
        ns,
        name,
        {"columns": COLUMNS, "identifier_fields": ["id"], "properties": {"format-version": "3"}, **request},
    )
    return f"{CATALOG}.{ns}.{name}", info


def _java_class(error: Exception) -> str:
    """The Java class of an error from py4j: a Py4JJavaError, or a PySpark CapturedException (PySpark
    converts e.g. java.lang.IllegalArgumentException into its own class, keeping the original)."""
    java = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    return java.getClass().getName()


def test_create_table_is_one_fast_commit_with_exact_metadata(spark, ns):
    assert table_info(spark, CATALOG, ns, "created") == {"exists": False}
    started = time.perf_counter()
    name, info = _new_table(
        spark,
        ns,
        "created",
        sort_by=["id DESC", "region"],
        properties={"format-version": "3", "write.delete.mode": "merge-on-read"},
    )
    elapsed = time.perf_counter() - started
    print(f"create_table: {elapsed * 1000:.0f} ms")
    assert info["exists"] and info["format_version"] == 3 and info["snapshot_id"] is None
    assert info["identifier_fields"] == ["id"]
    assert info["data_location"] == info["location"] + "/data"
    assert info["properties"]["write.delete.mode"] == "merge-on-read"
    fields = {f["name"]: f for f in info["schema"]["fields"]}
    assert fields["id"]["required"] and not fields["name"]["required"]
    assert [spark_ddl(fields[c["name"]]["type"]) for c in COLUMNS] == [
        "bigint",
        "string",
        "decimal(10,2)",
        "timestamp",
        "string",
        "array<string>",
        "struct<`a`:int,`b`:string>",
    ]
    types = {f.name: f.dataType.simpleString() for f in spark.table(name).schema.fields}
    assert types["ts"] == "timestamp" and types["attrs"] == "struct<a:int,b:string>"
    # a second call is a no-op returning the same table
    again = create_table(spark, CATALOG, ns, "created", {"columns": [{"name": "x", "type": "int"}]})
    assert again["location"] == info["location"] and len(again["schema"]["fields"]) == len(COLUMNS)
    order = spark.sql(f"SELECT * FROM {name}.metadata_log_entries").count()
    assert order == 1  # one catalog commit: no ALTERs after the CREATE


def test_commit_files_then_deletes_merge_into_one_dv(spark, stack, ns):
    name, info = _new_table(spark, ns, "dv")
    files, _ = _write(info, _rows(range(10)))
    assert len(files) == 1 and files[0]["path"].startswith(canonical_location(info["data_location"]) + "/")
    first = commit_files(
        spark, CATALOG, ns, "dv", _request(files, base_snapshot_id=None, properties={"lakestream.offsets": "t:0:10"})
    )
    assert first["data_files"] == 1 and first["delete_files"] == 0 and first["parent_snapshot_id"] is None
    assert _ids(spark, name) == list(range(10))
    row = spark.sql(f"SELECT * FROM {name} WHERE id = 7").collect()[0]
    assert row.name == "omega" and row.amount == decimal.Decimal("-22.41") and row.attrs.b == "7"
    assert row.ts == dt.datetime(2024, 3, 1, 12) + dt.timedelta(hours=49 - 500)  # session zone UTC

    path = files[0]["path"]
    stored = spark.sql(f"SELECT file_path FROM {name}.files").collect()
    assert [r.file_path for r in stored] == [path]

    second = commit_files(
        spark,
        CATALOG,
        ns,
        "dv",
        {
            "base_snapshot_id": first["snapshot_id"],
            "deletes": [{"data_file": path, "positions": [0, 5, 9]}],
            "properties": {"lakestream.offsets": "t:0:12"},
        },
    )
    assert (second["delete_files"], second["removed_delete_files"]) == (1, 0)
    assert _ids(spark, name) == [1, 2, 3, 4, 6, 7, 8]

    third = commit_files(
        spark,
        CATALOG,
        ns,
        "dv",
        {
            "base_snapshot_id": second["snapshot_id"],
            "deletes": [{"data_file": path, "positions": [1, 5]}],
            "properties": {"lakestream.offsets": "t:0:13"},
        },
    )
    assert (third["delete_files"], third["removed_delete_files"]) == (1, 1)
    assert third["parent_snapshot_id"] == second["snapshot_id"]
    assert _ids(spark, name) == [2, 3, 4, 6, 7, 8]
    live = spark.sql(
        f"SELECT content, file_format, record_count, referenced_data_file FROM {name}.delete_files"
    ).collect()
    assert [(r.content, r.file_format, r.record_count, r.referenced_data_file) for r in live] == [
        (1, "PUFFIN", 4, path)
    ]
    assert spark.sql(f"SELECT count(*) FROM {name}.all_delete_files").collect()[0][0] == 2

    # a commit without base_snapshot_id still merges (validating from the snapshot it merged at)
    fourth = commit_files(spark, CATALOG, ns, "dv", {"deletes": [{"data_file": path, "positions": [2]}]})
    assert (fourth["delete_files"], fourth["removed_delete_files"]) == (1, 1)
    assert _ids(spark, name) == [3, 4, 6, 7, 8]

    summaries = spark.sql(
        f"SELECT snapshot_id, operation, summary FROM {name}.snapshots ORDER BY committed_at"
    ).collect()
    assert [r.snapshot_id for r in summaries] == [
        first["snapshot_id"],
        second["snapshot_id"],
        third["snapshot_id"],
        fourth["snapshot_id"],
    ]
    assert [r.summary.get("lakestream.offsets") for r in summaries] == ["t:0:10", "t:0:12", "t:0:13", None]
    assert summaries[1].operation == "delete" and summaries[0].operation == "append"
    assert table_info(spark, CATALOG, ns, "dv")["snapshot_id"] == fourth["snapshot_id"]

    _assert_other_readers(stack, ns, "dv", [3, 4, 6, 7, 8])


def _assert_other_readers(stack, ns: str, table: str, ids: list[int]) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        CATALOG,
        uri=f"postgresql+psycopg2://{stack.pg_user}:{stack.pg_password}@{stack.pg_host}:"
        f"{stack.pg_port}/{stack.catalog_db}",
        warehouse=stack.warehouse,
    )
    tbl = catalog.load_table(f"{ns}.{table}")
    assert sorted(tbl.scan().to_arrow().column("id").to_pylist()) == ids

    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false"})
    for pkg, ext in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        found = sorted(Path(pkg.__file__).parent.glob(f"extensions/*/{ext}.duckdb_extension"))
        con.execute(f"LOAD '{found[-1]}'")
    metadata = tbl.metadata_location.removeprefix("file:").replace("///", "/")
    got = [r[0] for r in con.execute(f"SELECT id FROM iceberg_scan('{metadata}') ORDER BY id").fetchall()]
    con.close()
    assert got == ids


def test_deletes_on_a_file_added_in_the_same_commit(spark, ns):
    name, info = _new_table(spark, ns, "same")
    old, _ = _write(info, _rows(range(5)))
    commit_files(spark, CATALOG, ns, "same", _request(old))
    new, _ = _write(info, _rows(range(5, 12)))
    result = commit_files(
        spark,
        CATALOG,
        ns,
        "same",
        _request(
            new,
            base_snapshot_id=table_info(spark, CATALOG, ns, "same")["snapshot_id"],
            deletes=[
                {"data_file": new[0]["path"], "positions": [0, 6]},
                {"data_file": old[0]["path"], "positions": [4]},
                {"data_file": new[0]["path"], "positions": [3]},
            ],
            properties={"k": "v"},
        ),
    )
    assert (result["data_files"], result["delete_files"], result["removed_delete_files"]) == (1, 2, 0)
    assert _ids(spark, name) == [0, 1, 2, 3, 6, 7, 9, 10]
    assert spark.sql(f"SELECT count(*) FROM {name}.snapshots").collect()[0][0] == 2
    counts = {
        r.referenced_data_file: r.record_count
        for r in spark.sql(f"SELECT referenced_data_file, record_count FROM {name}.delete_files").collect()
    }
    assert counts == {new[0]["path"]: 3, old[0]["path"]: 1}


def test_partition_values_match_spark(spark, ns):
    partition_by = ["days(ts)", "bucket(4, id)", "truncate(2, name)", "region"]
    name, info = _new_table(spark, ns, "parts", partition_by=partition_by)
    assert [f["transform"] for f in info["spec"]["fields"]] == ["day", "bucket[4]", "truncate[2]", "identity"]
    ids = list(range(-40, 40)) + [2**40, -(2**35), 10**15]
    rows = _rows(ids)
    files, _ = _write(info, rows)
    commit_files(spark, CATALOG, ns, "parts", _request(files))
    assert _ids(spark, name) == sorted(ids)

    # the twin: the same rows written by Spark itself
    twin = f"{CATALOG}.{ns}.parts_twin"
    spark.sql(
        f"CREATE TABLE {twin} (id bigint NOT NULL, name string, amount decimal(10,2), ts timestamp, "
        f"region string, tags array<string>, attrs struct<a:int,b:string>) USING iceberg "
        f"PARTITIONED BY ({', '.join(partition_by)}) TBLPROPERTIES ('format-version'='3')"
    )
    spark.createDataFrame(rows, schema=spark.table(twin).schema).writeTo(twin).append()

    def partitions(table: str) -> dict:
        got = spark.sql(f"SELECT partition, record_count FROM {table}.files").collect()
        return {tuple(r.partition.asDict().items()): r.record_count for r in got}

    ours, theirs = partitions(name), partitions(twin)
    assert len(ours) > 20
    # our paths have the form of Spark's own (the table location as the catalog stores it + /data/)
    twin_info = table_info(spark, CATALOG, ns, "parts_twin")
    spark_paths = [r.file_path for r in spark.sql(f"SELECT file_path FROM {twin}.files").collect()]
    assert all(p.startswith(canonical_location(twin_info["data_location"]) + "/") for p in spark_paths)
    assert all(f["path"].startswith(canonical_location(info["data_location"]) + "/") for f in files)
    print("path forms:", info["data_location"], files[0]["path"], spark_paths[0])
    assert ours == theirs

    # and row by row against Spark's own transform functions
    checked = spark.sql(f"SELECT id, _partition FROM {name}").collect()
    by_id = {r.id: r._partition.asDict() for r in checked}
    expected = spark.sql(
        f"SELECT id, {CATALOG}.system.days(ts) AS d, {CATALOG}.system.bucket(4, id) AS b, "
        f"{CATALOG}.system.truncate(2, name) AS n, region FROM {twin}"
    ).collect()
    for r in expected:
        p = by_id[r.id]
        assert (p["ts_day"], p["id_bucket"], p["name_trunc"], p["region"]) == (r.d, r.b, r.n, r.region), r.id


def test_partition_values_of_more_transforms_match_spark(spark, ns):
    cols = [
        {"name": "id", "type": "bigint", "required": True},
        {"name": "i", "type": "int"},
        {"name": "s", "type": "string"},
        {"name": "d", "type": "date"},
        {"name": "ts", "type": "timestamp_ntz"},
        {"name": "tz", "type": "timestamp"},
        {"name": "amount", "type": "decimal(9,3)"},
        {"name": "flag", "type": "boolean"},
    ]
    partition_by = [
        "bucket(7, s)",
        "bucket(5, d)",
        "bucket(3, amount)",
        "truncate(10, i)",
        "truncate(1000, amount)",
        "months(d)",
        "years(ts)",
        "hours(tz)",
        "identity(d)",
        "flag",
        "bucket(6, tz)",
        "identity(amount)",
    ]
    name = "parts2"
    info = create_table(
        spark,
        CATALOG,
        ns,
        name,
        {
            "columns": cols,
            "identifier_fields": ["id"],
            "partition_by": partition_by,
            "properties": {"format-version": "3"},
        },
    )
    base = dt.datetime(1969, 12, 30, 22, 30)
    rows = [
        {
            "id": k,
            "i": None if k % 9 == 0 else k * 7 - 60,
            "s": None if k % 8 == 0 else f"s{k % 5}é",
            "d": dt.date(1969, 11, 15) + dt.timedelta(days=k * 13),
            "ts": base + dt.timedelta(hours=k * 5),
            "tz": (base + dt.timedelta(minutes=k * 47)).replace(tzinfo=UTC),
            "amount": None if k % 10 == 3 else decimal.Decimal(k * 1234 - 20000).scaleb(-3),
            "flag": k % 3 == 0,
        }
        for k in range(40)
    ]
    files, _ = _write(info, rows)
    commit_files(spark, CATALOG, ns, name, _request(files))
    twin = f"{CATALOG}.{ns}.{name}_twin"
    spark.sql(
        f"CREATE TABLE {twin} (id bigint NOT NULL, i int, s string, d date, ts timestamp_ntz, tz timestamp, "
        f"amount decimal(9,3), flag boolean) USING iceberg PARTITIONED BY ({', '.join(partition_by)}) "
        f"TBLPROPERTIES ('format-version'='3')"
    )
    spark.createDataFrame(rows, schema=spark.table(twin).schema).writeTo(twin).append()

    def partitions(table: str) -> dict:
        got = spark.sql(f"SELECT partition, record_count FROM {table}.files").collect()
        return {tuple(r.partition.asDict().items()): r.record_count for r in got}

    ours, theirs = partitions(f"{CATALOG}.{ns}.{name}"), partitions(twin)
    assert ours == theirs
    assert spark.sql(f"SELECT count(*) FROM {CATALOG}.{ns}.{name}").collect()[0][0] == 40


def test_validation_exception_when_a_referenced_file_was_rewritten(spark, ns):
    name, info = _new_table(spark, ns, "rewritten")
    first, _ = _write(info, _rows(range(4)))
    commit_files(spark, CATALOG, ns, "rewritten", _request(first))
    second, _ = _write(info, _rows(range(4, 8)))
    committed = commit_files(spark, CATALOG, ns, "rewritten", _request(second))
    base = committed["snapshot_id"]
    spark.sql(
        f"CALL {CATALOG}.system.rewrite_data_files(table => '{ns}.rewritten', options => map('rewrite-all', 'true'))"
    ).collect()
    assert spark.sql(f"SELECT count(*) FROM {name}.files").collect()[0][0] == 1
    with pytest.raises(Py4JJavaError) as raised:
        commit_files(
            spark,
            CATALOG,
            ns,
            "rewritten",
            {"base_snapshot_id": base, "deletes": [{"data_file": first[0]["path"], "positions": [1]}]},
        )
    assert _java_class(raised.value) == "org.apache.iceberg.exceptions.ValidationException"
    assert _ids(spark, name) == list(range(8))


def test_validation_exception_on_a_concurrent_dv_for_the_same_file(spark, ns):
    name, info = _new_table(spark, ns, "concurrent")
    files, _ = _write(info, _rows(range(6)))
    base = commit_files(spark, CATALOG, ns, "concurrent", _request(files))["snapshot_id"]
    path = files[0]["path"]
    commit_files(
        spark, CATALOG, ns, "concurrent", {"base_snapshot_id": base, "deletes": [{"data_file": path, "positions": [0]}]}
    )
    with pytest.raises(Py4JJavaError) as raised:  # computed against `base`: the DV added since conflicts
        commit_files(
            spark,
            CATALOG,
            ns,
            "concurrent",
            {"base_snapshot_id": base, "deletes": [{"data_file": path, "positions": [1]}]},
        )
    assert _java_class(raised.value) == "org.apache.iceberg.exceptions.ValidationException"
    assert _ids(spark, name) == [1, 2, 3, 4, 5]


def test_v2_table_appends_but_rejects_deletes(spark, ns):
    name, info = _new_table(spark, ns, "v2", properties={"format-version": "2"})
    assert info["format_version"] == 2
    files, _ = _write(info, _rows(range(3)))
    commit_files(spark, CATALOG, ns, "v2", _request(files))
    assert _ids(spark, name) == [0, 1, 2]
    with pytest.raises(Exception) as raised:
        commit_files(spark, CATALOG, ns, "v2", {"deletes": [{"data_file": files[0]["path"], "positions": [0]}]})
    assert _java_class(raised.value) == "java.lang.IllegalArgumentException"
    assert "format v3" in str(raised.value)


def test_upgraded_v2_position_deletes_are_merged_into_the_dv(spark, ns):
    name = f"{CATALOG}.{ns}.upgraded"
    spark.sql(
        f"CREATE TABLE {name} (id bigint NOT NULL, v string) USING iceberg TBLPROPERTIES "
        f"('format-version'='2', 'write.delete.mode'='merge-on-read')"
    )
    spark.sql(
        f"INSERT INTO {name} SELECT /*+ COALESCE(1) */ * FROM VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(6))
    )
    spark.sql(f"DELETE FROM {name} WHERE id = 2")
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('format-version'='3')")
    info = table_info(spark, CATALOG, ns, "upgraded")
    assert info["format_version"] == 3
    where = {r.id: (r.file, r.pos) for r in spark.sql(f"SELECT id, _file AS file, _pos AS pos FROM {name}").collect()}
    path, pos = where[4]
    assert where[1][0] == path  # the v2 delete (of id 2) and ours target the same data file
    result = commit_files(
        spark,
        CATALOG,
        ns,
        "upgraded",
        {"base_snapshot_id": info["snapshot_id"], "deletes": [{"data_file": path, "positions": [pos]}]},
    )
    assert (result["delete_files"], result["removed_delete_files"]) == (1, 1)  # the v2 file-scoped delete
    assert _ids(spark, name) == [0, 1, 3, 5]
    live = spark.sql(f"SELECT file_format, record_count FROM {name}.delete_files").collect()
    assert [(r.file_format, r.record_count) for r in live] == [("PUFFIN", 2)]


def test_dvs_of_many_files_from_several_commits_merge_into_one_commit(spark, ns):
    """A commit touching many data files whose earlier DVs sit in several Puffin files (one per earlier commit),
    read up front: each new DV holds every earlier position, the old DVs go; both from the JVM's cached view of
    the table and from a freshly planned one (after another writer's snapshot)."""
    name, info = _new_table(spark, ns, "manydv")
    files = []
    for k in range(12):
        written, _ = _write(info, _rows(range(k * 10, (k + 1) * 10)), prefix=f"m{k}")
        files += written
    commit_files(spark, CATALOG, ns, "manydv", _request(files))
    paths = [f["path"] for f in files]
    first = commit_files(
        spark, CATALOG, ns, "manydv", {"deletes": [{"data_file": p, "positions": [0]} for p in paths[:8]]}
    )
    second = commit_files(
        spark, CATALOG, ns, "manydv", {"deletes": [{"data_file": p, "positions": [1, 2]} for p in paths[4:]]}
    )
    assert (first["previous_deletes_loaded"], second["previous_deletes_loaded"]) == (0, 4)
    # another writer's snapshot: the committer plans the table afresh (delete files as read from manifests)
    spark.sql(f"INSERT INTO {name} SELECT 1000, NULL, NULL, NULL, NULL, NULL, NULL")
    third = commit_files(spark, CATALOG, ns, "manydv", {"deletes": [{"data_file": p, "positions": [9]} for p in paths]})
    assert (third["delete_files"], third["removed_delete_files"], third["previous_deletes_loaded"]) == (12, 12, 12)
    assert {"load_previous_deletes", "write_dvs", "iceberg_commit"} <= set(third["timings_ms"])
    fourth = commit_files(
        spark, CATALOG, ns, "manydv", {"deletes": [{"data_file": p, "positions": [5]} for p in paths[::3]]}
    )
    assert (fourth["delete_files"], fourth["removed_delete_files"]) == (4, 4)
    gone = {k * 10 + pos for k in range(12) for pos in ([0] if k < 4 else [0, 1, 2] if k < 8 else [1, 2]) + [9]}
    gone |= {k * 10 + 5 for k in range(0, 12, 3)}
    assert _ids(spark, name) == sorted(set(range(120)) - gone) + [1000]
    counts = {
        r.referenced_data_file: r.record_count
        for r in spark.sql(f"SELECT referenced_data_file, record_count FROM {name}.delete_files").collect()
    }
    assert counts == {p: sum(1 for i in gone if i // 10 == k) for k, p in enumerate(paths)}


def test_commit_timings(spark, ns):
    """Not a benchmark: prints the order of magnitude of a commit with many files and deletes."""
    took = []
    for k in range(4):
        started = time.perf_counter()
        _new_table(spark, ns, f"timed_create_{k}", partition_by=["days(ts)", "bucket(16, id)"])
        took.append(time.perf_counter() - started)
    print("create_table (warm): " + ", ".join(f"{t * 1000:.0f} ms" for t in took))
    name, info = _new_table(spark, ns, "timed")
    files = []
    for k in range(20):
        written, _ = _write(info, _rows(range(k * 500, (k + 1) * 500)), prefix=f"f{k}")
        files += written
    started = time.perf_counter()
    commit_files(spark, CATALOG, ns, "timed", _request(files))
    appended = time.perf_counter() - started
    deletes = [{"data_file": f["path"], "positions": list(range(0, 500, 10))} for f in files]
    started = time.perf_counter()
    commit_files(spark, CATALOG, ns, "timed", {"deletes": deletes})
    first_dv = time.perf_counter() - started
    deletes = [{"data_file": f["path"], "positions": list(range(1, 500, 10))} for f in files]
    started = time.perf_counter()
    result = commit_files(spark, CATALOG, ns, "timed", {"deletes": deletes})
    merged = time.perf_counter() - started
    print(
        f"commit 20 files: {appended * 1000:.0f} ms; DVs for 20 files x 50 positions: {first_dv * 1000:.0f} ms; "
        f"merged DVs: {merged * 1000:.0f} ms"
    )
    assert (result["delete_files"], result["removed_delete_files"]) == (20, 20)
    assert spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0] == 20 * 500 - 20 * 100


def test_committed_file_metrics_are_icebergs_own(spark, ns):
    """The footer metrics of a committed data file (read without a Hadoop Configuration per file) are exactly
    those Iceberg's ParquetUtil.fileMetrics computes: counts, null counts and bounds of every column."""
    name, info = _new_table(spark, ns, "metrics")
    files, table = _write(info, _rows(range(1, 200)))
    commit_files(spark, CATALOG, ns, "metrics", _request(files))
    jvm = spark._jvm
    iceberg_table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, name)
    config = jvm.org.apache.iceberg.MetricsConfig.forTable(iceberg_table)
    rows = spark.sql(
        f"SELECT file_path, record_count, value_counts, null_value_counts, lower_bounds, upper_bounds, "
        f"column_sizes FROM {name}.data_files"
    ).collect()
    assert len(rows) == len(files) and sum(r.record_count for r in rows) == 199
    for row in rows:
        want = jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(
            iceberg_table.io().newInputFile(row.file_path), config
        )

        def as_dict(java_map, convert=lambda v: v):
            return {int(k): convert(v) for k, v in dict(java_map or {}).items()}

        def as_bytes(buffer):
            return bytes(jvm.org.apache.iceberg.util.ByteBuffers.toByteArray(buffer))

        assert row.record_count == want.recordCount()
        assert dict(row.value_counts) == as_dict(want.valueCounts())
        assert dict(row.null_value_counts) == as_dict(want.nullValueCounts())
        assert dict(row.column_sizes) == as_dict(want.columnSizes())
        assert {k: bytes(v) for k, v in row.lower_bounds.items()} == as_dict(want.lowerBounds(), as_bytes)
        assert {k: bytes(v) for k, v in row.upper_bounds.items()} == as_dict(want.upperBounds(), as_bytes)
        assert len(row.lower_bounds) >= 3  # id, name, amount, ts, region at least: the bounds were computed
