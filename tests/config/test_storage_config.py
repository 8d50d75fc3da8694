"""The `storage` section and REST catalog settings: errors name the field and the fix; secrets are
read from the variables named, never from the file, and never shown."""

from __future__ import annotations

import pytest

from lakestream.config import parse_config, redact
from lakestream.errors import ConfigError
from lakestream.runtime.spark import catalog_conf
from lakestream.storage import S3Options, iceberg_io_properties, pyiceberg_io_properties

BASE = {"kafka": {"bootstrap_servers": "127.0.0.1:9092"}, "streams": [{"topics": ["t"]}]}
JDBC_S3 = {"uri": "jdbc:postgresql://db:5432/lake", "warehouse": "s3://bucket/warehouse"}
STORAGE = {
    "endpoint": "http://127.0.0.1:9000",
    "region": "eu-west-1",
    "path_style": True,
    "access_key_id_env": "TEST_S3_KEY",
    "secret_access_key_env": "TEST_S3_SECRET",
}


def config(catalog=None, storage=None, **extra):
    data = {**BASE, "catalog": catalog or JDBC_S3, **extra}
    if storage is not None:
        data["storage"] = storage
    return parse_config(data)


def test_s3_warehouse_without_storage_names_the_fix():
    with pytest.raises(ConfigError, match=r"warehouse is on object storage \(s3://\).*fix: add storage: \{region"):
        config()


@pytest.mark.parametrize(
    "storage, message",
    [
        (
            {"region": "r", "endpoint": "127.0.0.1:9000"},
            r"storage\.endpoint: .* is not an http\(s\)://host\[:port\] URL",
        ),
        ({"endpoint": "http://x:9000"}, r"storage\.region: Field required — fix: add it"),
        ({"region": "r", "access_key_id_env": "K"}, r"access_key_id_env and secret_access_key_env go together"),
        (
            {"region": "r", "access_key_id_env": "AKIAIOSFODNN7EXAMPLE/x", "secret_access_key_env": "S"},
            r"is not an environment variable name — fix: give the variable's name, not its value",
        ),
        ({"region": "r", "secret_key": "x"}, r"storage\.secret_key: Extra inputs are not permitted — fix: remove it"),
    ],
)
def test_bad_storage_settings_name_the_field(storage, message):
    with pytest.raises(ConfigError, match=message):
        config(storage=storage)


def test_unsupported_object_store_scheme():
    with pytest.raises(ConfigError, match=r"gs:// is not supported yet — fix: an s3:// warehouse"):
        config(catalog={**JDBC_S3, "warehouse": "gs://b/w"})


def test_credentials_come_from_the_named_variables_and_are_never_shown(monkeypatch):
    monkeypatch.setenv("TEST_S3_KEY", "AKIDEXAMPLE")
    monkeypatch.setenv("TEST_S3_SECRET", "wJalrXUtnFEMI-secret")
    cfg = config(storage=STORAGE)
    assert cfg.catalog.storage is cfg.storage
    io = iceberg_io_properties(cfg.catalog)
    assert io["io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO" and io["s3.endpoint"] == "http://127.0.0.1:9000"
    assert io["s3.path-style-access"] == "true" and io["client.region"] == "eu-west-1"
    assert io["s3.secret-access-key"] == "wJalrXUtnFEMI-secret"
    assert pyiceberg_io_properties(cfg.catalog)["s3.force-virtual-addressing"] == "false"
    spark = catalog_conf(cfg.catalog)
    assert spark["spark.sql.catalog.lake.io-impl"].endswith("S3FileIO")
    for shown in (
        repr(cfg),
        str(cfg.storage.credentials),
        repr(S3Options.from_settings(cfg.storage)),
        str(redact(spark)),
    ):
        assert "wJalrXUtnFEMI-secret" not in shown and "AKIDEXAMPLE" not in shown, shown


def test_a_named_variable_that_is_unset_fails_when_first_needed(monkeypatch):
    monkeypatch.delenv("TEST_S3_KEY", raising=False)
    cfg = config(storage=STORAGE)  # loading never needs them: `lakestream capture` does not touch storage
    with pytest.raises(ConfigError, match="storage.access_key_id_env: environment variable TEST_S3_KEY is not set"):
        iceberg_io_properties(cfg.catalog)


def test_default_chain_when_no_variables_are_named():
    cfg = config(storage={"region": "us-east-1"})
    io = iceberg_io_properties(cfg.catalog)
    assert "s3.access-key-id" not in io and "s3.endpoint" not in io


def test_rest_catalog_settings(monkeypatch):
    monkeypatch.setenv("TEST_REST_CREDENTIAL", "client:secret-value")
    cfg = config(
        catalog={
            "type": "rest",
            "uri": "https://catalog.example.com/api/catalog",
            "warehouse": "prod",
            "credential_env": "TEST_REST_CREDENTIAL",
            "vended_credentials": True,
        }
    )
    spark = catalog_conf(cfg.catalog)
    assert spark["spark.sql.catalog.lake.type"] == "rest"
    assert spark["spark.sql.catalog.lake.credential"] == "client:secret-value"
    assert (
        spark["spark.sql.catalog.lake.oauth2-server-uri"] == "https://catalog.example.com/api/catalog/v1/oauth/tokens"
    )
    assert spark["spark.sql.catalog.lake.header.X-Iceberg-Access-Delegation"] == "vended-credentials"
    assert "secret-value" not in str(redact(spark))


def test_a_private_ca_reaches_the_jvm_rest_client(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    cfg = config(
        catalog={"type": "rest", "uri": "https://catalog.internal:8181", "warehouse": "w", "ssl_ca_bundle": str(bundle)}
    )
    spark = catalog_conf(cfg.catalog)
    assert spark["spark.sql.catalog.lake.rest.client.tls.configurer-impl"] == "lakestream.LakestreamTlsConfigurer"
    assert spark["spark.sql.catalog.lake.lakestream.ssl-ca-bundle"] == str(bundle)


@pytest.mark.parametrize(
    "catalog, message",
    [
        ({"type": "rest", "uri": "catalog:8181", "warehouse": "w"}, r"is not an http\(s\) URL — fix: the REST catalog"),
        (
            {"type": "jdbc", "uri": "jdbc:postgresql://h/d", "warehouse": "file:///w", "token_env": "T"},
            r"catalog\.token_env applies to a REST catalog only — fix",
        ),
        ({"type": "rest", "uri": "http://h", "warehouse": "w", "token_env": "T", "credential_env": "C"}, r"give one"),
        (
            {"type": "rest", "uri": "https://h", "warehouse": "w", "ssl_ca_bundle": "/nonexistent/ca.pem"},
            r"catalog\.ssl_ca_bundle: '/nonexistent/ca\.pem' is not a readable file — fix",
        ),
        (
            {"type": "rest", "uri": "http://h", "warehouse": "w", "ssl_ca_bundle": "/etc/hostname"},
            r"catalog\.ssl_ca_bundle is set but catalog\.uri is not https — fix",
        ),
    ],
)
def test_bad_rest_settings_name_the_field(catalog, message):
    with pytest.raises(ConfigError, match=message):
        config(catalog=catalog)


def test_spark_jars_are_listed_in_extra_jars():
    with pytest.raises(ConfigError, match=r"spark\.conf: .*spark\.extra_jars"):
        config(
            catalog={"uri": "jdbc:postgresql://h/d", "warehouse": "file:///w"}, spark={"conf": {"spark.jars": "/x.jar"}}
        )
