"""The Customer 360 example's source workload: a SaaS product's users, subscriptions and usage events
in PostgreSQL, with a static plan catalog.

Users sign up, change country or e-mail, and leave (their subscriptions and usage events go with them,
`ON DELETE CASCADE`); subscriptions start, move to another plan (upgrades, downgrades), move to another
customer (an account transfer), are cancelled or deleted; usage events are recorded and, rarely,
deleted (a correction). Each change is its own PostgreSQL transaction.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS public.plans (
    id integer PRIMARY KEY,
    name text NOT NULL,
    tier text NOT NULL,
    monthly_price numeric(8, 2) NOT NULL
);
CREATE TABLE IF NOT EXISTS public.users (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    email text NOT NULL,
    country text NOT NULL,
    signed_up_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS public.subscriptions (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES public.users (id) ON DELETE CASCADE,
    plan_id integer NOT NULL REFERENCES public.plans (id),
    status text NOT NULL DEFAULT 'active',
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS public.usage_events (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES public.users (id) ON DELETE CASCADE,
    kind text NOT NULL,
    units integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""

# The product catalog: (id, name, tier, monthly price). Static while the workload runs.
PLANS = [
    (1, "Free", "free", 0),
    (2, "Starter", "basic", 9),
    (3, "Team", "pro", 29),
    (4, "Business", "pro", 79),
    (5, "Enterprise", "enterprise", 249),
    (6, "Extra storage", "addon", 5),
    (7, "Priority support", "addon", 19),
]
COUNTRIES = ["CH", "DE", "FR", "IT", "AT", "NL", "US", "GB"]
EVENT_KINDS = ["login", "api_call", "report", "export", "seat_added"]
FIRST_NAMES = ["Ada", "Alan", "Grace", "Linus", "Barbara", "Edsger", "Margaret", "Dennis", "Frances", "Ken"]


@dataclass
class SubscriptionStats:
    changes: int = 0
    signups: int = 0
    users_deleted: int = 0
    plan_changes: int = 0
    transfers: int = 0  # subscriptions moved to another customer
    cancellations: int = 0  # cancelled or deleted subscriptions
    usage_events: int = 0


class SubscriptionsWorkload:
    """Changes to users, subscriptions and usage events at a target rate; ``seed`` makes them reproducible."""

    def __init__(self, conn, seed: int | None = None):
        self.conn = conn
        self.rng = random.Random(seed)
        self.users: list[int] = []
        self.subscriptions: dict[int, int] = {}  # id → user id
        self.events: list[int] = []
        self.stats = SubscriptionStats()

    def create_schema(self) -> None:
        """The four tables and the plan catalog."""
        with self.conn.cursor() as cur:
            cur.execute(SCHEMA)
            cur.executemany("INSERT INTO public.plans VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO NOTHING", PLANS)
        self.conn.commit()

    def _execute(self, query: str, args: tuple = ()) -> list[tuple]:
        with self.conn.cursor() as cur:
            cur.execute(query, args)
            rows = cur.fetchall() if cur.description else []
        self.conn.commit()
        self.stats.changes += 1
        return rows

    def signup(self) -> None:
        name = f"{self.rng.choice(FIRST_NAMES)} {len(self.users) + self.stats.users_deleted + 1}"
        uid = self._execute(
            "INSERT INTO public.users (name, email, country) VALUES (%s, %s, %s) RETURNING id",
            (name, f"{name.lower().replace(' ', '.')}@example.com", self.rng.choice(COUNTRIES)),
        )[0][0]
        self.users.append(uid)
        self.stats.signups += 1
        if self.rng.random() < 0.7:
            self.subscribe(uid)

    def subscribe(self, user: int | None = None) -> None:
        user = user if user is not None else self.rng.choice(self.users)
        plan = self.rng.choices([p[0] for p in PLANS], weights=[4, 5, 4, 2, 1, 2, 1])[0]
        sid = self._execute(
            "INSERT INTO public.subscriptions (user_id, plan_id) VALUES (%s, %s) RETURNING id", (user, plan)
        )[0][0]
        self.subscriptions[sid] = user

    def _step(self) -> None:
        """One random change."""
        rng = self.rng
        kind = rng.random()
        if kind < 0.14 or len(self.users) < 8:
            self.signup()
        elif kind < 0.20:
            column, value = rng.choice(
                [("country", rng.choice(COUNTRIES)), ("email", f"user{rng.randrange(10**6)}@example.org")]
            )
            self._execute(f"UPDATE public.users SET {column} = %s WHERE id = %s", (value, rng.choice(self.users)))
        elif kind < 0.23:
            uid = self.users.pop(rng.randrange(len(self.users)))
            self._execute("DELETE FROM public.users WHERE id = %s", (uid,))  # cascades to its rows
            self.subscriptions = {s: u for s, u in self.subscriptions.items() if u != uid}
            self.stats.users_deleted += 1
        elif kind < 0.33 or not self.subscriptions:
            self.subscribe()
        elif kind < 0.43:
            sid = rng.choice(sorted(self.subscriptions))
            self._execute(
                "UPDATE public.subscriptions SET plan_id = %s, status = 'active' WHERE id = %s",
                (rng.choice(PLANS)[0], sid),
            )
            self.stats.plan_changes += 1
        elif kind < 0.47:
            sid, uid = rng.choice(sorted(self.subscriptions)), rng.choice(self.users)
            self._execute("UPDATE public.subscriptions SET user_id = %s WHERE id = %s", (uid, sid))
            self.subscriptions[sid] = uid
            self.stats.transfers += 1
        elif kind < 0.52:
            sid = rng.choice(sorted(self.subscriptions))
            if rng.random() < 0.6:
                self._execute("UPDATE public.subscriptions SET status = 'cancelled' WHERE id = %s", (sid,))
            else:
                self._execute("DELETE FROM public.subscriptions WHERE id = %s", (sid,))
                del self.subscriptions[sid]
            self.stats.cancellations += 1
        elif kind < 0.54 and self.events:
            self._execute(
                "DELETE FROM public.usage_events WHERE id = %s", (self.events.pop(rng.randrange(len(self.events))),)
            )
        else:
            eid = self._execute(
                "INSERT INTO public.usage_events (user_id, kind, units) VALUES (%s, %s, %s) RETURNING id",
                (rng.choice(self.users), rng.choice(EVENT_KINDS), rng.randint(1, 20)),
            )[0][0]
            self.events.append(eid)
            self.stats.usage_events += 1

    def run(
        self, duration_s: float, per_s: float, on_progress: Callable[[SubscriptionStats, float], None] | None = None
    ) -> SubscriptionStats:
        """Make ~``per_s`` changes a second for ``duration_s`` seconds."""
        started = time.monotonic()
        next_progress = 5.0
        while (elapsed := time.monotonic() - started) < duration_s:
            self._step()
            ahead = self.stats.changes / per_s - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            if on_progress is not None and elapsed >= next_progress:
                on_progress(self.stats, elapsed)
                next_progress += 5.0
        return self.stats
