"""The IoT example's sensor producer: JSON readings keyed by equipment_id, over simulated time.

Readings are in order per machine, except some that arrive up to 30 s late; `too_late` builds
readings ten minutes behind, which a window with a shorter allowed lateness must refuse.
"""

from __future__ import annotations

import json
import random
from typing import Any


class SensorProducer:
    """Readings of ``machines`` machines from ``start_ms`` on; ``seed`` makes them reproducible."""

    def __init__(
        self, bootstrap: str, topic: str, machines: int = 6, start_ms: int = 1_767_225_600_000, seed: int | None = None
    ):
        self.bootstrap, self.topic = bootstrap, topic
        self.machines = machines
        self.rng = random.Random(seed)
        self.clock = start_ms  # the newest event time produced
        self.sent: list[dict[str, Any]] = []

    def create_topic(self, partitions: int = 4) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(self.topic, partitions, 1)]).values():
            try:
                future.result(30)
            except Exception as exc:  # noqa: BLE001 — an existing topic is fine
                if "exist" not in str(exc).lower():
                    raise

    def readings(self, n: int, late_share: float = 0.15) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            self.clock += self.rng.randint(0, 4000)
            late = self.rng.random() < late_share
            out.append(
                {
                    "equipment_id": f"m{self.rng.randint(1, self.machines)}",
                    "ts": self.clock - self.rng.randint(1000, 30_000) if late else self.clock,
                    "temperature": round(self.rng.uniform(40, 90), 2),
                    "vibration": round(self.rng.uniform(0, 5), 3),
                }
            )
        return out

    def too_late(self, n: int, behind_ms: int = 600_000) -> list[dict[str, Any]]:
        return [
            {"equipment_id": "m1", "ts": self.clock - behind_ms + i * 1000, "temperature": 99.0, "vibration": 9.9}
            for i in range(n)
        ]

    def send(self, readings: list[dict[str, Any]]) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        errors: list[str] = []
        for r in readings:
            producer.produce(
                self.topic,
                key=r["equipment_id"].encode(),
                value=json.dumps(r).encode(),
                on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
            )
        if producer.flush(30) or errors:
            raise RuntimeError(f"sensor readings not delivered: {errors[:3]}")
        self.sent.extend(readings)
