"""The fraud example's source workload: card transactions in PostgreSQL, with injected patterns.

Accounts pay small amounts in their home country; now and then one account bursts (many payments in
seconds), pays abroad, makes a large payment or goes on a spending spree. Each payment is its own
PostgreSQL transaction, so its commit time (Debezium's source.ts_ms) is when the event happened.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS public.transactions (
    id bigserial PRIMARY KEY,
    account_id integer NOT NULL,
    amount numeric(12, 2) NOT NULL,
    country text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""

COUNTRIES = ["CH", "DE", "FR", "IT", "AT", "NL"]


@dataclass
class TransactionStats:
    transactions: int = 0
    injected: int = 0  # payments that belong to an injected pattern


class TransactionsWorkload:
    """Inserts payments at a target rate; ``seed`` makes the sequence reproducible."""

    def __init__(self, conn, accounts: int = 40, seed: int | None = None):
        self.conn = conn
        self.accounts = accounts
        self.rng = random.Random(seed)
        self.home = {a: self.rng.choice(COUNTRIES) for a in range(1, accounts + 1)}
        self.stats = TransactionStats()

    def create_schema(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(SCHEMA)
        self.conn.commit()

    def pay(self, account: int, amount: float, country: str | None = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute(
                "INSERT INTO public.transactions (account_id, amount, country) VALUES (%s, %s, %s)",
                (account, round(amount, 2), country or self.home[account]),
            )
        self.conn.commit()
        self.stats.transactions += 1

    def _pattern(self) -> list[tuple[int, float, str | None]]:
        """One injected pattern as a list of payments."""
        account = self.rng.randint(1, self.accounts)
        kind = self.rng.choice(["burst", "abroad", "large", "spree"])
        if kind == "burst":
            return [(account, self.rng.uniform(5, 80), None) for _ in range(self.rng.randint(5, 7))]
        if kind == "abroad":
            away = self.rng.choice([c for c in COUNTRIES if c != self.home[account]])
            return [(account, self.rng.uniform(20, 200), away), (account, self.rng.uniform(5, 50), None)]
        if kind == "large":
            return [(account, self.rng.uniform(4000, 9000), None)]
        return [(account, self.rng.uniform(1500, 3000), None) for _ in range(3)]

    def run(
        self,
        duration_s: float,
        per_s: float,
        pattern_every: int = 12,
        on_progress: Callable[[TransactionStats, float], None] | None = None,
    ) -> TransactionStats:
        """Insert ~``per_s`` payments a second for ``duration_s``; one pattern per ``pattern_every`` payments."""
        started = time.monotonic()
        next_progress = 5.0
        queue: list[tuple[int, float, str | None]] = []
        while (elapsed := time.monotonic() - started) < duration_s:
            if queue:
                self.pay(*queue.pop(0))
                self.stats.injected += 1
            elif self.rng.randrange(pattern_every) == 0:
                queue = self._pattern()
                continue
            else:
                self.pay(self.rng.randint(1, self.accounts), self.rng.uniform(2, 150))
            ahead = self.stats.transactions / per_s - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            if on_progress is not None and elapsed >= next_progress:
                on_progress(self.stats, elapsed)
                next_progress += 5.0
        return self.stats
