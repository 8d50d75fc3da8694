"""A connection to a MariaDB source database: capture's checks and catalog reads, and the parallel snapshot's
sessions, open it the same way."""

from __future__ import annotations

from typing import Any

from lakestream.config import CaptureSettings
from lakestream.errors import CaptureError


def source_connection(capture: CaptureSettings) -> Any:
    """An autocommit PyMySQL connection to ``capture.database``; CaptureError naming the fix when unreachable."""
    import pymysql

    db = capture.database
    try:
        return pymysql.connect(
            host=db.host,
            port=db.port,
            user=db.user,
            password=db.password.get_secret_value() if db.password else "",
            database=db.dbname,
            connect_timeout=10,
            autocommit=True,
            charset="utf8mb4",
        )
    except pymysql.Error as exc:
        raise CaptureError(
            f"cannot connect to MariaDB at {db.host}:{db.port} as {db.user!r} (database "
            f"{db.dbname!r}): {exc.args[-1] if exc.args else exc} — fix: check capture.database "
            "(host, port, user, password, dbname) and that the server is running"
        ) from None
