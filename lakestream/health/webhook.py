"""Webhook alerts: a JSON POST when a threshold is crossed ("raised") and when it recovers ("cleared").

The set of active alerts is remembered between rounds (in memory, and in a small JSON file when a
``state_path`` is given, so that cron-style `lakestream health` runs also report transitions only once).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from lakestream.health.checks import Alert

log = logging.getLogger(__name__)


class AlertNotifier:
    """Diffs each round's alerts against the previous round and POSTs the changes."""

    def __init__(self, url: str | None, state_path: str | Path | None = None, timeout_s: float = 5.0):
        self.url = url
        self.timeout_s = timeout_s
        self.state_path = Path(state_path) if state_path else None
        self.active: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.state_path and self.state_path.exists():
            try:
                return dict(json.loads(self.state_path.read_text()))
            except (OSError, ValueError):
                log.warning("ignoring unreadable alert state %s", self.state_path)
        return {}

    def _save(self) -> None:
        if self.state_path:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.active))
            tmp.replace(self.state_path)

    def notify(self, alerts: list[Alert]) -> list[dict[str, Any]]:
        """Send one event per raised or cleared alert; returns the events (sent or not)."""
        current = {a.key: a.to_json() for a in alerts}
        now = time.time()
        events = [{"event": "raised", "at": now, **current[k]} for k in sorted(current.keys() - self.active.keys())]
        events += [
            {"event": "cleared", "at": now, **self.active[k]} for k in sorted(self.active.keys() - current.keys())
        ]
        for event in events:
            self._post(event)
        self.active = current
        self._save()
        return events

    def _post(self, event: dict[str, Any]) -> None:
        log.info("alert %s: %s %s", event["event"], event["key"], event.get("message", ""))
        if not self.url:
            return
        request = urllib.request.Request(
            self.url, data=json.dumps(event).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except (urllib.error.URLError, OSError) as exc:  # alerting must never stop the pipeline
            log.warning("webhook %s failed for %s: %s", self.url, event["key"], exc)
