"""The dashboard's HTTP server: the page, plotly.js from the `plotly` wheel (no CDN: it works offline),
and ``/api/state``, the latest `collect_dashboard` round as JSON, which the page polls.

Rounds run on one background thread every ``interval_s``; requests only read the latest result, so a
slow round never blocks the page and several browsers cost no extra Spark work.
"""

from __future__ import annotations

import importlib.resources
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

import orjson

from lakestream.config import PipelineConfig
from lakestream.dashboard.state import DEFAULT_HISTORY_S, BatchLog, collect_dashboard
from lakestream.errors import first_line

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def _plotly_js() -> bytes:
    try:
        return (importlib.resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        from lakestream.errors import ConfigError

        raise ConfigError(
            "the dashboard needs the `plotly` wheel (it ships plotly.min.js): pip install -r requirements.lock"
        ) from exc


class DashboardServer:
    """Serves the dashboard of ``config`` on ``http://host:port/`` (port 0: any free port)."""

    def __init__(
        self,
        spark: SparkSession,
        config: PipelineConfig,
        host: str = "127.0.0.1",
        port: int = 8765,
        interval_s: float = 10.0,
        history_s: float = DEFAULT_HISTORY_S,
        tables: list[str] | None = None,
    ) -> None:
        from lakestream.engine.loop import metrics_path

        self.spark, self.config = spark, config
        self.interval_s, self.history_s, self.tables = interval_s, history_s, tables
        self._batch_log = BatchLog(metrics_path(config))
        self._page = (importlib.resources.files("lakestream.dashboard") / "page.html").read_bytes()
        self._plotly = _plotly_js()
        self._state = orjson.dumps({"pipeline": config.name, "collected_ms": None, "refresh_s": interval_s})
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            self._httpd = ThreadingHTTPServer((host, port), self._handler())
        except OSError as exc:
            from lakestream.errors import ConfigError

            raise ConfigError(
                f"the dashboard cannot listen on {host}:{port}: {exc.strerror} — "
                "choose another --port (0 = any free port)"
            ) from exc
        self._httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}/"

    def refresh(self) -> None:
        """One round now (the background thread calls this every ``interval_s``)."""
        state = collect_dashboard(self.spark, self.config, self._batch_log, self.history_s, tables=self.tables)
        state["refresh_s"] = self.interval_s
        with self._lock:
            self._state = orjson.dumps(state, default=str)

    def state_json(self) -> bytes:
        with self._lock:
            return self._state

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 — keep serving the last good round; try again
                log.error("dashboard round failed: %s", first_line(exc, 300))
            self._stop.wait(max(0.5, self.interval_s - (time.monotonic() - started)))

    def start(self) -> DashboardServer:
        for target, name in ((self._httpd.serve_forever, "dashboard-http"), (self._refresh_loop, "dashboard-rounds")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("dashboard of %s on %s (a round every %gs)", self.config.name, self.url, self.interval_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=60)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 — http.server's name
                path = self.path.split("?", 1)[0]
                if path in ("/", "/index.html"):
                    self._send(server._page, "text/html; charset=utf-8")
                elif path == "/static/plotly.min.js":
                    self._send(server._plotly, "application/javascript", cache=True)
                elif path == "/api/state":
                    self._send(server.state_json(), "application/json")
                else:
                    self.send_error(HTTPStatus.NOT_FOUND)

            def _send(self, body: bytes, content_type: str, cache: bool = False) -> None:
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:  # noqa: A002 — requests at debug, not on stderr
                log.debug("%s " + format, self.address_string(), *args)

        return Handler
