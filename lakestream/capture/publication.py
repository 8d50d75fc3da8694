"""The PostgreSQL publication capture reads through, and the start-time check that every captured table
will publish its changes.

pgoutput publishes what the publication holds, and nothing warns about a table it leaves out: a
partitioned table's changes are reported under its leaf partitions unless the publication has
``publish_via_partition_root = true``, a publication with ``publish = 'insert'`` drops updates and
deletes, a view publishes nothing. So before Debezium starts, `prepare_publication` resolves every
table of ``capture.tables`` in the catalog, creates or completes the publication when lakestream
manages it (``capture.manage_publication``, the default), and then checks the publication as
PostgreSQL reports it (``pg_publication_tables``): a table it would not publish under its own name
stops capture with the reason and the fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from psycopg2 import sql as pgsql

from lakestream.config import CaptureSettings
from lakestream.errors import CaptureError
from lakestream.identifiers import SourceTableName

log = logging.getLogger(__name__)

_KINDS = {
    "v": "a view",
    "m": "a materialized view",
    "f": "a foreign table",
    "S": "a sequence",
    "c": "a type",
    "i": "an index",
    "I": "an index",
    "t": "a TOAST table",
}
_REPLICA_IDENTITY = {"d": "default", "f": "full", "i": "index", "n": "nothing"}


@dataclass(frozen=True)
class CapturedTable:
    """A table of ``capture.tables`` as the source catalog has it."""

    name: SourceTableName
    oid: int
    partitioned: bool  # a partitioned parent: one mirror for all its partitions
    partition_of: SourceTableName | None  # a leaf named on its own: its direct parent
    has_primary_key: bool
    replica_identity: str  # default | full | index | nothing

    @property
    def keyless(self) -> bool:
        """Debezium publishes its events with a null key (no primary key, no identity index)."""
        return not self.has_primary_key and self.replica_identity != "index"


def describe_captured(conn: Any, tables: list[SourceTableName], allow_missing: bool = False) -> list[CapturedTable]:
    """Resolve ``tables`` in the catalog; CaptureError naming each one that cannot be captured. With
    ``allow_missing`` (a publication FOR ALL TABLES, which publishes tables created later), a table that does
    not exist yet is left out with a warning: it is captured once it is created."""
    out: list[CapturedTable] = []
    problems: list[str] = []
    with conn.cursor() as cur:
        cur.execute("SHOW server_version_num")
        version = int(cur.fetchone()[0])
        for name in tables:
            cur.execute(
                """SELECT c.oid, c.relkind, c.relispartition, c.relreplident,
                          EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
                          (SELECT pn.nspname FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent
                             JOIN pg_namespace pn ON pn.oid = p.relnamespace WHERE h.inhrelid = c.oid LIMIT 1),
                          (SELECT p.relname FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent
                             WHERE h.inhrelid = c.oid LIMIT 1)
                   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = %s AND c.relname = %s""",
                (name.schema, name.table),
            )
            row = cur.fetchone()
            if row is None and allow_missing:
                log.warning(
                    "capture: %s does not exist yet; the publication covers all tables, so its changes are "
                    "captured once it is created",
                    name,
                )
                continue
            if row is None:
                problems.append(
                    f"{name} does not exist in the source database — fix: create it before capture "
                    "starts, or remove it from capture.tables (names are taken exactly as written, "
                    "case included)"
                )
                continue
            oid, kind, is_partition, identity, has_pk, parent_schema, parent_table = row
            if kind not in ("r", "p"):
                problems.append(
                    f"{name} is {_KINDS.get(kind, f'a relation of kind {kind!r}')}, which publishes no "
                    "changes — fix: capture the tables it reads from instead"
                )
                continue
            if kind == "p" and version < 130000:
                problems.append(
                    f"{name} is a partitioned table and PostgreSQL {version // 10000} cannot publish its "
                    "changes under its own name (publish_via_partition_root needs PostgreSQL 13) — fix: "
                    "capture its partitions instead, or upgrade to PostgreSQL 13 or later"
                )
                continue
            parent = SourceTableName(parent_schema, parent_table) if is_partition and parent_table else None
            out.append(
                CapturedTable(
                    name, int(oid), kind == "p", parent, bool(has_pk), _REPLICA_IDENTITY.get(identity, identity)
                )
            )
        by_oid = {t.oid: t for t in out}
        for t in out:
            if t.partition_of is None:
                continue
            cur.execute(
                "SELECT relid::oid::int8 FROM pg_partition_ancestors(%s) WHERE relid <> %s::oid", (t.oid, t.oid)
            )
            for (ancestor,) in cur.fetchall():
                if int(ancestor) in by_oid:
                    problems.append(
                        f"{t.name} is a partition of {by_oid[int(ancestor)].name}, and both are in "
                        f"capture.tables: its changes are published as {by_oid[int(ancestor)].name}'s, "
                        f"so {t.name}'s mirror would never change — fix: remove {t.name}"
                    )
    if problems:
        raise CaptureError("capture cannot start:\n  " + "\n  ".join(problems))
    return out


def _publication(cur: Any, name: str) -> tuple[Any, ...] | None:
    cur.execute(
        """SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
                   FROM pg_publication WHERE pubname = %s""",
        (name,),
    )
    return cur.fetchone()


def prepare_publication(
    conn: Any, capture: CaptureSettings, tables: list[SourceTableName] | None = None
) -> list[CapturedTable]:
    """Make the capture publication cover ``tables`` (default: ``capture.tables``) when lakestream manages
    it, then check that every one of them will publish its changes under its own name. Returns the tables
    as the catalog has them; CaptureError with the reason and the fix otherwise. ``conn``: autocommit."""
    pub = capture.publication_name
    with conn.cursor() as cur:
        existing = _publication(cur, pub)
    all_tables_wanted = capture.connector.get("publication.autocreate.mode") == "all_tables"
    publishes_all = bool(existing[0]) if existing is not None else capture.manage_publication and all_tables_wanted
    wanted = describe_captured(
        conn, tables if tables is not None else capture.source_tables, allow_missing=publishes_all
    )
    needs_root = any(t.partitioned for t in wanted)
    ident = pgsql.Identifier(pub)
    with conn.cursor() as cur:
        if capture.manage_publication:
            row = _publication(cur, pub)
            relations = pgsql.SQL(", ").join(pgsql.SQL(t.name.sql()) for t in wanted)
            if row is None:
                # Debezium's all_tables mode, asked for in capture.connector, is kept: tables created later
                # are published too (the include list then decides what is captured).
                cur.execute(
                    pgsql.SQL("CREATE PUBLICATION {} FOR {} WITH (publish_via_partition_root = true)").format(
                        ident, pgsql.SQL("ALL TABLES") if all_tables_wanted else pgsql.SQL("TABLE {}").format(relations)
                    )
                )
                log.info(
                    "capture: created publication %s for %s",
                    pub,
                    "all tables" if all_tables_wanted else ", ".join(str(t.name) for t in wanted),
                )
            else:
                all_tables, ins, upd, dele, trunc, via_root = row
                if not all_tables:
                    cur.execute(
                        "SELECT prrelid FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
                        "WHERE p.pubname = %s",
                        (pub,),
                    )
                    have = {int(r[0]) for r in cur.fetchall()}
                    missing = [t for t in wanted if t.oid not in have]
                    if missing:
                        cur.execute(
                            pgsql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                                ident, pgsql.SQL(", ").join(pgsql.SQL(t.name.sql()) for t in missing)
                            )
                        )
                        log.info("capture: added %s to publication %s", ", ".join(str(t.name) for t in missing), pub)
                if not (ins and upd and dele and trunc):
                    cur.execute(
                        pgsql.SQL("ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate')").format(
                            ident
                        )
                    )
                if needs_root and not via_root:
                    cur.execute(pgsql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(ident))
                    log.info("capture: publication %s now publishes partitioned tables under their own names", pub)
        check_publication(conn, capture, wanted)
    return wanted


def check_publication(conn: Any, capture: CaptureSettings, wanted: list[CapturedTable]) -> None:
    """CaptureError unless the publication publishes inserts, updates and deletes of every ``wanted`` table
    under that table's own name (as ``pg_publication_tables`` reports it)."""
    pub = capture.publication_name
    fix_owner = (
        "" if capture.manage_publication else " (or set capture.manage_publication: true and lakestream maintains it)"
    )
    with conn.cursor() as cur:
        row = _publication(cur, pub)
        if row is None:
            raise CaptureError(
                f"capture cannot start: publication {pub} does not exist — fix: CREATE PUBLICATION "
                f"{pgsql.Identifier(pub).as_string(conn)} FOR TABLE "
                f"{', '.join(t.name.sql() for t in wanted)} WITH (publish_via_partition_root = true)" + fix_owner
            )
        _, ins, upd, dele, _, via_root = row
        problems = []
        dropped = [op for op, on in (("insert", ins), ("update", upd), ("delete", dele)) if not on]
        if dropped:
            problems.append(
                f"publication {pub} does not publish {' or '.join(dropped)} changes: they would never "
                f"reach the mirrors — fix: ALTER PUBLICATION {pub} SET (publish = 'insert, update, "
                "delete, truncate')"
            )
        cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (pub,))
        published = {SourceTableName(s, t) for s, t in cur.fetchall()}
        for t in wanted:
            if t.name in published:
                continue
            if t.partitioned and not via_root:
                problems.append(
                    f"{t.name} is a partitioned table and publication {pub} publishes its changes under "
                    "its partitions' names (publish_via_partition_root is off), so its mirror would stop "
                    f"changing after the snapshot — fix: ALTER PUBLICATION {pub} SET "
                    "(publish_via_partition_root = true)"
                )
            elif t.partition_of is not None and via_root:
                problems.append(
                    f"{t.name} is a partition, and publication {pub} publishes its changes as those of "
                    f"a partitioned table it also holds — fix: capture {t.partition_of} (or its root) "
                    f"instead, or remove that table from the publication"
                )
            else:
                problems.append(
                    f"publication {pub} does not publish {t.name} — fix: ALTER PUBLICATION {pub} ADD "
                    f"TABLE {t.name.sql()}"
                )
        if problems:
            if not capture.manage_publication:
                problems.append("or set capture.manage_publication: true, and lakestream maintains the publication")
            raise CaptureError(
                "capture cannot start: not every table in capture.tables would publish its "
                "changes:\n  " + "\n  ".join(problems)
            )


def source_connection(capture: CaptureSettings) -> Any:
    """An autocommit psycopg2 connection to the source database."""
    import psycopg2

    db = capture.database
    conn = psycopg2.connect(
        host=db.host,
        port=db.port,
        dbname=db.dbname,
        user=db.user,
        password=db.password.get_secret_value() if db.password else None,
    )
    conn.autocommit = True
    return conn
