"""SQL on a Trino server that reads the lake: the stack's (``lakestream stack up --trino``) or the user's own.

Trino opens the pipeline's tables through its Iceberg connector (a catalog made by
`lakestream.stack.trino.iceberg_catalog_properties`), so a query names them ``<catalog>.<namespace>.<table>`` as in
Spark; the session's default catalog is the pipeline's ``catalog.name``. Rows come back through Trino's own Python
client (``trino``), as Python values (``datetime``, ``Decimal``, ``bytes``, lists, dicts).

    from lakestream.read.trino import TrinoTarget, run_trino_sql
    columns, rows = run_trino_sql(TrinoTarget.from_env(), "SELECT count(*) FROM lake.shop.orders")
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from lakestream.errors import QueryError

URI_ENV = "LAKESTREAM_TRINO_URI"
USER_ENV = "LAKESTREAM_TRINO_USER"
PASSWORD_ENV = "LAKESTREAM_TRINO_PASSWORD"
# Where `lakestream stack up --trino` serves (StackSettings.trino_port).
STACK_URI = "http://127.0.0.1:18080"


@dataclass(frozen=True)
class TrinoTarget:
    """A Trino coordinator: its HTTP(S) address, the user queries run as, and a password for HTTPS password
    authentication (None: none)."""

    uri: str = STACK_URI
    user: str = "lakestream"
    password: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, uri: str | None = None, user: str | None = None) -> TrinoTarget:
        """``uri`` and ``user`` if given, else ``LAKESTREAM_TRINO_URI`` / ``LAKESTREAM_TRINO_USER``, else the stack's
        Trino; the password from ``LAKESTREAM_TRINO_PASSWORD`` only (never an argument: argv is world-readable)."""
        return cls(
            uri=uri or os.environ.get(URI_ENV) or STACK_URI,
            user=user or os.environ.get(USER_ENV) or "lakestream",
            password=os.environ.get(PASSWORD_ENV) or None,
        )

    def __post_init__(self) -> None:
        parts = urlsplit(self.uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise QueryError(
                f"Trino address {self.uri!r} (--trino-uri / {URI_ENV}) is not http(s)://host[:port] — fix: give "
                f"the coordinator's address, e.g. {STACK_URI}"
            )
        if self.password is not None and parts.scheme != "https":
            raise QueryError(
                f"{PASSWORD_ENV} is set but the Trino address is {parts.scheme}://: Trino takes passwords over "
                "https only — fix: give the coordinator's https:// address, or unset the variable"
            )


def run_trino_sql(
    target: TrinoTarget, query: str, catalog: str | None = None, limit: int = 0
) -> tuple[list[str], list[tuple]]:
    """Run one statement on ``target`` (default catalog ``catalog``): its column names and rows (at most ``limit``
    + 1 rows when ``limit`` > 0, so that a caller can tell the result was cut; 0 for all)."""
    try:
        import trino
        from trino.exceptions import HttpError, TrinoAuthError, TrinoConnectionError, TrinoQueryError
    except ImportError:
        raise QueryError("the Trino client is not installed — fix: pip install 'lakestream[trino]'") from None
    parts = urlsplit(target.uri)
    auth = trino.auth.BasicAuthentication(target.user, target.password) if target.password is not None else None
    conn = trino.dbapi.connect(
        host=parts.hostname,
        port=parts.port or (443 if parts.scheme == "https" else 80),
        http_scheme=parts.scheme,
        user=target.user,
        auth=auth,
        catalog=catalog,
        source="lakestream",
    )
    try:
        cursor = conn.cursor()
        cursor.execute(query)
        rows = cursor.fetchmany(limit + 1) if limit > 0 else cursor.fetchall()
        columns = [d[0] for d in cursor.description or []]
        return columns, [tuple(r) for r in rows]
    except TrinoQueryError as exc:
        raise QueryError(f"trino: {exc.error_name}: {exc.message}") from None
    except (TrinoAuthError, HttpError) as exc:
        raise QueryError(
            f"Trino at {target.uri} refused the request ({type(exc).__name__}: {exc}) — fix: check the user "
            f"(--trino-user / {USER_ENV}) and {PASSWORD_ENV}"
        ) from None
    except (TrinoConnectionError, OSError) as exc:  # the client gives up after its retries
        raise QueryError(
            f"no Trino answers at {target.uri} ({type(exc).__name__}) — fix: start the stack's "
            f"(lakestream stack up --trino) or name yours with --trino-uri / {URI_ENV}"
        ) from None
    finally:
        conn.close()
