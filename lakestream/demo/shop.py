"""The demo's source database: a small shop (customers, orders, order items) and its workload.

The workload mixes what a real OLTP database does: new orders with their lines in one transaction,
status changes, customer edits, cancellations that delete an order with its lines, and bulk updates
that touch many rows in one statement.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

TABLES = ["public.customers", "public.orders", "public.order_items"]
# On MariaDB the tables live in the stack's source database (`StackSettings.source_db`).
MARIADB_TABLES = ["shop.customers", "shop.orders", "shop.order_items"]

SCHEMA_DDL = [
    """CREATE TABLE public.customers (
        id bigserial PRIMARY KEY,
        email text NOT NULL UNIQUE,
        name text NOT NULL,
        segment text NOT NULL CHECK (segment IN ('consumer', 'smb', 'enterprise')),
        country char(2) NOT NULL,
        loyalty_points integer NOT NULL DEFAULT 0,
        active boolean NOT NULL DEFAULT true,
        attributes jsonb NOT NULL DEFAULT '{}',
        created_at timestamptz NOT NULL DEFAULT now(),
        birthday date
    )""",
    """CREATE TABLE public.orders (
        id bigserial PRIMARY KEY,
        customer_id bigint NOT NULL REFERENCES public.customers (id),
        status text NOT NULL CHECK (status IN ('pending', 'paid', 'shipped', 'delivered', 'cancelled')),
        total numeric(12,2) NOT NULL DEFAULT 0,
        currency char(3) NOT NULL DEFAULT 'EUR',
        shipping_address jsonb,
        ordered_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
        delivery_date date
    )""",
    """CREATE TABLE public.order_items (
        order_id bigint NOT NULL REFERENCES public.orders (id),
        line_no integer NOT NULL,
        sku text NOT NULL,
        quantity integer NOT NULL CHECK (quantity > 0),
        unit_price numeric(10,2) NOT NULL,
        discount numeric(5,4),
        PRIMARY KEY (order_id, line_no)
    )""",
]

MARIADB_SCHEMA_DDL = [
    """CREATE TABLE shop.customers (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        email VARCHAR(255) NOT NULL UNIQUE,
        name VARCHAR(200) NOT NULL,
        segment VARCHAR(20) NOT NULL CHECK (segment IN ('consumer', 'smb', 'enterprise')),
        country CHAR(2) NOT NULL,
        loyalty_points INT NOT NULL DEFAULT 0,
        active BOOLEAN NOT NULL DEFAULT TRUE,
        attributes JSON NOT NULL DEFAULT '{}',
        created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        birthday DATE
    )""",
    """CREATE TABLE shop.orders (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        customer_id BIGINT NOT NULL,
        status VARCHAR(20) NOT NULL CHECK (status IN ('pending', 'paid', 'shipped', 'delivered', 'cancelled')),
        total DECIMAL(12,2) NOT NULL DEFAULT 0,
        currency CHAR(3) NOT NULL DEFAULT 'EUR',
        shipping_address JSON,
        ordered_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        updated_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
        delivery_date DATE,
        FOREIGN KEY (customer_id) REFERENCES shop.customers (id)
    )""",
    """CREATE TABLE shop.order_items (
        order_id BIGINT NOT NULL,
        line_no INT NOT NULL,
        sku VARCHAR(20) NOT NULL,
        quantity INT NOT NULL CHECK (quantity > 0),
        unit_price DECIMAL(10,2) NOT NULL,
        discount DECIMAL(5,4),
        PRIMARY KEY (order_id, line_no),
        FOREIGN KEY (order_id) REFERENCES shop.orders (id)
    )""",
]


@dataclass(frozen=True)
class ShopSQL:
    """The statements that differ between the source databases the demo runs on."""

    tables: list[str]
    schema_ddl: list[str]
    session_setup: list[str]
    now_utc: str  # the current UTC time as a timestamp without time zone
    touch_attributes: str  # attributes with last_seen = now, as text

    def table(self, name: str) -> str:
        """``customers`` → the qualified name."""
        return next(t for t in self.tables if t.endswith("." + name))


POSTGRESQL = ShopSQL(
    TABLES,
    SCHEMA_DDL,
    # A demo database: commits need not wait for the WAL flush (the slot still sees them in order).
    ["SET synchronous_commit TO off"],
    "now() AT TIME ZONE 'UTC'",
    "attributes || jsonb_build_object('last_seen', now()::text)",
)
MARIADB = ShopSQL(
    MARIADB_TABLES,
    MARIADB_SCHEMA_DDL,
    [],
    "UTC_TIMESTAMP(6)",
    "JSON_SET(attributes, '$.last_seen', CAST(NOW(6) AS CHAR))",
)
DIALECTS = {"postgresql": POSTGRESQL, "mariadb": MARIADB}


_FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Margaret", "Linus", "Radia", "Tim"]
_LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Hamilton", "Perlman"]
_COUNTRIES = ["DE", "FR", "NL", "US", "GB", "ES", "IT", "SE", "PL", "JP"]
_SEGMENTS = ["consumer"] * 6 + ["smb"] * 3 + ["enterprise"]
_SKUS = [f"SKU-{n:04d}" for n in range(1, 121)]
_NEXT_STATUS = {"pending": "paid", "paid": "shipped", "shipped": "delivered"}


def create_schema(conn, sql: ShopSQL = POSTGRESQL) -> None:
    """Drop and re-create the shop tables (children first: foreign keys)."""
    with conn.cursor() as cur:
        for table in reversed(sql.tables):
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        for ddl in sql.schema_ddl:
            cur.execute(ddl)
    conn.commit()


@dataclass
class WorkloadStats:
    changes: int = 0
    transactions: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0


class ShopWorkload:
    """Generates shop transactions on one DB-API connection (psycopg2 or PyMySQL; autocommit off)."""

    def __init__(self, conn, seed: int | None = None, sql: ShopSQL = POSTGRESQL):
        self.conn = conn
        self.sql = sql
        self.customers, self.orders, self.order_items = (sql.table(t) for t in ("customers", "orders", "order_items"))
        with conn.cursor() as cur:
            for statement in sql.session_setup:
                cur.execute(statement)
        conn.commit()
        self.rng = random.Random(seed)
        self.stats = WorkloadStats()
        self.customer_ids: list[int] = []
        self.open_orders: dict[int, str] = {}  # order id → status, for orders not yet delivered/cancelled
        self._email_seq = 0

    # -- seeding -------------------------------------------------------------------------------

    def seed(self, customers: int = 200, orders: int = 400) -> None:
        for _ in range(customers):
            self._new_customer()
        for _ in range(orders):
            self._new_order()
        self.conn.commit()

    # -- the workload --------------------------------------------------------------------------

    def run(
        self,
        duration_s: float,
        rate: float,
        on_progress: Callable[[WorkloadStats, float], None] | None = None,
        progress_every_s: float = 5.0,
    ) -> WorkloadStats:
        """Run transactions for ``duration_s`` at about ``rate`` row changes per second."""
        start = time.monotonic()
        next_progress = start + progress_every_s
        while True:
            now = time.monotonic()
            if now - start >= duration_s:
                break
            self.transaction()
            if on_progress and now >= next_progress:
                on_progress(self.stats, now - start)
                next_progress += progress_every_s
            ahead = self.stats.changes / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(min(ahead, 0.5))
        return self.stats

    def transaction(self) -> None:
        """One random business transaction, committed."""
        roll = self.rng.random()
        if roll < 0.40 or len(self.open_orders) < 20:
            self._new_order()
        elif roll < 0.65:
            for _ in range(self.rng.randint(1, 3)):
                self._advance_order()
        elif roll < 0.78:
            self._update_customer()
        elif roll < 0.82:
            self._new_customer()
        elif roll < 0.94:
            self._cancel_order()
        else:
            self._bulk_reprice()
        self.conn.commit()
        self.stats.transactions += 1

    def _count(self, kind: str, n: int) -> None:
        setattr(self.stats, kind, getattr(self.stats, kind) + n)
        self.stats.changes += n

    def _new_customer(self) -> None:
        rng = self.rng
        self._email_seq += 1
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        attributes = {
            "newsletter": rng.random() < 0.5,
            "tags": rng.sample(["vip", "b2b", "eco", "mobile"], k=rng.randint(0, 2)),
        }
        with self.conn.cursor() as cur:
            cur.execute(
                f"""INSERT INTO {self.customers} (email, name, segment, country, attributes, birthday)
                   VALUES (%s, %s, %s, %s, %s, %s) RETURNING id""",
                (
                    f"{first}.{last}.{self._email_seq}.{rng.randrange(10**6)}@example.com".lower(),
                    f"{first} {last}",
                    rng.choice(_SEGMENTS),
                    rng.choice(_COUNTRIES),
                    json.dumps(attributes),
                    None
                    if rng.random() < 0.3
                    else f"{rng.randint(1950, 2005)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                ),
            )
            self.customer_ids.append(cur.fetchone()[0])
        self._count("inserts", 1)

    def _new_order(self) -> None:
        rng = self.rng
        lines = [
            (
                rng.choice(_SKUS),
                rng.randint(1, 5),
                Decimal(rng.randint(199, 24999)) / 100,
                None if rng.random() < 0.7 else Decimal(rng.choice([5, 10, 15])) / 100,
            )
            for _ in range(rng.randint(1, 4))
        ]
        total = sum((q * p * (1 - (d or 0)) for _, q, p, d in lines), Decimal(0)).quantize(Decimal("0.01"))
        address = {
            "city": rng.choice(["Berlin", "Paris", "Amsterdam", "Austin", "Kyoto"]),
            "zip": f"{rng.randint(10000, 99999)}",
        }
        with self.conn.cursor() as cur:
            cur.execute(
                f"""INSERT INTO {self.orders} (customer_id, status, shipping_address)
                    VALUES (%s, 'pending', %s) RETURNING id""",
                (rng.choice(self.customer_ids), json.dumps(address)),
            )
            order_id = cur.fetchone()[0]
            cur.executemany(
                f"INSERT INTO {self.order_items} (order_id, line_no, sku, quantity, unit_price, discount) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                [(order_id, n, sku, q, p, d) for n, (sku, q, p, d) in enumerate(lines, start=1)],
            )
            cur.execute(f"UPDATE {self.orders} SET total = %s WHERE id = %s", (total, order_id))
        self.open_orders[order_id] = "pending"
        self._count("inserts", 1 + len(lines))
        self._count("updates", 1)

    def _advance_order(self) -> None:
        if not self.open_orders:
            return
        order_id = self.rng.choice(list(self.open_orders))
        status = _NEXT_STATUS[self.open_orders[order_id]]
        with self.conn.cursor() as cur:
            cur.execute(
                f"""UPDATE {self.orders} SET status = %s, updated_at = {self.sql.now_utc},
                   delivery_date = CASE WHEN %s = 'delivered' THEN current_date ELSE delivery_date END WHERE id = %s""",
                (status, status, order_id),
            )
        if status == "delivered":
            del self.open_orders[order_id]
        else:
            self.open_orders[order_id] = status
        self._count("updates", 1)

    def _update_customer(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(
                f"""UPDATE {self.customers} SET loyalty_points = loyalty_points + %s,
                   attributes = {self.sql.touch_attributes} WHERE id = %s""",
                (self.rng.randint(1, 50), self.rng.choice(self.customer_ids)),
            )
        self._count("updates", 1)

    def _cancel_order(self) -> None:
        pending = [o for o, s in self.open_orders.items() if s == "pending"]
        if not pending:
            return
        order_id = self.rng.choice(pending)
        del self.open_orders[order_id]
        with self.conn.cursor() as cur:
            if self.rng.random() < 0.5:
                # A cancelled order is kept, flagged; half of them are removed with their lines.
                cur.execute(
                    f"UPDATE {self.orders} SET status = 'cancelled', updated_at = {self.sql.now_utc} WHERE id = %s",
                    (order_id,),
                )
                self._count("updates", 1)
                return
            cur.execute(f"DELETE FROM {self.order_items} WHERE order_id = %s", (order_id,))
            lines = cur.rowcount
            cur.execute(f"DELETE FROM {self.orders} WHERE id = %s", (order_id,))
        self._count("deletes", lines + 1)

    def _bulk_reprice(self) -> None:
        sku = self.rng.choice(_SKUS)
        with self.conn.cursor() as cur:
            cur.execute(
                f"""UPDATE {self.order_items} SET unit_price = round(unit_price * 0.97, 2)
                   WHERE sku = %s AND order_id IN (SELECT id FROM {self.orders} WHERE status = 'pending')""",
                (sku,),
            )
            self._count("updates", cur.rowcount)


ANALYTICAL_QUERY = """
SELECT c.segment,
       count(DISTINCT o.id) AS orders,
       count(DISTINCT c.id) AS customers,
       CAST(sum(i.quantity * i.unit_price * (1 - coalesce(i.discount, 0))) AS DECIMAL(14,2)) AS revenue,
       CAST(sum(i.quantity * i.unit_price * (1 - coalesce(i.discount, 0))) / count(DISTINCT o.id)
            AS DECIMAL(12,2)) AS avg_order
FROM {customers} c
JOIN {orders} o ON o.customer_id = c.id AND o.status <> 'cancelled'
JOIN {order_items} i ON i.order_id = o.id
GROUP BY c.segment
ORDER BY revenue DESC
LIMIT 5
"""
