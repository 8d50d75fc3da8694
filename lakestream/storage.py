"""Object storage: the pipeline's ``storage`` settings as each reader and writer takes them.

One `StorageSettings` (config ``storage:``) becomes, for each client of the files:

- Spark and the Java committer: Iceberg ``S3FileIO`` catalog properties (`iceberg_io_properties`);
- the write tasks and every pyarrow read or write on the driver: an ``S3FileSystem`` (`filesystem_path`),
  configured from `S3Options`, a small picklable copy that travels to the executors inside the write
  job's context (`active_options` is its default there);
- pyiceberg: its ``s3.*`` FileIO properties (`pyiceberg_io_properties`);
- DuckDB: the ``httpfs`` extension and an S3 secret (`configure_duckdb`).

Credentials come from the environment variables the settings name (read once, at load) or from the
default AWS chain; they are never logged: `S3Options` and `S3Credentials` print as ``***``.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakestream.config import OBJECT_STORE_SCHEMES, CatalogSettings, StorageSettings
from lakestream.errors import ConfigError

if TYPE_CHECKING:
    import duckdb
    import pyarrow.fs as pafs

log = logging.getLogger(__name__)


def is_object_store(location: str) -> bool:
    """Whether ``location`` (a warehouse, table or file URI) is on object storage (``s3://`` and kin)."""
    return location.startswith(OBJECT_STORE_SCHEMES)


def lists_through_file_io(location: str) -> bool:
    """Whether files under ``location`` must be listed through Iceberg's FileIO (prefix listing) rather
    than a Hadoop FileSystem: object stores, for which no Hadoop FileSystem (``s3a``) is on the class path."""
    return is_object_store(location)


# -- what travels to the executors ---------------------------------------------------------------------


@dataclass(frozen=True)
class S3Options:
    """How pyarrow reaches the store: the resolved, picklable form of `StorageSettings` (with the static
    credentials, or None for the default AWS chain on each executor)."""

    region: str
    endpoint: str | None = None
    path_style: bool = False
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, storage: StorageSettings) -> S3Options:
        creds = storage.credentials
        return cls(
            region=storage.region,
            endpoint=storage.endpoint,
            path_style=storage.path_style,
            access_key=creds.access_key_id if creds else None,
            secret_key=creds.secret_access_key.get_secret_value() if creds else None,
            session_token=creds.session_token.get_secret_value() if creds and creds.session_token else None,
        )

    def with_vended(self, properties: dict[str, str]) -> S3Options:
        """These options with the credentials a REST catalog vended for one table (its FileIO properties)."""
        key, secret = properties.get("s3.access-key-id"), properties.get("s3.secret-access-key")
        if not key or not secret:
            return self
        return S3Options(
            region=properties.get("client.region", self.region),
            endpoint=properties.get("s3.endpoint", self.endpoint),
            path_style=properties.get("s3.path-style-access", str(self.path_style)).lower() == "true",
            access_key=key,
            secret_key=secret,
            session_token=properties.get("s3.session-token"),
        )


@dataclass(frozen=True)
class StorageContext:
    """A process's object storage: the ``storage`` settings, and the credentials a REST catalog vended per
    table location (longest prefix wins). Picklable; it travels to the executors in each job's context."""

    options: S3Options | None = None
    vended: tuple[tuple[str, S3Options], ...] = ()

    def options_for(self, uri: str) -> S3Options | None:
        for location, options in self.vended:
            if uri.startswith(location):
                return options
        return self.options


_lock = threading.Lock()
_context = StorageContext()
_filesystems: dict[S3Options | None, pafs.S3FileSystem] = {}


# The AWS SDK for Java (2.30+, as in Iceberg's AWS bundle) sends uploads aws-chunked with a trailing CRC
# checksum by default, as pyarrow's does (`new_s3_filesystem`); S3-compatible stores that do not decode that
# framing fail some of them ("missing CRLF terminator on aws-chunked frame", nanio 0.1.7). With an endpoint
# the JVMs compute checksums only where S3 requires them, as every SDK did before 2025.
JVM_CHECKSUM_OPTIONS = (
    "-Daws.requestChecksumCalculation=WHEN_REQUIRED",
    "-Daws.responseChecksumValidation=WHEN_REQUIRED",
)


def jvm_options(storage: StorageSettings | None) -> list[str]:
    """JVM system properties the AWS SDK needs for ``storage`` (an S3-compatible endpoint: no aws-chunked)."""
    return list(JVM_CHECKSUM_OPTIONS) if storage is not None and storage.endpoint else []


def activate(storage: StorageSettings | None) -> None:
    """Make ``storage`` this process's object storage (the driver: set when its Spark session is built and
    when a pipeline starts). The write jobs' contexts take it from here to the executors."""
    global _context
    _context = StorageContext(S3Options.from_settings(storage) if storage is not None else None)


def remember_vended(location: str, properties: dict[str, str]) -> None:
    """Use the credentials a REST catalog vended for the table at ``location`` for its files (the driver,
    whenever it loads the table; the executors get them with the next job)."""
    global _context
    base = _context.options or S3Options(region=properties.get("client.region", "us-east-1"))
    options = base.with_vended(properties)
    prefix = location.rstrip("/") + "/"
    vended = [(loc, opts) for loc, opts in _context.vended if loc != prefix] + [(prefix, options)]
    _context = StorageContext(_context.options, tuple(sorted(vended, key=lambda item: -len(item[0]))))


def use_options(context: StorageContext | None) -> None:
    """Make ``context`` this process's object storage (an executor: the one its task's context carries)."""
    global _context
    _context = context or StorageContext()


def active_options() -> StorageContext:
    """This process's object storage (options None: the default AWS chain and region lookup)."""
    return _context


def s3_filesystem(options: S3Options | None = None) -> pafs.S3FileSystem:
    """A pyarrow ``S3FileSystem`` for ``options`` (default: this process's), one per distinct options."""
    options = options if options is not None else _context.options
    with _lock:
        fs = _filesystems.get(options)  # type: ignore[arg-type]
        if fs is None:
            fs = _filesystems[options] = new_s3_filesystem(options)  # type: ignore[index]
        return fs


def new_s3_filesystem(options: S3Options | None, attempts: int = 5) -> pafs.S3FileSystem:
    """A new pyarrow ``S3FileSystem`` for ``options`` (None: the default AWS chain, region lookup)."""
    import pyarrow.fs as pafs

    if options is None:
        return pafs.S3FileSystem(retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts))
    if options.endpoint:
        # pyarrow's AWS SDK (C++, 2025+) sends every upload aws-chunked with a trailing CRC checksum
        # by default; S3-compatible stores that do not decode that framing (nanio 0.1.7) store it inside
        # the object. Checksums only where S3 requires them, as every SDK did before 2025: plain bodies,
        # still signed. Read when the client is created.
        os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")
    scheme = "http" if options.endpoint and options.endpoint.startswith("http://") else "https"
    host = options.endpoint.split("://", 1)[1] if options.endpoint else None
    return pafs.S3FileSystem(
        access_key=options.access_key,
        secret_key=options.secret_key,
        session_token=options.session_token,
        region=options.region,
        endpoint_override=host,
        scheme=scheme,
        # pyarrow puts the bucket in the path whenever an endpoint is given; for Amazon S3 itself (no
        # endpoint) virtual hosts are the norm, and path style is not offered.
        force_virtual_addressing=bool(host) and not options.path_style,
        connect_timeout=5,
        request_timeout=60,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
    )


def ensure_dir(fs: Any, path: str) -> None:
    """Create directory ``path`` on a local file system. Object stores have no directories (a key prefix
    exists once an object under it does), and some S3-compatible stores refuse the marker objects a
    directory would be written as: nothing is created there."""
    import pyarrow.fs as pafs

    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path, recursive=True)


def filesystem_path(uri: str, options: S3Options | None = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and in-filesystem path of a table file URI or plain path: local files, or
    ``s3://``/``s3a://``/``s3n://`` through this process's (or ``options``') object storage."""
    import pyarrow.fs as pafs

    if uri.startswith("file:"):
        rest = uri[len("file:") :]
        if rest.startswith("//") and not rest.startswith("///"):
            raise ValueError(f"file URI with a host is not supported: {uri}")
        return pafs.LocalFileSystem(), "/" + rest.lstrip("/")
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    if is_object_store(uri):
        return s3_filesystem(options or _context.options_for(uri)), uri.split("://", 1)[1]
    return pafs.FileSystem.from_uri(uri)


# -- Iceberg (JVM), pyiceberg, DuckDB -------------------------------------------------------------------


def iceberg_io_properties(catalog: CatalogSettings) -> dict[str, str]:
    """Catalog properties that make Iceberg's FileIO reach the catalog's object storage (``S3FileIO``).
    Empty without a ``storage`` section (Hadoop's FileIO on a file system, or what a REST catalog sends)."""
    storage = catalog.storage
    if storage is None:
        return {}
    props = {
        "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        "client.region": storage.region,
        "s3.path-style-access": str(storage.path_style).lower(),
    }
    if storage.endpoint:
        props["s3.endpoint"] = storage.endpoint
    return props | _static_keys(catalog)


def _static_keys(catalog: CatalogSettings) -> dict[str, str]:
    """The ``s3.*`` keys of the configured credentials (none when the catalog vends them, or for the AWS chain)."""
    creds = catalog.storage.credentials if catalog.storage is not None else None
    if creds is None or catalog.vended_credentials:
        return {}
    keys = {"s3.access-key-id": creds.access_key_id, "s3.secret-access-key": creds.secret_access_key.get_secret_value()}
    if creds.session_token is not None:
        keys["s3.session-token"] = creds.session_token.get_secret_value()
    return keys


def pyiceberg_io_properties(catalog: CatalogSettings) -> dict[str, str]:
    """pyiceberg FileIO properties (``s3.*``) for the catalog's object storage."""
    storage = catalog.storage
    if storage is None:
        return {}
    props = {"s3.region": storage.region}
    if storage.endpoint:
        props["s3.endpoint"] = storage.endpoint
        props["s3.force-virtual-addressing"] = str(not storage.path_style).lower()
    return props | _static_keys(catalog)


def configure_duckdb(
    con: duckdb.DuckDBPyConnection,
    catalog: CatalogSettings,
    vended: dict[str, str] | None = None,
    scope: str | None = None,
) -> None:
    """Load DuckDB's ``httpfs`` (from its PyPI wheel) and create the S3 secret for the catalog's object
    storage. ``vended``: a table's FileIO properties from a REST catalog, whose credentials win, for the
    files under ``scope`` (the table's location) only."""
    storage = catalog.storage
    vended = vended or {}
    if storage is None and "s3.access-key-id" not in vended:
        return
    from lakestream.duckdb_extensions import load_duckdb_extension

    load_duckdb_extension(con, "httpfs")
    base = (
        S3Options.from_settings(storage)
        if storage is not None
        else S3Options(region=vended.get("client.region", "us-east-1"))
    )
    options = base.with_vended(vended)
    name = "lakestream_storage"
    params: dict[str, str] = {"TYPE": "s3", "REGION": options.region}
    if options.endpoint:
        params["ENDPOINT"] = options.endpoint.split("://", 1)[1]
        params["USE_SSL"] = "true" if options.endpoint.startswith("https://") else "false"
        params["URL_STYLE"] = "path" if options.path_style else "vhost"
    if options.access_key and options.secret_key:
        params["KEY_ID"] = options.access_key
        params["SECRET"] = options.secret_key
        if options.session_token:
            params["SESSION_TOKEN"] = options.session_token
    else:
        params["PROVIDER"] = "credential_chain"
    if options is not base and scope:
        params["SCOPE"] = scope
        name = f"lakestream_table_{abs(hash(scope)):x}"
    body = ", ".join(
        f"{k} {v}" if k in ("TYPE", "PROVIDER") or v in ("true", "false") else f"{k} {_sql_literal(v)}"
        for k, v in params.items()
    )
    con.execute(f"CREATE OR REPLACE SECRET {name} ({body})")


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# -- a first look at the store, before anything starts ---------------------------------------------------


# What pyarrow's S3 client says when the endpoint does not answer (refused, timed out, no such host).
_UNREACHABLE = (
    "NETWORK_CONNECTION",
    "Couldn't connect",
    "curlCode: 7,",
    "curlCode: 28,",
    "Timeout was reached",
    "curlCode: 6,",
)


def _unreachable(message: str) -> bool:
    return any(m in message for m in _UNREACHABLE)


def storage_unreachable(catalog: CatalogSettings) -> bool:
    """Whether the warehouse's object store does not answer now (one request, no retry). A REST catalog reports
    an outage of the store behind it as a plain server error (Apache Iceberg's server: 500 "Server Error"), which
    names no cause: this tells the engine that the failure is the store's outage, to be waited out."""
    storage = catalog.storage
    if storage is None or not is_object_store(catalog.warehouse):
        return False
    import pyarrow.fs as pafs

    fs = new_s3_filesystem(S3Options.from_settings(storage), attempts=1)
    try:
        fs.get_file_info(
            pafs.FileSelector(catalog.warehouse.split("://", 1)[1].rstrip("/"), allow_not_found=True, recursive=False)
        )
    except OSError as exc:
        return _unreachable(str(exc))
    return False


def check_storage(catalog: CatalogSettings) -> None:
    """Ask the store for the warehouse's bucket once, so that settings no retry can cure (credentials the
    store refuses, a bucket that does not exist) stop the command at once with the setting to fix.

    An unreachable endpoint is not decided here: it may be an outage, which the engine waits out."""
    storage = catalog.storage
    if storage is None or not is_object_store(catalog.warehouse):
        return
    import pyarrow.fs as pafs

    # One attempt: an answer decides, and an endpoint that does not answer is not decided here.
    fs = new_s3_filesystem(S3Options.from_settings(storage), attempts=1)
    path = catalog.warehouse.split("://", 1)[1]
    bucket = path.split("/", 1)[0]
    try:
        fs.get_file_info(pafs.FileSelector(path.rstrip("/"), allow_not_found=True, recursive=False))
        bucket_missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError as exc:
        message = str(exc)
        if _unreachable(message):
            log.warning(
                "object store %s (storage.endpoint) not reachable yet (%s); the engine waits it out for up "
                "to engine.max_outage_s",
                storage.endpoint or "Amazon S3",
                message.splitlines()[0][:200],
            )
            return
        where = (
            f"the credentials in {storage.access_key_id_env}/{storage.secret_access_key_env} "
            "(storage.access_key_id_env, storage.secret_access_key_env)"
            if storage.credentials
            else "the default AWS credential chain (no storage.access_key_id_env set)"
        )
        if any(
            m in message
            for m in (
                "ACCESS_DENIED",
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "403",
                "AccessDenied",
                "INVALID_ACCESS_KEY",
                "SIGNATURE",
            )
        ):
            raise ConfigError(
                f"storage: the object store at {storage.endpoint or 'Amazon S3'} refused {where} for "
                f"bucket {bucket!r} — fix: export the right key and secret, or grant them "
                "s3:ListBucket/GetObject/PutObject/DeleteObject on it"
            ) from None
        if any(m in message for m in ("NoSuchBucket", "NO_SUCH_BUCKET", "404")):
            raise ConfigError(
                f"catalog.warehouse: bucket {bucket!r} does not exist at "
                f"{storage.endpoint or 'Amazon S3'} — fix: create it, or point the warehouse at an "
                "existing bucket"
            ) from None
        raise ConfigError(
            f"storage: reading {catalog.warehouse} failed ({message.splitlines()[0][:300]}) — fix: "
            "check storage.endpoint, storage.region and storage.path_style"
        ) from None
    if bucket_missing:
        raise ConfigError(
            f"catalog.warehouse: bucket {bucket!r} does not exist at {storage.endpoint or 'Amazon S3'} "
            "— fix: create it, or point the warehouse at an existing bucket"
        )


def canonical_location(location: str) -> str:
    """A location in the form Iceberg's HadoopFileIO (Hadoop ``Path.toString()``) gives the files it
    writes, which is how Spark-written files appear in ``<table>.files``: ``file:///x`` and
    ``file:/x`` become ``file:/x``, repeated slashes collapse; other URIs and plain paths are kept."""
    if location.startswith("file:"):
        rest = location[len("file:") :]
        if rest.startswith("//") and not rest.startswith("///"):
            raise ValueError(f"file URI with a host is not supported: {location}")
        return "file:/" + "/".join(part for part in rest.split("/") if part)
    return location
