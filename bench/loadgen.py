"""The end-to-end benchmark's source load: insert/update/delete transactions on PostgreSQL at a target rate.

Each connection runs in a process of its own (spawned, not forked: the parent holds a JVM), so the load
never competes with the pipeline driver for the parent's GIL and its CPU is counted apart from the
pipeline's. A transaction is one call of a PL/pgSQL function (``TXN_FUNCTION``, created by
``create_txn_function``): one round trip, and the rows are built by PostgreSQL, so the generator's own CPU
stays small beside the system under test on the same two cores. The target rate can be changed while it runs
(the ramp in ``bench/e2e.py --only ramp``).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

STATUSES = ("new", "paid", "packed", "shipped", "delivered", "returned")
INSERTS, UPDATES, DELETES = 10, 8, 2  # per transaction


TXN_FUNCTION = "lakestream_bench_txn"


def create_txn_function(cur: Any, table: str) -> None:
    """One transaction's changes as a function: ``INSERTS`` new rows from ``first_id`` every ``stride`` ids, an
    update of each id in ``updates`` and a delete of each in ``deletes``; returns the rows changed."""
    cur.execute(
        f"""
        CREATE OR REPLACE FUNCTION {TXN_FUNCTION}(first_id integer, stride integer, updates integer[],
                                                  deletes integer[], new_status text)
        RETURNS integer LANGUAGE plpgsql AS $$
        DECLARE
            changed integer;
            n integer;
        BEGIN
            INSERT INTO {table} (id, customer_id, status, amount, qty, price, express, version, note,
                                 created_day, created_at, updated_at)
            SELECT i, i % 50000, 'new', (i % 19 + 1) * 19.99, i % 19 + 1, 19.99, i % 3 = 0, 1, 'order ' || i,
                   current_date, localtimestamp, now()
            FROM generate_series(first_id, first_id + stride * ({INSERTS} - 1), stride) AS i;
            GET DIAGNOSTICS changed = ROW_COUNT;
            UPDATE {table} SET qty = qty % 19 + 1, version = version + 1, status = new_status, updated_at = now()
            WHERE id = ANY(updates);
            GET DIAGNOSTICS n = ROW_COUNT;
            changed := changed + n;
            DELETE FROM {table} WHERE id = ANY(deletes);
            GET DIAGNOSTICS n = ROW_COUNT;
            RETURN changed + n;
        END $$
        """
    )


class LoadGenerator:
    """``connections`` processes running transactions on disjoint keys, at ``rate`` changes/s in all (0: as fast
    as PostgreSQL allows)."""

    def __init__(self, dsn: str, table: str, connections: int, first_id: int, seeded: int, rate: float):
        ctx = multiprocessing.get_context("spawn")
        self.connections = connections
        self._rate = ctx.Value("d", float(rate))
        self._stop = ctx.Event()
        self._changes = ctx.Array("q", connections)
        self._transactions = ctx.Array("q", connections)
        self._errors = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=run_connection,
                args=(
                    i,
                    dsn,
                    table,
                    connections,
                    first_id,
                    seeded,
                    self._rate,
                    self._stop,
                    self._changes,
                    self._transactions,
                    self._errors,
                ),
                name=f"loadgen-{i}",
                daemon=True,
            )
            for i in range(connections)
        ]
        self._error: str | None = None

    def start(self) -> None:
        for p in self._procs:
            p.start()

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
    dsn: str,
    table: str,
    connections: int,
    first_id: int,
    seeded: int,
    rate: Any,
    stop: Any,
    changes: Any,
    transactions: Any,
    errors: Any,
) -> None:
    """One connection's loop: 10 inserts, 8 updates and 2 deletes a transaction, paced to its share of the rate."""
    import psycopg2

    try:
        rng = random.Random(index)
        live = LiveKeys(i for i in range(1, seeded + 1) if i % connections == index)
        next_id = first_id + index
        per_txn = INSERTS + UPDATES + DELETES
        conn = psycopg2.connect(dsn)
        cur = conn.cursor()
        call = f"SELECT {TXN_FUNCTION}(%s, %s, %s, %s, %s)"
        deadline = time.monotonic()
        paced_at = rate.value
        while not stop.is_set():
            targets = live.sample(rng, UPDATES + DELETES)
            gone = targets[UPDATES:]
            cur.execute(call, (next_id, connections, targets[:UPDATES], gone, rng.choice(STATUSES)))
            changed = cur.fetchone()[0]
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
