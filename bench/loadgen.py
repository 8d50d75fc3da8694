"""The end-to-end benchmark's source load: insert/update/delete transactions on PostgreSQL at a target rate.

Each connection runs in a process of its own (spawned, not forked: the parent holds a JVM), so the load
never competes with the pipeline driver for the parent's GIL and its CPU is counted apart from the
pipeline's. A transaction is one round trip with the rows built by the database (PostgreSQL: a call of a
PL/pgSQL function, ``PostgresSource``; MariaDB: one multi-statement request, ``MariadbSource``), so the
generator's own CPU stays small beside the system under test on the same two cores. The target rate can be
changed while it runs (the ramp in ``bench/e2e.py --only ramp``).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

STATUSES = ("new", "paid", "packed", "shipped", "delivered", "returned")
INSERTS, UPDATES, DELETES = 10, 8, 2  # per transaction


TXN_FUNCTION = "lakestream_bench_txn"

# The benchmark table's columns, in each source's SQL (the orders table of bench/_common.ORDERS_DDL).
POSTGRES_DDL = """id integer PRIMARY KEY, customer_id bigint NOT NULL, status text, amount numeric(12,2), qty integer,
    price double precision, express boolean, version integer NOT NULL, created_day date, created_at timestamp,
    updated_at timestamptz, note text"""
MARIADB_DDL = """id INT PRIMARY KEY, customer_id BIGINT NOT NULL, status TEXT, amount DECIMAL(12,2), qty INT,
    price DOUBLE, express BOOLEAN, version INT NOT NULL, created_day DATE, created_at DATETIME(6),
    updated_at TIMESTAMP(6) NULL, note TEXT"""
COLUMNS = "id, customer_id, status, amount, qty, price, express, version, note, created_day, created_at, updated_at"
TOTALS = "SELECT count(*), count(DISTINCT id), coalesce(sum(qty), 0), coalesce(sum(version), 0) FROM {table}"


class SourceDatabase:
    """The benchmark table in a source database: its creation, one transaction, and its totals to check the lake
    against."""

    kind = ""

    def __init__(self, params: dict[str, Any], table: str) -> None:
        self.params, self.table = params, table  # psycopg2.connect keyword arguments; schema-qualified table

    def connect(self) -> Any:
        raise NotImplementedError

    def create(self, seed_rows: int) -> None:
        raise NotImplementedError

    def transaction(
        self, cur: Any, first_id: int, stride: int, updates: list[int], deletes: list[int], status: str
    ) -> int:
        raise NotImplementedError

    def totals(self) -> dict[str, int]:
        conn = self.connect()
        with conn.cursor() as cur:
            cur.execute(TOTALS.format(table=self.table))
            n, keys, qty, version = cur.fetchone()
        conn.close()
        return {"n": int(n), "keys": int(keys), "qty": int(qty), "version": int(version)}


class PostgresSource(SourceDatabase):
    """The benchmark table in PostgreSQL, and a transaction as one call of a PL/pgSQL function."""

    kind = "postgresql"

    def connect(self) -> Any:
        import psycopg2

        return psycopg2.connect(**self.params)

    def create(self, seed_rows: int) -> None:
        conn = self.connect()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {self.table}")
            cur.execute(f"CREATE TABLE {self.table} ({POSTGRES_DDL})")
            cur.execute(
                f"INSERT INTO {self.table} ({COLUMNS}) SELECT i, i % 50000, 'new', (i % 19 + 1) * 19.99, i % 19 + 1, "
                f"19.99, i % 3 = 0, 1, 'seed ' || i, current_date, localtimestamp, now() "
                f"FROM generate_series(1, {int(seed_rows)}) AS i"
            )
            cur.execute(
                f"""
                CREATE OR REPLACE FUNCTION {TXN_FUNCTION}(first_id integer, stride integer, updates integer[],
                                                          deletes integer[], new_status text)
                RETURNS integer LANGUAGE plpgsql AS $$
                DECLARE
                    changed integer;
                    n integer;
                BEGIN
                    INSERT INTO {self.table} ({COLUMNS})
                    SELECT i, i % 50000, 'new', (i % 19 + 1) * 19.99, i % 19 + 1, 19.99, i % 3 = 0, 1, 'order ' || i,
                           current_date, localtimestamp, now()
                    FROM generate_series(first_id, first_id + stride * ({INSERTS} - 1), stride) AS i;
                    GET DIAGNOSTICS changed = ROW_COUNT;
                    UPDATE {self.table} SET qty = qty % 19 + 1, version = version + 1, status = new_status,
                           updated_at = now()
                    WHERE id = ANY(updates);
                    GET DIAGNOSTICS n = ROW_COUNT;
                    changed := changed + n;
                    DELETE FROM {self.table} WHERE id = ANY(deletes);
                    GET DIAGNOSTICS n = ROW_COUNT;
                    RETURN changed + n;
                END $$
                """
            )
        conn.close()

    def transaction(
        self, cur: Any, first_id: int, stride: int, updates: list[int], deletes: list[int], status: str
    ) -> int:
        cur.execute(f"SELECT {TXN_FUNCTION}(%s, %s, %s, %s, %s)", (first_id, stride, updates, deletes, status))
        return int(cur.fetchone()[0])


class MariadbSource(SourceDatabase):
    """The benchmark table in MariaDB, and a transaction as one multi-statement request (the inserted ids from
    the Sequence engine's ``seq_<a>_to_<b>_step_<s>``)."""

    kind = "mariadb"

    def connect(self) -> Any:
        import pymysql
        from pymysql.constants import CLIENT

        return pymysql.connect(**self.params, client_flag=CLIENT.MULTI_STATEMENTS)

    def create(self, seed_rows: int) -> None:
        conn = self.connect()
        conn.autocommit(True)
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {self.table}")
            cur.execute(f"CREATE TABLE {self.table} ({MARIADB_DDL})")
            cur.execute(
                f"INSERT INTO {self.table} ({COLUMNS}) SELECT seq, seq % 50000, 'new', (seq % 19 + 1) * 19.99, "
                f"seq % 19 + 1, 19.99, seq % 3 = 0, 1, CONCAT('seed ', seq), CURDATE(), NOW(6), NOW(6) "
                f"FROM seq_1_to_{int(seed_rows)}"
            )
        conn.close()

    def transaction(
        self, cur: Any, first_id: int, stride: int, updates: list[int], deletes: list[int], status: str
    ) -> int:
        last = first_id + stride * (INSERTS - 1)
        cur.execute(
            f"INSERT INTO {self.table} ({COLUMNS}) SELECT seq, seq % 50000, 'new', (seq % 19 + 1) * 19.99, "
            f"seq % 19 + 1, 19.99, seq % 3 = 0, 1, CONCAT('order ', seq), CURDATE(), NOW(6), NOW(6) "
            f"FROM seq_{int(first_id)}_to_{int(last)}_step_{int(stride)};"
            f"UPDATE {self.table} SET qty = qty % 19 + 1, version = version + 1, status = '{status}', "
            f"updated_at = NOW(6) WHERE id IN ({','.join(str(int(i)) for i in updates)});"
            f"DELETE FROM {self.table} WHERE id IN ({','.join(str(int(i)) for i in deletes)})"
        )
        changed = cur.rowcount
        while cur.nextset():
            changed += cur.rowcount
        return changed


class LoadGenerator:
    """``connections`` processes running transactions on disjoint keys, at ``rate`` changes/s in all (0: as fast
    as PostgreSQL allows)."""

    def __init__(self, source: SourceDatabase, connections: int, first_id: int, seeded: int, rate: float):
        ctx = multiprocessing.get_context("spawn")
        self.connections = connections
        self._rate = ctx.Value("d", float(rate))
        self._stop = ctx.Event()
        self._changes = ctx.Array("q", connections)
        self._transactions = ctx.Array("q", connections)
        self._errors = ctx.Queue()
        self._ready = ctx.Value("i", 0)
        self._procs = [
            ctx.Process(
                target=run_connection,
                args=(
                    i,
                    source,
                    connections,
                    first_id,
                    seeded,
                    self._rate,
                    self._stop,
                    self._changes,
                    self._transactions,
                    self._errors,
                    self._ready,
                ),
                name=f"loadgen-{i}",
                daemon=True,
            )
            for i in range(connections)
        ]
        self._error: str | None = None

    def start(self, timeout: float = 120.0) -> None:
        """Start every connection and return once each is connected (a spawned process imports the benchmark's
        modules first: that start-up is not part of any step's CPU)."""
        for p in self._procs:
            p.start()
        deadline = time.monotonic() + timeout
        while self._ready.value < self.connections:
            if self.error or time.monotonic() > deadline:
                self.finish()
                raise RuntimeError(f"load generator: {self.error or 'connections not ready in time'}")
            time.sleep(0.05)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    @property
    def rate(self) -> float:
        return self._rate.value

    @rate.setter
    def rate(self, value: float) -> None:
        self._rate.value = float(value)

    @property
    def total_changes(self) -> int:
        return sum(self._changes[:])

    @property
    def transactions(self) -> list[int]:
        return list(self._transactions[:])

    @property
    def error(self) -> str | None:
        if self._error is None and not self._errors.empty():
            self._error = self._errors.get_nowait()
        return self._error

    def finish(self) -> None:
        """Stop every connection (each ends its transaction first); RuntimeError if one failed."""
        self._stop.set()
        for p in self._procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        if self.error:
            raise RuntimeError(f"load generator: {self.error}")


def run_connection(
    index: int,
    source: SourceDatabase,
    connections: int,
    first_id: int,
    seeded: int,
    rate: Any,
    stop: Any,
    changes: Any,
    transactions: Any,
    errors: Any,
    ready: Any,
) -> None:
    """One connection's loop: 10 inserts, 8 updates and 2 deletes a transaction, paced to its share of the rate."""
    try:
        rng = random.Random(index)
        live = LiveKeys(i for i in range(1, seeded + 1) if i % connections == index)
        next_id = first_id + index
        per_txn = INSERTS + UPDATES + DELETES
        conn = source.connect()
        cur = conn.cursor()
        with ready.get_lock():
            ready.value += 1
        deadline = time.monotonic()
        paced_at = rate.value
        while not stop.is_set():
            targets = live.sample(rng, UPDATES + DELETES)
            gone = targets[UPDATES:]
            changed = source.transaction(cur, next_id, connections, targets[:UPDATES], gone, rng.choice(STATUSES))
            conn.commit()
            for _ in range(INSERTS):
                live.add(next_id)
                next_id += connections
            live.remove(set(gone))
            with changes.get_lock():
                changes[index] += changed
            with transactions.get_lock():
                transactions[index] += 1
            target = rate.value
            if target > 0:
                if target != paced_at:  # a new step of the ramp: pace from now, not from the old schedule
                    deadline, paced_at = time.monotonic(), target
                deadline += per_txn * connections / target
                stop.wait(max(0.0, deadline - time.monotonic()))
        conn.close()
    except BaseException as exc:  # noqa: BLE001 — reported to the parent, which raises it in finish()
        errors.put(f"connection {index}: {exc!r}")


class LiveKeys:
    """The keys a connection may update or delete: O(1) add, remove and random pick, as the table grows to
    millions of rows in a long ramp."""

    def __init__(self, keys: Any) -> None:
        self._keys = list(keys)
        self._where = {k: i for i, k in enumerate(self._keys)}

    def add(self, key: int) -> None:
        self._where[key] = len(self._keys)
        self._keys.append(key)

    def remove(self, keys: set[int]) -> None:
        for key in keys:  # swap with the last: order does not matter for random picks
            i = self._where.pop(key)
            last = self._keys.pop()
            if last != key:
                self._keys[i] = last
                self._where[last] = i

    def sample(self, rng: random.Random, n: int) -> list[int]:
        return [self._keys[i] for i in rng.sample(range(len(self._keys)), n)]
