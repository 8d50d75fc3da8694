"""The pipeline configuration: one typed model, validated when loaded.

Every error names the offending field (``streams[0].mode``) and says how to fix it, so a bad
YAML file never reaches Spark or Kafka.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal, overload

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from lakestream.errors import ConfigError
from lakestream.identifiers import SourceTableName, validate_identifier

# Fields whose values must never be printed; used by `redact` and by the pydantic SecretStr types.
_SECRET_KEY_PATTERN = re.compile(
    r"(password|secret|sasl\.jaas|token|credential|api[._-]?key|access[._-]?key|user\.info)", re.I
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)


@overload
def _env_secret(variable: str, field: str) -> str: ...
@overload
def _env_secret(variable: None, field: str) -> None: ...
@overload
def _env_secret(variable: str | None, field: str) -> str | None: ...
def _env_secret(variable: str | None, field: str) -> str | None:
    """The value of the environment variable a ``*_env`` setting names (never logged)."""
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise ConfigError(f"{field}: environment variable {variable} is not set — fix: export it")
    return value


class SchemaRegistrySettings(_Model):
    """A Confluent-compatible Schema Registry (Avro records: magic byte 0, schema id, Avro body).

    Secrets are named by environment variable, never written in the file: ``basic_auth_user_info_env``
    holds ``user:password``, ``ssl_key_password_env`` the client key's password."""

    url: str = Field(min_length=1)
    basic_auth_user_info_env: str | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password_env: str | None = None
    timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        for url in value.split(","):
            if not re.match(r"https?://[^/\s]+", url.strip()):
                raise ValueError(f"{url.strip()!r} is not an http(s) URL — fix: e.g. http://registry:8081")
        return value

    @field_validator("basic_auth_user_info_env", "ssl_key_password_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(
                f"{value!r} is not an environment variable name — fix: give the variable's name, "
                "not its value, e.g. SCHEMA_REGISTRY_USER_INFO"
            )
        return value

    @model_validator(mode="after")
    def _key_with_cert(self) -> SchemaRegistrySettings:
        if bool(self.ssl_certificate_location) != bool(self.ssl_key_location):
            raise ValueError("ssl_certificate_location and ssl_key_location go together (client TLS certificate)")
        return self

    def client_config(self, field: str = "kafka.schema_registry") -> dict[str, Any]:
        """Settings for confluent-kafka's ``SchemaRegistryClient``, secrets read from the environment."""
        conf: dict[str, Any] = {"url": self.url, "timeout": self.timeout_s}
        user_info = _env_secret(self.basic_auth_user_info_env, f"{field}.basic_auth_user_info_env")
        if user_info is not None:
            if ":" not in user_info:
                raise ConfigError(
                    f"{field}.basic_auth_user_info_env: {self.basic_auth_user_info_env} must hold "
                    "user:password — fix: export it in that form"
                )
            conf["basic.auth.user.info"] = user_info
        for key, value in (
            ("ssl.ca.location", self.ssl_ca_location),
            ("ssl.certificate.location", self.ssl_certificate_location),
            ("ssl.key.location", self.ssl_key_location),
            ("ssl.key.password", _env_secret(self.ssl_key_password_env, f"{field}.ssl_key_password_env")),
        ):
            if value is not None:
                conf[key] = value
        return conf


# librdkafka settings that only consumers understand; passing them to a producer only earns warnings.
_CONSUMER_ONLY_KEYS = {
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.remote.assignor",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "auto.offset.reset",
    "enable.auto.commit",
    "auto.commit.interval.ms",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "isolation.level",
    "partition.assignment.strategy",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "fetch.wait.max.ms",
    "fetch.error.backoff.ms",
    "fetch.message.max.bytes",
    "max.partition.fetch.bytes",
    "check.crcs",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "coordinator.query.interval.ms",
    "consume.callback.max.messages",
    "allow.auto.create.topics",
    "client.rack",
}

# Producer settings tuned for capture (STACK.md): small linger batches events without adding visible latency.
_PRODUCER_DEFAULTS = {"linger.ms": 20, "batch.size": 524288, "compression.type": "lz4"}


class KafkaSettings(_Model):
    """Where the change events live. ``client`` is passed to librdkafka as is (SASL/SSL included)."""

    bootstrap_servers: str = Field(min_length=1)
    group_id: str = "lakestream"
    client: dict[str, Any] = Field(default_factory=dict)
    # Records in Confluent's wire format (Avro) are decoded with schemas from this registry.
    schema_registry: SchemaRegistrySettings | None = None

    @field_validator("client")
    @classmethod
    def _no_managed_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        managed = {"bootstrap.servers", "group.id", "enable.auto.commit", "enable.partition.eof"}
        clash = sorted(managed.intersection(value))
        if clash:
            raise ValueError(f"{clash} are set by lakestream; use kafka.bootstrap_servers / kafka.group_id instead")
        return value

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings for a consumer of this cluster."""
        conf: dict[str, Any] = {str(k): v for k, v in self.client.items()}
        conf["bootstrap.servers"] = self.bootstrap_servers
        conf["group.id"] = self.group_id
        conf["enable.auto.commit"] = False
        conf.update(overrides)
        return conf

    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings for an idempotent producer to this cluster (capture's, a dead-letter replay's):
        ``client`` minus consumer-only keys, with capture's batching."""
        conf: dict[str, Any] = dict(_PRODUCER_DEFAULTS)
        conf.update({str(k): v for k, v in self.client.items() if str(k) not in _CONSUMER_ONLY_KEYS})
        conf["bootstrap.servers"] = self.bootstrap_servers
        # Idempotence keeps per-partition order and drops duplicates caused by producer retries.
        conf["enable.idempotence"] = True
        conf["acks"] = "all"
        conf.update(overrides)
        return conf


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_env_name(value: str | None, example: str) -> str | None:
    if value is not None and not _ENV_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an environment variable name — fix: give the variable's name, "
            f"not its value, e.g. {example}"
        )
    return value


class S3Credentials(_Model):
    """Static S3 credentials, read from the environment variables named here when the config loads."""

    access_key_id: str
    secret_access_key: SecretStr
    session_token: SecretStr | None = None

    def __repr__(self) -> str:  # never the key id either: it names the account's user
        return "S3Credentials(***)"

    __str__ = __repr__


class StorageSettings(_Model):
    """Object storage holding the warehouse's files: Amazon S3 or an S3-compatible store.

    Applied by every reader and writer: Spark and the Java committer (Iceberg ``S3FileIO``), the write
    tasks (pyarrow ``S3FileSystem``), DuckDB (``httpfs`` with a secret) and pyiceberg. Credentials come
    from the environment variables the ``*_env`` settings name, or, with none named, from the default
    AWS chain (``AWS_ACCESS_KEY_ID``..., ``~/.aws``, an instance or pod role); never from this file."""

    endpoint: str | None = None  # http(s)://host:port of an S3-compatible store; unset: Amazon S3
    region: str = Field(min_length=1)
    path_style: bool = False  # bucket in the path (most S3-compatible stores), not in the host name
    access_key_id_env: str | None = None
    secret_access_key_env: str | None = None
    session_token_env: str | None = None

    @field_validator("endpoint")
    @classmethod
    def _http_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s]+/?", value):
            raise ValueError(
                f"{value!r} is not an http(s)://host[:port] URL — fix: e.g. http://127.0.0.1:9000, "
                "or leave it out for Amazon S3"
            )
        return value.rstrip("/") if value else value

    @field_validator("access_key_id_env", "secret_access_key_env", "session_token_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        return _check_env_name(value, "LAKE_S3_ACCESS_KEY_ID")

    @model_validator(mode="after")
    def _paired_credentials(self) -> StorageSettings:
        if bool(self.access_key_id_env) != bool(self.secret_access_key_env):
            raise ValueError(
                "access_key_id_env and secret_access_key_env go together — fix: name both variables, "
                "or neither to use the default AWS credential chain"
            )
        if self.session_token_env and not self.access_key_id_env:
            raise ValueError("session_token_env needs access_key_id_env and secret_access_key_env too")
        return self

    @property
    def credentials(self) -> S3Credentials | None:
        """The static credentials read from the variables the config names (a ConfigError naming the
        setting when one is unset), or None for the default AWS chain. Read when a command first reaches
        the store (`lakestream.storage.check_storage`), not at load: capture never needs them."""
        if not (self.access_key_id_env and self.secret_access_key_env):
            return None
        token = _env_secret(self.session_token_env, "storage.session_token_env")
        return S3Credentials(
            access_key_id=_env_secret(self.access_key_id_env, "storage.access_key_id_env"),
            secret_access_key=SecretStr(_env_secret(self.secret_access_key_env, "storage.secret_access_key_env")),
            session_token=None if token is None else SecretStr(token),
        )

    @property
    def scheme(self) -> str:
        """``http`` or ``https``: how the endpoint is reached (Amazon S3: https)."""
        return "http" if self.endpoint and self.endpoint.startswith("http://") else "https"

    @property
    def host(self) -> str | None:
        """``host:port`` of the endpoint, without the scheme."""
        return self.endpoint.split("://", 1)[1] if self.endpoint else None


# Warehouse and table locations on object storage (Iceberg's S3FileIO takes all three).
OBJECT_STORE_SCHEMES = ("s3://", "s3a://", "s3n://")


class CatalogSettings(_Model):
    """The Iceberg catalog: a JDBC catalog (PostgreSQL) by default, a REST catalog (``type: rest``), any
    Spark catalog via ``properties``.

    REST catalogs (Polaris, Lakekeeper, Nessie, Gravitino, Unity, the AWS Glue endpoint): ``uri`` is the
    catalog's base URL, ``warehouse`` the warehouse (or catalog) name it expects; secrets are named by
    environment variable: ``credential_env`` holds OAuth2 client credentials ``client_id:client_secret``
    (exchanged at ``oauth2_server_uri``, default ``<uri>/v1/oauth/tokens``), ``token_env`` a bearer token."""

    name: str = "lake"
    type: Literal["jdbc", "hadoop", "rest", "hive"] = "jdbc"
    uri: str | None = None
    user: str | None = None
    password: SecretStr | None = None
    warehouse: str = Field(min_length=1)
    properties: dict[str, str] = Field(default_factory=dict)
    credential_env: str | None = None
    token_env: str | None = None
    oauth2_server_uri: str | None = None
    scope: str | None = None
    # Ask the REST catalog for storage credentials per table (X-Iceberg-Access-Delegation: vended-credentials).
    vended_credentials: bool = False
    # A PEM bundle of the CA(s) to trust for an https REST catalog, instead of the defaults: used by Spark and the
    # Java committer (Iceberg's REST client, through lakestream's TLSConfigurer) and by pyiceberg (DuckDB reads).
    ssl_ca_bundle: str | None = None
    # The pipeline's `storage` section (set by PipelineConfig): how the catalog's FileIO reaches the files.
    _storage: StorageSettings | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return validate_identifier(value, what="catalog name")

    @field_validator("credential_env", "token_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        return _check_env_name(value, "LAKE_CATALOG_CREDENTIAL")

    @model_validator(mode="after")
    def _jdbc_needs_uri(self) -> CatalogSettings:
        if self.type in ("jdbc", "rest", "hive") and not self.uri:
            example = (
                "https://catalog.example.com/api/catalog" if self.type == "rest" else "jdbc:postgresql://host:5432/db"
            )
            raise ValueError(f"catalog.uri is required for a {self.type} catalog (e.g. {example})")
        if self.type == "rest" and not re.match(r"https?://[^/\s]+", self.uri or ""):
            raise ValueError(
                f"catalog.uri: {self.uri!r} is not an http(s) URL — fix: the REST catalog's base URL, "
                "e.g. http://127.0.0.1:8181"
            )
        rest_only = [
            f
            for f in ("credential_env", "token_env", "oauth2_server_uri", "scope", "ssl_ca_bundle")
            if getattr(self, f) is not None
        ] + (["vended_credentials"] if self.vended_credentials else [])
        if rest_only and self.type != "rest":
            raise ValueError(
                f"catalog.{rest_only[0]} applies to a REST catalog only — fix: remove it, or set catalog.type: rest"
            )
        if self.ssl_ca_bundle is not None:
            if not Path(self.ssl_ca_bundle).is_file():
                raise ValueError(
                    f"catalog.ssl_ca_bundle: {self.ssl_ca_bundle!r} is not a readable file — fix: the "
                    "path of a PEM file holding the certificate of the CA that signed the catalog's"
                )
            if not (self.uri or "").startswith("https://"):
                raise ValueError(
                    "catalog.ssl_ca_bundle is set but catalog.uri is not https — fix: use the catalog's "
                    "https:// URL, or remove ssl_ca_bundle"
                )
        if self.credential_env and self.token_env:
            raise ValueError(
                "catalog.credential_env and catalog.token_env: give one (OAuth2 client credentials, or a bearer token)"
            )
        return self

    @property
    def storage(self) -> StorageSettings | None:
        """The object storage settings (the pipeline's ``storage`` section), or None: a local file system."""
        return self._storage

    def with_storage(self, storage: StorageSettings | None) -> CatalogSettings:
        """This catalog, reaching its files through ``storage``."""
        self._storage = storage
        return self

    @property
    def oauth2_token_uri(self) -> str | None:
        """Where OAuth2 client credentials are exchanged: ``oauth2_server_uri``, else the REST spec's
        ``<uri>/v1/oauth/tokens`` (set explicitly: Iceberg's clients deprecate finding it themselves)."""
        if self.oauth2_server_uri:
            return self.oauth2_server_uri
        if self.credential_env and self.uri:
            return f"{self.uri.rstrip('/')}/v1/oauth/tokens"
        return None

    def rest_client_properties(self) -> dict[str, str]:
        """Iceberg REST client properties, the same for the JVM's ``RESTCatalog`` and pyiceberg's
        ``RestCatalog``: the credential or token (from the environment), the token endpoint, the scope,
        and the request for vended credentials."""
        props: dict[str, str] = {}
        secret = self.rest_secret()
        if secret is not None:
            props[secret[0]] = secret[1]
        if self.oauth2_token_uri:
            props["oauth2-server-uri"] = self.oauth2_token_uri
        if self.scope:
            props["scope"] = self.scope
        if self.vended_credentials:
            props["header.X-Iceberg-Access-Delegation"] = "vended-credentials"
        return props

    def rest_secret(self) -> tuple[str, str] | None:
        """``("credential" | "token", value)`` read from the environment variable named, or None."""
        if self.credential_env:
            value = _env_secret(self.credential_env, "catalog.credential_env")
            if ":" not in value:
                raise ConfigError(
                    f"catalog.credential_env: {self.credential_env} must hold client_id:client_secret "
                    "— fix: export it in that form"
                )
            return "credential", value
        if self.token_env:
            return "token", _env_secret(self.token_env, "catalog.token_env")
        return None


class TableLayout(_Model):
    """How automatically created tables look: partitioning, sort order, properties."""

    partition_by: list[str] = Field(default_factory=list)
    sort_by: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)


class TableLayoutRule(TableLayout):
    """A layout for automatically created tables whose ``namespace.table`` matches ``tables`` (regex)."""

    tables: str

    @field_validator("tables")
    @classmethod
    def _valid_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc})") from exc
        return value


class ReferenceSettings(_Model):
    """A reference table a SQL transform joins (enrichment): any Iceberg table of a Spark catalog,
    ``[catalog.]namespace.table``, registered in the task's DuckDB as the view ``name``. The driver
    reads it again only when its current snapshot changes; every Python worker holds one copy, so its
    size is capped (rows before reading, bytes of the Arrow table after)."""

    name: str
    table: str
    columns: list[str] = Field(default_factory=list)  # the columns to ship (default: all)
    max_rows: int = Field(default=1_000_000, ge=1)
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        validate_identifier(value, what="reference name")
        if value.lower() == "batch":
            raise ValueError("`batch` is the view of the transform's input; name the reference otherwise")
        return value

    @field_validator("table")
    @classmethod
    def _qualified(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) not in (2, 3):
            raise ValueError(f"{value!r}: write it as [catalog.]namespace.table, e.g. lake.shop.products")
        for part in parts:
            validate_identifier(part, what="reference table name part")
        return value

    @field_validator("columns")
    @classmethod
    def _valid_columns(cls, value: list[str]) -> list[str]:
        for column in value:
            validate_identifier(column, what="reference column")
        return value


class TransformSettings(_Model):
    """A transform of a stream's table: SQL over the view ``batch`` (DuckDB) or a Python callable
    (``package.module:function``, pyarrow.Table in and out). Its output is appended to ``table``."""

    name: str
    sql: str | None = None
    python: str | None = None
    # The output table in the stream's namespace: a name or a template with the stream's placeholders.
    table: str
    layout: TableLayout = Field(default_factory=TableLayout)
    # Reference tables the SQL joins, each a DuckDB view (enrichment); `reference:` takes one.
    references: list[ReferenceSettings] = Field(default_factory=list)
    # How often the output table commits, if less often than its stream reads (default: with every
    # read). Its files wait uncommitted meanwhile; its stored offsets (where a restart reads from)
    # stay where its last commit left them, so nothing is lost in a crash.
    commit_interval_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _one_reference(cls, data: Any) -> Any:
        if isinstance(data, dict) and "reference" in data:
            data = dict(data)
            one = data.pop("reference")
            data["references"] = [*data.get("references", []), *(one if isinstance(one, list) else [one])]
        return data

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return validate_identifier(value, what="transform name")

    @field_validator("python")
    @classmethod
    def _dotted(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][\w.]*[:.][A-Za-z_]\w*", value):
            raise ValueError(f"{value!r} is not a dotted path; write it as package.module:function")
        return value

    @field_validator("table")
    @classmethod
    def _valid_template(cls, value: str) -> str:
        try:
            value.format(prefix="p", schema="s", table="t", topic="x", field="f")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"unknown placeholder {exc} in table template; use {{prefix}}, {{schema}}, {{table}} or {{topic}}"
            ) from exc
        return value

    @model_validator(mode="after")
    def _one_body(self) -> TransformSettings:
        if (self.sql is None) == (self.python is None):
            raise ValueError("give exactly one of `sql: SELECT ... FROM batch` or `python: package.module:function`")
        if self.references and self.sql is None:
            raise ValueError("references are views for a SQL transform; a Python transform cannot use them")
        names = [r.name.lower() for r in self.references]
        if len(set(names)) != len(names):
            raise ValueError(f"reference names must be unique within a transform: {names}")
        return self


class StreamSettings(_Model):
    """One routing rule: which topics, how they are written and to which table.

    Rules are tried in order; the first whose ``topics`` or ``topic_pattern`` matches a topic wins.
    """

    topics: list[str] = Field(default_factory=list)
    topic_pattern: str | None = None
    mode: Literal["upsert", "append"] = "upsert"
    format: Literal["debezium", "json"] | None = None
    namespace: str = "cdc"
    table: str = "{schema}_{table}"
    route_field: str | None = None
    route_header: str | None = None
    key_columns: list[str] = Field(default_factory=list)
    event_time_field: str | None = None
    dedupe_field: str | None = None
    layout: TableLayout = Field(default_factory=TableLayout)
    on_incompatible_type: Literal["dead_letter", "widen_to_string"] = "dead_letter"
    # A column dropped at the source: kept in the mirror (new rows get NULL) or dropped from it too.
    on_dropped_column: Literal["keep", "drop"] = "keep"
    # How often this stream's topics are read and its tables committed (default: engine.commit_interval_s).
    # Until then its records wait in Kafka: slow tables get fewer, larger files.
    commit_interval_s: float | None = Field(default=None, ge=0)
    # Derived tables written from this stream's typed changes in the same batch (lakestream.process).
    transforms: list[TransformSettings] = Field(default_factory=list)

    @field_validator("topic_pattern")
    @classmethod
    def _valid_regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression ({exc}); escape dots as \\\\.") from exc
        return value

    @field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, value: str) -> str:
        return validate_identifier(value, what="namespace")

    @field_validator("table")
    @classmethod
    def _valid_template(cls, value: str) -> str:
        try:
            value.format(prefix="p", schema="s", table="t", topic="x", field="f")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"unknown placeholder {exc} in table template; use {{prefix}}, {{schema}}, {{table}}, {{topic}} "
                "or {field}"
            ) from exc
        return value

    @model_validator(mode="after")
    def _has_topics(self) -> StreamSettings:
        if not self.topics and not self.topic_pattern:
            raise ValueError("give `topics: [..]` or `topic_pattern: <regex>`")
        if self.route_field and self.route_header:
            raise ValueError("set route_field or route_header, not both")
        if (self.route_field or self.route_header) and "{field}" not in self.table:
            raise ValueError("with route_field/route_header the table template must use {field}, e.g. table: '{field}'")
        if self.mode == "upsert" and (self.event_time_field or self.dedupe_field):
            raise ValueError("event_time_field and dedupe_field apply to mode: append only")
        if self.transforms and (self.route_field or self.route_header):
            raise ValueError(
                "transforms need one table per topic: remove route_field/route_header, or move the "
                "transforms to a stream without them"
            )
        names = [t.name for t in self.transforms]
        if len(set(names)) != len(names):
            raise ValueError(f"transform names must be unique within a stream: {names}")
        return self

    @property
    def record_format(self) -> str:
        return self.format or ("debezium" if self.mode == "upsert" else "json")

    def matches(self, topic: str) -> bool:
        if topic in self.topics:
            return True
        return bool(self.topic_pattern and re.fullmatch(self.topic_pattern, topic))


def _two_part_name(value: str, what: str) -> str:
    parts = value.split(".")
    if len(parts) != 2:
        raise ValueError(f"write the {what} as <namespace>.<table>, e.g. fraud.alerts")
    for part in parts:
        validate_identifier(part, what=f"{what} name part")
    return value


class RuleCheck(_Model):
    """One check of a rule set, evaluated for every new event of the source table:

    - ``count``: more than ``above`` events of the key with event time in [t - window_s, t];
    - ``sum``: the sum of ``field`` over those events is more than ``above``;
    - ``change``: ``field`` differs from the key's previous event (by event time);
    - ``predicate``: the DuckDB boolean expression ``sql`` over the event's columns is true.
    """

    name: str
    kind: Literal["count", "sum", "change", "predicate"]
    window_s: float | None = Field(default=None, gt=0)
    field: str | None = None
    above: float | None = None
    sql: str | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return validate_identifier(value, what="check name")

    @model_validator(mode="after")
    def _complete(self) -> RuleCheck:
        need = {
            "count": ("window_s", "above"),
            "sum": ("window_s", "above", "field"),
            "change": ("field",),
            "predicate": ("sql",),
        }[self.kind]
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            raise ValueError(f"a {self.kind} check needs {', '.join(missing)}")
        return self


class RuleSet(_Model):
    """Rules over each key's recent history in ``source`` (a table this pipeline appends to, whose rows
    carry the transform meta columns _topic, _partition, _offset). Every alert goes to ``alerts_table``
    exactly once and, keyed by its deterministic alert id, to ``alerts_topic``."""

    name: str
    source: str
    key: str
    event_time: str
    event_id: str
    checks: list[RuleCheck] = Field(min_length=1)
    alerts_table: str
    alerts_topic: str | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return validate_identifier(value, what="rule set name")

    @field_validator("source", "alerts_table")
    @classmethod
    def _two_part(cls, value: str) -> str:
        return _two_part_name(value, "table")

    @model_validator(mode="after")
    def _unique(self) -> RuleSet:
        names = [c.name for c in self.checks]
        if len(set(names)) != len(names):
            raise ValueError(f"check names must be unique within a rule set: {names}")
        if self.source == self.alerts_table:
            raise ValueError("alerts_table must differ from source")
        return self

    @property
    def history_s(self) -> float:
        """How far back a key's history matters (the longest window)."""
        return max([c.window_s or 0.0 for c in self.checks])


class WindowSettings(_Model):
    """Event-time windows per key over ``source`` (a table this pipeline appends to, whose rows carry
    _topic, _kafka_partition, _kafka_offset), upserted into ``table`` by (key, window_start).

    ``slide_s`` equal to ``size_s`` (the default) makes tumbling windows, smaller makes hopping ones.
    The watermark is the newest event time seen minus ``watermark_delay_s``; an event whose last
    window ended more than ``allowed_lateness_s`` before the watermark is a dead letter ("late")."""

    name: str
    source: str
    key: str
    event_time: str
    fields: list[str] = Field(default_factory=list)  # each gets _count, _sum, _min, _max, _avg columns
    size_s: int = Field(gt=0)
    slide_s: int | None = Field(default=None, gt=0)
    watermark_delay_s: float = Field(default=0, ge=0)
    allowed_lateness_s: float = Field(default=0, ge=0)
    table: str
    key_buckets: int | None = Field(default=None, ge=1)  # partition by bucket(n, key) instead of the key

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return validate_identifier(value, what="window name")

    @field_validator("source", "table")
    @classmethod
    def _two_part(cls, value: str) -> str:
        return _two_part_name(value, "table")

    @model_validator(mode="after")
    def _slide(self) -> WindowSettings:
        if self.slide_s is not None and (self.slide_s > self.size_s or self.size_s % self.slide_s):
            raise ValueError("slide_s must divide size_s (equal for tumbling windows, smaller for hopping ones)")
        if self.source == self.table:
            raise ValueError("table must differ from source")
        return self

    @property
    def slide(self) -> int:
        return self.slide_s or self.size_s


def _column_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class _KeyedTable(_Model):
    """A ``name`` (an SQL view name), a two-part ``table`` and its ``key`` column(s), validated."""

    _name_kind: ClassVar[str] = "name"
    name: str
    table: str
    key: list[str] = Field(min_length=1)

    @field_validator("key", mode="before")
    @classmethod
    def _as_list(cls, value: Any) -> Any:
        return _column_list(value)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return validate_identifier(value, what=cls._name_kind)

    @field_validator("table")
    @classmethod
    def _two_part(cls, value: str) -> str:
        return _two_part_name(value, "table")

    @field_validator("key")
    @classmethod
    def _valid_columns(cls, value: list[str]) -> list[str]:
        for column in value:
            validate_identifier(column, what="key column")
        return value


class DerivedInputSettings(_KeyedTable):
    """An input of a derived table: a table this pipeline writes (a mirror, usually), the view ``name``
    the SQL reads it as, and the column(s) of its rows holding the derived table's key (``key``, one
    per derived key column, in order): a row with key k contributes to the derived row k only."""

    _name_kind: ClassVar[str] = "input name"


class DerivedTableSettings(_KeyedTable):
    """A table defined by SQL (Spark SQL) over several input tables, kept current by key: after each
    batch only the rows whose key a change in any input touched are recomputed and upserted (deleted
    when the SQL no longer returns the key). The SQL must return one row per ``key``."""

    _name_kind: ClassVar[str] = "derived table name"
    sql: str = Field(min_length=1)
    inputs: list[DerivedInputSettings] = Field(min_length=1)
    # Seconds between two upserts of this table (default: every batch that touches it). Touched keys
    # wait in memory meanwhile: a restart before the upsert recomputes the whole table.
    commit_interval_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> DerivedTableSettings:
        names = [i.name.lower() for i in self.inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names must be unique: {names}")
        for i, source in enumerate(self.inputs):
            if len(source.key) != len(self.key):
                raise ValueError(
                    f"inputs[{i}].key has {len(source.key)} column(s) for the {len(self.key)} of key "
                    f"{self.key} — fix: name the input's column(s) holding the derived key, in order"
                )
            if source.table == self.table:
                raise ValueError(f"inputs[{i}].table must differ from table")
        return self


class EngineSettings(_Model):
    """The micro-batch loop."""

    commit_interval_s: float = Field(default=2.0, ge=0)
    max_records_per_batch: int = Field(default=200_000, ge=1)
    max_records_per_task: int = Field(default=100_000, ge=1)
    idle_poll_s: float = Field(default=0.5, gt=0)
    dead_letter_table: str = "lakestream.dead_letter"
    topic_refresh_s: float = Field(default=0.0, ge=0)
    table_write_parallelism: int = Field(default=4, ge=1, le=64)
    max_consecutive_failures: int = Field(default=5, ge=1)
    # A batch failing because the broker, the catalog or storage is unreachable is retried (backoff up
    # to 15 s) until the outage has lasted this long, whatever max_consecutive_failures says.
    max_outage_s: float = Field(default=900.0, ge=0)
    # A write that fails for a reason other than infrastructure is split until the records that make
    # it fail are alone (dead letters); more than this many in one batch fails the batch instead.
    max_isolations_per_batch: int = Field(default=16, ge=0)
    # `lakestream run` serves its own Prometheus /metrics here when set (0: any free port); loopback
    # unless metrics_host says otherwise.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # While a batch commits, the next batch's write job already runs (when it is due by then): the
    # commit's seconds overlap the next read instead of adding to every change's latency.
    overlap_commits: bool = True

    @field_validator("dead_letter_table")
    @classmethod
    def _two_part(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) != 2:
            raise ValueError("write it as <namespace>.<table>, e.g. lakestream.dead_letter")
        for part in parts:
            validate_identifier(part, what="dead-letter table name part")
        return value


class SparkSettings(_Model):
    """Spark settings; ``conf`` is passed through to the SparkSession builder."""

    master: str = "local[2]"
    app_name: str = "lakestream"
    driver_memory: str = "2g"
    conf: dict[str, str] = Field(default_factory=dict)
    # More jars for the driver and executors (paths or URLs); appended to the ones lakestream brings.
    extra_jars: list[str] = Field(default_factory=list)
    # Iceberg's AWS bundle (the AWS SDK v2 for S3FileIO) beside the runtime. Turn off when the cluster
    # brings its own SDK: two SDKs on one class path clash.
    bundled_aws_sdk: bool = True
    # Where the Iceberg runtime, the JDBC driver and the AWS bundle come from: "cache", the jars Maven
    # resolved into this machine's cache, given as spark.jars; or "packages", their coordinates
    # (lakestream/runtime/jars.toml) given as spark.jars.packages, resolved by Spark's Ivy (a cluster's way).
    jars_from: Literal["cache", "packages"] = "cache"
    # The JIT of a JVM started here in local mode: "c1" compiles with HotSpot's client compiler only
    # (-XX:TieredStopAtLevel=1), "tiered" is the JVM's default (C1, then C2 for hot code). "auto": c1 for
    # the JVM of `lakestream run` when it runs no Spark SQL of its own (no derived_tables or windows,
    # maintenance not inline): there it schedules tasks and commits while the Python workers do the
    # data work, and C2 spent most of its CPU compiling (docs/stack.md, "The pipeline's JIT"); tiered for
    # every other session. spark.driver.extraJavaOptions in conf comes after it and wins.
    jit: Literal["auto", "c1", "tiered"] = "auto"

    @field_validator("conf")
    @classmethod
    def _jars_by_field(cls, value: dict[str, str]) -> dict[str, str]:
        if "spark.jars" in value:
            raise ValueError("spark.jars is set by lakestream — fix: list your jars in spark.extra_jars instead")
        return value


class CompactionPolicy(_Model):
    """When a partition is compacted, and (for the pipeline's own upsert mirrors, `maintenance/compaction.py`)
    which of its files and how much per round."""

    max_files_per_partition: int = Field(default=100, ge=2)
    min_avg_file_size_ratio: float = Field(default=0.1, gt=0, le=1)
    target_file_size_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    quiet_time_s: float = Field(default=600, ge=0)
    # A file whose share of deleted rows reaches this is rewritten whatever its size (Iceberg's
    # delete-ratio-threshold); a partition whose share does is compacted.
    delete_ratio_threshold: float = Field(default=0.3, gt=0, le=1)
    # Small files are merged with files of their own size class (sizes within 4× of each other) once a class
    # has this many (Iceberg's min-input-files): a file a round wrote waits for peers instead of being
    # rewritten with every new small file.
    min_input_files: int = Field(default=4, ge=2)
    # Input bytes one round of a pipeline's own compaction rewrites (the rest waits for later rounds): the
    # rewrite shares the cores with the batches.
    max_bytes_per_round: int = Field(default=64 * 1024 * 1024, gt=0)
    # Rows of one rewritten file: its commit, between two batches, moves each row's key index entry (the same budget
    # as a pause's share, `engine.loop.COMPACTION_ROWS_PER_COMMIT`). At 1M, a 100M-row mirror's batch after such a
    # commit took 2.7-2.8 s against a 0.23 s median (bench/sustained.py). A file with 3/4 as many live rows is full:
    # never rewritten for its size.
    max_rows_per_file: int = Field(default=250_000, ge=1000)


class MaintenancePolicy(_Model):
    """Maintenance for tables whose name matches ``tables`` (a regex over namespace.table)."""

    tables: str = ".*"
    enabled: bool = True
    compaction: CompactionPolicy = Field(default_factory=CompactionPolicy)
    max_delete_files: int = Field(default=50, ge=1)
    snapshot_retention_s: float = Field(default=7 * 86400, ge=0)
    retain_last_snapshots: int = Field(default=10, ge=1)
    # Streaming commits every few seconds make ~40k snapshots a day: cap the count as well as the age
    # (below health's default 1,000-snapshot threshold). Past the cap, expiry keeps the newest half of it
    # (expiry reads every kept snapshot's manifests: not every round). None = age only.
    max_snapshots: int | None = Field(default=500, ge=1)
    orphan_min_age_s: float = Field(default=3 * 86400, ge=0)
    orphan_dry_run: bool = False
    # Iceberg merges a table's manifests itself at a commit once 100 of them are live
    # (commit.manifest.min-count-to-merge): a streaming table sits just above 100, and a rewrite there races
    # every commit. The rewrite is for tables written without those merges.
    max_manifests: int = Field(default=200, ge=2)
    # Earlier metadata JSON files a table keeps (write.metadata.previous-versions-max, where the table
    # does not set it); maintenance also deletes those written before it expired snapshots.
    metadata_previous_versions: int = Field(default=50, ge=1)


class MaintenanceSettings(_Model):
    mode: Literal["off", "inline", "separate"] = "off"
    interval_s: float = Field(default=300, gt=0)
    # remove_orphan_files lists the whole table location: run it less often than the other actions.
    orphan_interval_s: float = Field(default=6 * 3600, ge=0)
    # No inline round for this long after the pipeline starts (or restarts): it first catches up on what
    # arrived while it was down, with both cores, while its JVM is still compiling the batch path.
    start_delay_s: float = Field(default=60, ge=0)
    # After that delay the first round also waits for the batches to be back to their steady time (the previous
    # life's median batch, from the metrics log; `maintenance/settle.py`), at most this long after the start.
    # 0 with start_delay_s 0: no wait at all.
    settle_max_s: float = Field(default=180, ge=0)
    policies: list[MaintenancePolicy] = Field(default_factory=lambda: [MaintenancePolicy()])

    def policy_for(self, table: str) -> MaintenancePolicy:
        for policy in self.policies:
            if re.fullmatch(policy.tables, table):
                return policy
        return MaintenancePolicy()


class HealthThresholds(_Model):
    max_files_per_partition: int = 500
    max_snapshots: int = 1000
    max_metadata_bytes: int = 1024**3
    max_compaction_lag_s: float = 24 * 3600
    max_freshness_s: float | None = None
    max_consumer_lag: int | None = None
    max_small_file_share: float | None = None


class HealthSettings(_Model):
    thresholds: HealthThresholds = Field(default_factory=HealthThresholds)
    webhook_url: str | None = None
    metrics_port: int | None = None


# The source databases capture reads (`lakestream.capture.databases` has one module per kind) and their
# default ports.
SOURCE_KINDS = {"postgresql": 5432, "mariadb": 3306}


class SourceDatabase(_Model):
    """The database Debezium captures from: PostgreSQL (the default) or MariaDB."""

    kind: Literal["postgresql", "mariadb"] = "postgresql"
    host: str = "127.0.0.1"
    # Default: the kind's (PostgreSQL 5432, MariaDB 3306).
    port: int | None = Field(default=None, ge=1, le=65535)
    # PostgreSQL: the database of the captured tables. MariaDB: the database capture's checks connect to
    # (``capture.tables`` name each table's own database, ``<database>.<table>``).
    dbname: str
    user: str
    password: SecretStr | None = None
    # MariaDB: the replica id Debezium's binlog client registers with (``database.server.id``), unique among the
    # server's replicas and other Debezium connectors. Default: one derived from ``capture.topic_prefix``.
    server_id: int | None = Field(default=None, ge=1, le=2**32 - 1)
    # MariaDB: a zero date ('0000-00-00') in a NOT NULL DATE/DATETIME/TIMESTAMP column. debezium: Debezium's own
    # rule (1970-01-01; the start check warns); null: NULL in the mirror; dead_letter: the change is a dead letter
    # with the reason. In a nullable column a zero date is NULL in every mode.
    zero_dates: Literal["debezium", "null", "dead_letter"] = "debezium"

    @model_validator(mode="after")
    def _kind_defaults(self) -> SourceDatabase:
        if self.port is None:
            self.port = SOURCE_KINDS[self.kind]
        if self.server_id is not None and self.kind != "mariadb":
            raise ValueError(
                "server_id is the replica id of a MariaDB binlog client — fix: remove it, or set kind: mariadb"
            )
        if self.zero_dates != "debezium" and self.kind != "mariadb":
            raise ValueError(
                "zero_dates is for MariaDB's zero dates (PostgreSQL has none) — fix: remove it, or set kind: mariadb"
            )
        return self


class CaptureSettings(_Model):
    """Debezium capture of PostgreSQL or MariaDB into Kafka topics ``<topic_prefix>.<schema>.<table>`` (for
    MariaDB the schema is the table's database).

    ``connector`` holds extra Debezium properties under Debezium's own names; they override the
    ones lakestream derives, so anything Debezium supports can be set here.
    """

    database: SourceDatabase
    tables: list[str] = Field(min_length=1)
    topic_prefix: str = "lakestream"
    slot_name: str = "lakestream"
    publication_name: str = "lakestream_pub"
    snapshot_mode: str = "initial"
    # true: lakestream creates the publication, adds missing tables and sets publish_via_partition_root
    # itself (Debezium's own autocreation is turned off); false: the publication is the user's, and
    # capture only checks that it publishes every table (and refuses to start when it does not).
    manage_publication: bool = True
    # How existing rows reach the lake: Debezium's own snapshot through Kafka, or `lakestream snapshot`
    # (chunks read in parallel Spark tasks, then Debezium streams from the snapshot's exact point).
    snapshot: Literal["debezium", "parallel"] = "debezium"
    snapshot_chunk_rows: int = Field(default=250_000, ge=1)
    snapshot_parallelism: int | None = Field(default=None, ge=1)  # default: Spark's default parallelism
    schemas_enabled: bool = True
    # Debezium skips TRUNCATE by default ("t"); the mirror applies it, so nothing is skipped here.
    skipped_operations: str = "none"
    # json: Kafka Connect's JsonConverter; avro: Confluent's AvroConverter with a Schema Registry
    # (``schema_registry``, else ``kafka.schema_registry``).
    format: Literal["json", "avro"] = "json"
    schema_registry: SchemaRegistrySettings | None = None
    # Which Avro converter a printed Kafka Connect configuration names: Confluent's, or Apicurio's (its 2.x
    # converter, in Confluent's wire format through Apicurio Registry's own API; the registry URL is then
    # Apicurio's Confluent-compatible one, ``.../apis/ccompat/v7``). The embedded capture runs Confluent's.
    avro_converter: Literal["confluent", "apicurio"] = "confluent"
    connector: dict[str, str] = Field(default_factory=dict)
    # How often capture reads the captured tables' columns from the source catalog and publishes those that
    # changed (`lakestream.capture.columns`): an added or widened column reaches the mirror without waiting for
    # a row. 0 turns it off; JSON topics only (an Avro topic's readers expect registry-framed records).
    column_check_interval_s: float = Field(default=5.0, ge=0)

    @field_validator("skipped_operations")
    @classmethod
    def _operations(cls, value: str) -> str:
        value = value.replace(" ", "")
        if value != "none" and not set(value.split(",")) <= {"c", "u", "d", "t"}:
            raise ValueError(
                f"{value!r}: write 'none' or a comma-separated list of c, u, d, t "
                "(Debezium's skipped.operations), e.g. 't' to ignore TRUNCATE"
            )
        return value

    @field_validator("tables")
    @classmethod
    def _qualified(cls, value: list[str]) -> list[str]:
        # Any name PostgreSQL accepts; kept in one canonical text form so names compare as written.
        names = [str(SourceTableName.parse(name)) for name in value]
        seen: dict[str, str] = {}
        for given, name in zip(value, names, strict=True):
            if name in seen:
                raise ValueError(f"{given!r} and {seen[name]!r} name the same table — fix: list it once")
            seen[name] = given
        return names

    @property
    def source_tables(self) -> list[SourceTableName]:
        """``tables`` parsed: schema and table exactly as PostgreSQL holds them."""
        return [SourceTableName.parse(name) for name in self.tables]

    def topic(self, table: SourceTableName | str) -> str:
        """The Kafka topic of a captured table (`SourceTableName.topic`)."""
        name = table if isinstance(table, SourceTableName) else SourceTableName.parse(table)
        return name.topic(self.topic_prefix)

    @model_validator(mode="after")
    def _parallel_needs_schemas(self) -> CaptureSettings:
        if self.snapshot == "parallel" and not self.schemas_enabled:
            raise ValueError(
                "snapshot: parallel creates the tables with the column types of Debezium's schemas, "
                "which schemas_enabled: false leaves out — fix: set schemas_enabled: true, or "
                "snapshot: debezium"
            )
        return self

    @field_validator("topic_prefix", "slot_name", "publication_name")
    @classmethod
    def _simple(cls, value: str) -> str:
        return validate_identifier(value, what="name")


class PipelineConfig(_Model):
    """The whole pipeline: Kafka in, Iceberg out, Spark in between."""

    name: str = "lakestream"
    kafka: KafkaSettings
    catalog: CatalogSettings
    streams: list[StreamSettings] = Field(min_length=1)
    table_layouts: list[TableLayoutRule] = Field(default_factory=list)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    capture: CaptureSettings | None = None
    rules: list[RuleSet] = Field(default_factory=list)
    windows: list[WindowSettings] = Field(default_factory=list)
    derived_tables: list[DerivedTableSettings] = Field(default_factory=list)
    # Object storage (S3 or S3-compatible) for a warehouse or tables on s3://; unset: a file system.
    storage: StorageSettings | None = None
    state_dir: str = ".lakestream"

    @model_validator(mode="after")
    def _object_store_needs_storage(self) -> PipelineConfig:
        warehouse = self.catalog.warehouse
        if warehouse.startswith(OBJECT_STORE_SCHEMES) and self.storage is None:
            raise ValueError(
                f"catalog.warehouse is on object storage ({warehouse.split('://')[0]}://) but there is no "
                "storage section — fix: add storage: {region: <the bucket's region>} (plus endpoint: "
                "http(s)://host:port and path_style: true for an S3-compatible store, and "
                "access_key_id_env/secret_access_key_env unless the default AWS chain has credentials)"
            )
        if re.match(r"(gs|abfss?|wasbs?|oss|hdfs)://", warehouse):
            raise ValueError(
                f"catalog.warehouse: {warehouse.split('://')[0]}:// is not supported yet — fix: an s3:// "
                "warehouse (Amazon S3 or an S3-compatible store) or a file:// one"
            )
        self.catalog.with_storage(self.storage)
        return self

    @model_validator(mode="after")
    def _output_cadence(self) -> PipelineConfig:
        for i, stream in enumerate(self.streams):
            reads = self.commit_interval(stream)
            for j, t in enumerate(stream.transforms):
                if t.commit_interval_s is not None and t.commit_interval_s < reads:
                    raise ValueError(
                        f"streams[{i}].transforms[{j}].commit_interval_s ({t.commit_interval_s:g}) is shorter than "
                        f"the stream's commit interval ({reads:g} s), and the stream's topics are read only that "
                        f"often — fix: raise it to at least {reads:g}, or lower streams[{i}].commit_interval_s"
                    )
        return self

    @model_validator(mode="after")
    def _avro_needs_registry(self) -> PipelineConfig:
        capture = self.capture
        if capture is not None and capture.format == "avro" and capture.schema_registry is None:
            if self.kafka.schema_registry is None:
                raise ValueError(
                    "capture.format avro needs a Schema Registry — fix: set kafka.schema_registry.url "
                    "(or capture.schema_registry.url)"
                )
            capture.schema_registry = self.kafka.schema_registry
        return self

    @model_validator(mode="after")
    def _distinct_mirrors(self) -> PipelineConfig:
        """Two captured tables may not share a topic or a mirror under the naming rules (a topic keeps
        letters, digits, _ and -; a table template lower-cases and keeps letters, digits and _)."""
        if self.capture is None:
            return self
        from lakestream.errors import InvalidIdentifierError
        from lakestream.identifiers import table_from_template

        topics: dict[str, str] = {}
        mirrors: dict[str, str] = {}
        for name in self.capture.source_tables:
            topic = self.capture.topic(name)
            if topic in topics:
                raise ValueError(
                    f"capture.tables: {topics[topic]} and {name} both publish to topic {topic!r} "
                    "(characters other than letters, digits, _ and - become _) — fix: capture only "
                    "one of them, or rename one at the source"
                )
            topics[topic] = str(name)
            stream = next((s for s in self.streams if s.matches(topic)), None)
            if stream is None or stream.route_field or stream.route_header:
                continue  # not mirrored, or mirrored by a value of each record
            try:
                mirror = str(table_from_template(stream.namespace, stream.table, topic))
            except InvalidIdentifierError as exc:
                raise ValueError(
                    f"capture.tables: {name} (topic {topic!r}) cannot be mirrored: {exc} — fix: "
                    "change the matching stream's table template"
                ) from None
            if mirror in mirrors:
                raise ValueError(
                    f"capture.tables: {mirrors[mirror]} and {name} would both be mirrored to "
                    f"{mirror} (table names are lower-cased; characters other than letters, digits "
                    "and _ become _) — fix: route one of them elsewhere with its own stream "
                    "(topics: [..], table: ...), or capture only one"
                )
            mirrors[mirror] = str(name)
        return self

    def layout_for(self, table: str, stream: StreamSettings) -> TableLayout:
        """The layout of a new table: the first matching ``table_layouts`` rule, else the stream's."""
        for rule in self.table_layouts:
            if re.fullmatch(rule.tables, table):
                return rule
        return stream.layout

    def stream_for(self, topic: str) -> StreamSettings | None:
        """The first routing rule that claims ``topic``, or None."""
        index = self.stream_index(topic)
        return None if index is None else self.streams[index]

    def require_capture(self, what: str) -> CaptureSettings:
        """The ``capture:`` section, which ``what`` (a command) needs; a ConfigError naming the fix without one."""
        if self.capture is None:
            raise ConfigError(
                f"{what} needs a `capture:` section naming the source database and tables — fix: add "
                "capture.database and capture.tables"
            )
        return self.capture

    def stream_index(self, topic: str) -> int | None:
        """The position in ``streams`` of the first rule that claims ``topic``, or None."""
        for i, stream in enumerate(self.streams):
            if stream.matches(topic):
                return i
        return None

    def commit_interval(self, stream: StreamSettings) -> float:
        """Seconds between two reads (and commits) of ``stream``'s topics."""
        return self.engine.commit_interval_s if stream.commit_interval_s is None else stream.commit_interval_s

    @property
    def fastest_commit_interval(self) -> float:
        return min(self.commit_interval(s) for s in self.streams)


_FIX_HINTS = {
    "missing": "add it",
    "extra_forbidden": "remove it or check its spelling",
    "literal_error": "use one of the allowed values",
}


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"invalid pipeline config {source}:"]
    for err in exc.errors():
        path = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]).replace(".[", "[")
        hint = _FIX_HINTS.get(err["type"], "")
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {path or '<root>'}: {msg}" + (f" — fix: {hint}" if hint else ""))
    return "\n".join(lines)


def _expand_env(value: Any) -> Any:
    """Expand ``${VAR}`` in strings so credentials can stay out of the file."""
    if isinstance(value, str):

        def repl(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(
                    f"environment variable {name} is referenced in the config but not set — fix: export it"
                )
            return os.environ[name]

        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", repl, value)
    if isinstance(value, dict):
        return {k: _expand_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v) for v in value]
    return value


def parse_config(data: dict[str, Any], source: str = "<dict>") -> PipelineConfig:
    """Validate a config mapping; raise ConfigError naming each bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid pipeline config {source}: the top level must be a mapping")
    try:
        return PipelineConfig.model_validate(_expand_env(data))
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read pipeline config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"pipeline config {path} is not valid YAML: {exc}") from None
    return parse_config(data, str(path))


def redact(mapping: dict[str, Any]) -> dict[str, Any]:
    """A copy of a settings mapping with credential values replaced, for logs."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out[key] = redact(value)
        elif _SECRET_KEY_PATTERN.search(str(key)):
            out[key] = "***"
        else:
            out[key] = value
    return out
