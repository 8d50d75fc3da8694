"""Debezium connector properties derived from the typed capture settings.

One function builds the properties for the embedded engine lakestream runs; another renders the
same connector as Kafka Connect REST JSON for users who run their own Connect cluster, after the
same start check (`prepared_connect_json`). What differs between PostgreSQL and MariaDB lives in
`lakestream.capture.databases`; converters, offsets and topic renames are shared here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lakestream.capture.databases import capture_database
from lakestream.capture.databases.postgresql import CONNECTOR_CLASS, HEARTBEAT_MESSAGE_PREFIX  # noqa: F401
from lakestream.config import CaptureSettings, KafkaSettings
from lakestream.errors import ConfigError

JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
SCHEMA_CACHING_JSON_CONVERTER = "lakestream.capture.SchemaCachingJsonConverter"
ATOMIC_FILE_OFFSET_STORE = "lakestream.capture.AtomicFileOffsetBackingStore"
AVRO_CONVERTER = "io.confluent.connect.avro.AvroConverter"
APICURIO_AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
# The tail of Apicurio Registry's Confluent-compatible URL, and of its own API that its converter speaks.
APICURIO_CCOMPAT_SUFFIX = "/apis/ccompat/v7"
APICURIO_API_SUFFIX = "/apis/registry/v2"
# Where a Connect worker's FileConfigProvider reads the secrets a printed configuration refers to
# (`lakestream capture --print-connector-config --connect-secrets-file PATH` names another file).
DEFAULT_SECRETS_FILE = "/opt/kafka/secrets/lakestream.properties"

# Throughput settings that STACK.md measured as useful: bigger batches per handler call mean
# fewer Python↔Java crossings and fewer Kafka flushes per event.
_PERFORMANCE_DEFAULTS = {
    "max.batch.size": "8192",
    "max.queue.size": "32768",
    "poll.interval.ms": "100",
}

# Keys that only make sense inside the embedded engine (a Connect worker manages these itself).
_EMBEDDED_ONLY_PREFIXES = ("offset.storage", "offset.flush", "name")


def secret_placeholder(secrets_file: str, key: str) -> str:
    """A reference the worker's FileConfigProvider (``config.providers=file``) resolves to ``key`` of the
    properties file ``secrets_file`` on the worker, when it starts the connector."""
    return f"${{file:{secrets_file}:{key}}}"


def password_note(secrets_file: str) -> str:
    return (
        f"database.password is a placeholder: on every Connect worker, set config.providers=file and "
        f"config.providers.file.class=org.apache.kafka.common.config.provider.FileConfigProvider, and put "
        f"database.password=<the password> in {secrets_file} (readable by the worker only); or replace the "
        f"value before posting."
    )


def offsets_file(state_dir: Path, capture: CaptureSettings) -> Path:
    """Where the embedded engine stores its source offsets (the replication position)."""
    return Path(state_dir) / "capture" / f"{capture.slot_name}.offsets"


def _connector_name(capture: CaptureSettings) -> str:
    return capture_database(capture).connector_name(capture)


def _debezium_settings(capture: CaptureSettings) -> dict[str, str]:
    """The connector's own settings (its kind's, `lakestream.capture.databases`), shared by the embedded engine
    and a Connect cluster."""
    return {**capture_database(capture).debezium_settings(capture), **_PERFORMANCE_DEFAULTS}


def _converter_settings(
    capture: CaptureSettings, secrets: bool, secrets_file: str = DEFAULT_SECRETS_FILE
) -> dict[str, str]:
    """key/value converter settings: JsonConverter, or Confluent's AvroConverter and its registry.

    Without ``secrets`` the registry's basic-auth user info is a config-provider placeholder into
    ``secrets_file``."""
    if capture.format == "json":
        schemas = "true" if capture.schemas_enabled else "false"
        return {
            "key.converter": JSON_CONVERTER,
            "value.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": schemas,
            "value.converter.schemas.enable": schemas,
            # JsonConverter writes a column's default in place of an explicit NULL unless told not
            # to (KAFKA-8713): a row inserted with NULL would reach the mirror holding the default.
            "key.converter.replace.null.with.default": "false",
            "value.converter.replace.null.with.default": "false",
        }
    registry = capture.schema_registry
    assert registry is not None  # the config model fills it in for format avro
    if capture.avro_converter == "apicurio":
        return _apicurio_converter_settings(capture, secrets, secrets_file)
    settings = {"schema.registry.url": registry.url}
    if registry.basic_auth_user_info_env:
        settings["basic.auth.credentials.source"] = "USER_INFO"
        settings["basic.auth.user.info"] = (
            registry.client_config("capture.schema_registry")["basic.auth.user.info"]
            if secrets
            else secret_placeholder(secrets_file, "schema.registry.user.info")
        )
    if registry.ssl_ca_location:
        # The Java client reads a PEM trust store directly (not exercised by the tests here).
        settings["schema.registry.ssl.truststore.location"] = registry.ssl_ca_location
        settings["schema.registry.ssl.truststore.type"] = "PEM"
    props = {"key.converter": AVRO_CONVERTER, "value.converter": AVRO_CONVERTER}
    for side in ("key", "value"):
        props.update({f"{side}.converter.{k}": v for k, v in settings.items()})
    return props


def _apicurio_converter_settings(capture: CaptureSettings, secrets: bool, secrets_file: str) -> dict[str, str]:
    """Apicurio's AvroConverter in Confluent's wire format (a zero byte, a 4-byte id, the Avro body): the id is
    the schema's content id, which is the id Apicurio's Confluent-compatible API serves under /schemas/ids/, so
    the pipeline decodes these records as it decodes Confluent's."""
    registry = capture.schema_registry
    assert registry is not None
    url = registry.url.rstrip("/")
    if not url.endswith(APICURIO_CCOMPAT_SUFFIX):
        raise ConfigError(
            f"capture.avro_converter apicurio: the schema registry URL {registry.url!r} is not Apicurio Registry's "
            f"Confluent-compatible API — fix: give its URL ending in {APICURIO_CCOMPAT_SUFFIX} (the pipeline reads "
            "schemas there; the converter uses the registry's own API beside it)"
        )
    settings = {
        "apicurio.registry.url": url[: -len(APICURIO_CCOMPAT_SUFFIX)] + APICURIO_API_SUFFIX,
        "apicurio.registry.auto-register": "true",
        "apicurio.registry.find-latest": "true",
        "apicurio.registry.as-confluent": "true",  # a 4-byte id, not Apicurio's 8-byte one
        "apicurio.registry.use-id": "contentId",
        "apicurio.registry.headers.enabled": "false",  # the id in the record's bytes, not in a header
    }
    if registry.basic_auth_user_info_env:
        if secrets:
            user, _, password = registry.client_config("capture.schema_registry")["basic.auth.user.info"].partition(":")
        else:
            user = secret_placeholder(secrets_file, "schema.registry.username")
            password = secret_placeholder(secrets_file, "schema.registry.password")
        settings["apicurio.auth.username"] = user
        settings["apicurio.auth.password"] = password
    props = {"key.converter": APICURIO_AVRO_CONVERTER, "value.converter": APICURIO_AVRO_CONVERTER}
    for side in ("key", "value"):
        props.update({f"{side}.converter.{k}": v for k, v in settings.items()})
    return props


def connector_properties(capture: CaptureSettings, state_dir: Path) -> dict[str, str]:
    """Properties for Debezium's embedded engine, under Debezium's own names.

    ``capture.connector`` is applied last, so any Debezium option can override a derived one.
    """
    props = {
        "name": _connector_name(capture),
        **_debezium_settings(capture),
        # The engine's output format already implies JsonConverter; only Avro names its converter.
        **{
            k: v
            for k, v in _converter_settings(capture, secrets=True).items()
            if capture.format == "avro" or not k.endswith(".converter")
        },
        # With schemas: the same bytes, each table's schema rendered once (CaptureBatchConsumer's jar).
        **(
            {f"{side}.converter.class": SCHEMA_CACHING_JSON_CONVERTER for side in ("key", "value")}
            if capture.format == "json" and capture.schemas_enabled
            else {}
        ),
        # What only the embedded engine adds (PostgreSQL: the publication lakestream checked; MariaDB: the schema
        # history file).
        **capture_database(capture).embedded_settings(capture, state_dir),
        # Kafka's FileOffsetBackingStore with the file replaced in one rename, and a damaged file refused (capture
        # jar): Kafka's own rewrites it in place and reads a file cut short by a kill as no offsets at all.
        "offset.storage": ATOMIC_FILE_OFFSET_STORE,
        "offset.storage.file.filename": str(offsets_file(state_dir, capture).resolve()),
        # Offsets are only marked processed after Kafka acknowledged the batch; flushing them
        # often keeps the number of events replayed after a crash small.
        "offset.flush.interval.ms": "1000",
    }
    props.update({str(k): str(v) for k, v in capture.connector.items()})
    return props


def _topic_renames(capture: CaptureSettings, user_transforms: str | None) -> dict[str, str]:
    """RegexRouter transforms giving a table whose Debezium topic differs from lakestream's (a dot inside a
    name) the topic lakestream reads, as the embedded capture's publisher does; the user's own
    ``transforms`` run after them."""
    renames = {t.debezium_topic(capture.topic_prefix): t.topic(capture.topic_prefix) for t in capture.source_tables}
    renames = {d: t for d, t in sorted(renames.items()) if d != t}
    if not renames:
        return {}
    out: dict[str, str] = {}
    names = []
    for i, (debezium_topic, topic) in enumerate(renames.items()):
        name = f"lakestreamTopic{i}"
        names.append(name)
        # Topics hold only letters, digits, '.', '_' and '-': nothing to escape inside \Q...\E or in the
        # replacement.
        out.update(
            {
                f"transforms.{name}.type": "org.apache.kafka.connect.transforms.RegexRouter",
                f"transforms.{name}.regex": f"\\Q{debezium_topic}\\E",
                f"transforms.{name}.replacement": topic,
            }
        )
    out["transforms"] = ",".join(names + ([user_transforms] if user_transforms else []))
    return out


def connect_json(
    capture: CaptureSettings,
    publication_checked: bool = False,
    secrets_file: str = DEFAULT_SECRETS_FILE,
    kafka: KafkaSettings | None = None,
) -> dict[str, Any]:
    """The same connector as Kafka Connect REST JSON (``POST /connectors``), password not included.

    The password is a ``${file:<secrets_file>:database.password}`` config-provider placeholder: put the real
    value in that file on the Connect workers (with ``config.providers=file``), or replace it before posting.
    ``publication_checked``: the publication was prepared and checked (`prepared_connect_json`), so
    Debezium only uses it, as under `lakestream capture`; otherwise Debezium's ``filtered`` mode creates it.
    ``kafka``: the pipeline's Kafka, where a MariaDB connector keeps its schema history topic.
    """
    config = _debezium_settings(capture)
    config.update(_converter_settings(capture, secrets=False, secrets_file=secrets_file))
    config.update(capture_database(capture).connect_settings(capture, kafka))
    if publication_checked and capture.database.kind == "postgresql":
        config["publication.autocreate.mode"] = "disabled"
    for key, value in capture.connector.items():
        if not str(key).startswith(_EMBEDDED_ONLY_PREFIXES):
            config[str(key)] = str(value)
    config.update(_topic_renames(capture, config.get("transforms")))
    if capture.database.password or "database.password" in config:
        config["database.password"] = secret_placeholder(secrets_file, "database.password")
    if capture.snapshot == "parallel":
        # The rows come from `lakestream snapshot`; the connector must start at its handover point, which
        # it can only be given while stopped (Kafka Connect 3.7+: initial_state, then PATCH .../offsets).
        config["snapshot.mode"] = "no_data"
        return {"name": _connector_name(capture), "config": config, "initial_state": "STOPPED"}
    return {"name": _connector_name(capture), "config": config}


def prepared_connect_json(
    capture: CaptureSettings, secrets_file: str = DEFAULT_SECRETS_FILE, kafka: KafkaSettings | None = None
) -> dict[str, Any]:
    """`connect_json` after what `lakestream capture` does before Debezium starts: its kind's start check
    (`CaptureDatabase.prepare`; for PostgreSQL the publication made to cover every table when lakestream manages
    it, and the check that every table will publish its changes, `lakestream.capture.publication`); CaptureError
    with the reason and the fix otherwise.

    A Connect cluster runs the connector without lakestream: the check holds for the database as it is now; a
    later change to it (a publication changed, a grant revoked) is not checked again."""
    import psycopg2

    from lakestream.errors import CaptureError

    try:
        capture_database(capture).prepare(capture)
    except psycopg2.OperationalError as exc:
        raise CaptureError(
            f"cannot reach the source database to check the publication: {str(exc).strip()[:300]} — "
            "fix: make capture.database reachable from here, or pass --skip-publication-check (then "
            "check the publication yourself; see docs/design/capture.md)"
        ) from None
    return connect_json(capture, publication_checked=True, secrets_file=secrets_file, kafka=kafka)


def connect_offsets_json(capture: CaptureSettings, lsn: int) -> dict[str, Any]:
    """The body of ``PATCH /connectors/<name>/offsets`` that starts the connector at ``lsn``."""
    return {"offsets": [{"partition": {"server": capture.topic_prefix}, "offset": {"lsn": lsn}}]}
