"""DuckDB with its extensions (iceberg, avro, httpfs) loaded from their PyPI wheels, never downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lakestream.errors import QueryError
from lakestream.identifiers import ansi_string

if TYPE_CHECKING:
    import duckdb


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the iceberg and avro extensions loaded from their PyPI wheels (no download)."""
    import duckdb

    con = duckdb.connect(
        config={
            "allow_unsigned_extensions": "true",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
        }
    )
    for name in ("avro", "iceberg"):
        con.execute(f"LOAD {ansi_string(str(extension_path(name)))}")
    return con


def load_duckdb_extension(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """LOAD a DuckDB extension from its PyPI wheel (``duckdb-extension-<name>``), never downloaded."""
    con.execute(f"LOAD {ansi_string(str(extension_path(name)))}")


def extension_path(name: str) -> Path:
    import importlib

    import duckdb

    missing = f"the DuckDB {name} extension is missing: install the duckdb-extension-{name} wheel"
    try:
        package = importlib.import_module(f"duckdb_extension_{name}")
    except ModuleNotFoundError:
        raise QueryError(missing) from None
    if package.__file__ is None:  # a namespace package: a directory of that name, not the wheel
        raise QueryError(missing)
    path = Path(package.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.exists():
        raise QueryError(f"no DuckDB {name} extension for DuckDB {duckdb.__version__} at {path}: pin matching wheels")
    return path
