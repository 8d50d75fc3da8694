"""The Trino Iceberg catalog made from a lakestream catalog (no Trino needed: `make test-engines` runs one), and
the coordinates Trino's server is assembled from."""

from __future__ import annotations

import pytest

from lakestream.config import CatalogSettings, StorageSettings
from lakestream.runtime.jars import default_groups, group
from lakestream.stack.trino import iceberg_catalog_properties


def test_a_jdbc_catalog_on_local_files_keeps_spark_s_catalog_name():
    catalog = CatalogSettings(
        name="lake", uri="jdbc:postgresql://db:5432/cat", user="u", password="pw", warehouse="file:///data/wh"
    )
    props = iceberg_catalog_properties(catalog)
    assert props["iceberg.catalog.type"] == "jdbc"
    assert props["iceberg.jdbc-catalog.catalog-name"] == "lake"  # the JDBC catalog's rows are keyed by it
    assert props["iceberg.jdbc-catalog.connection-password"] == "pw"
    # file:/ locations through Trino's native local file system, rooted at /
    assert (props["fs.native-local.enabled"], props["local.location"]) == ("true", "/")
    assert "fs.hadoop.enabled" not in props


def test_a_rest_catalog_on_s3_takes_the_credential_and_the_store(monkeypatch):
    monkeypatch.setenv("CAT_CRED", "id:secret")
    monkeypatch.setenv("KEY_ID", "AK")
    monkeypatch.setenv("KEY_SECRET", "SK")
    catalog = CatalogSettings(
        name="lake",
        type="rest",
        uri="https://cat.example.com/api/catalog",
        warehouse="prod",
        credential_env="CAT_CRED",
        scope="PRINCIPAL_ROLE:ALL",
        vended_credentials=True,
    )
    catalog.with_storage(
        StorageSettings(
            region="eu-west-1",
            endpoint="http://minio:9000",
            path_style=True,
            access_key_id_env="KEY_ID",
            secret_access_key_env="KEY_SECRET",
        )
    )
    props = iceberg_catalog_properties(catalog)
    assert props["iceberg.rest-catalog.security"] == "OAUTH2"
    assert props["iceberg.rest-catalog.oauth2.credential"] == "id:secret"
    assert props["iceberg.rest-catalog.oauth2.server-uri"] == "https://cat.example.com/api/catalog/v1/oauth/tokens"
    assert props["iceberg.rest-catalog.oauth2.scope"] == "PRINCIPAL_ROLE:ALL"
    assert props["iceberg.rest-catalog.vended-credentials-enabled"] == "true"
    assert (props["fs.native-s3.enabled"], props["s3.endpoint"], props["s3.path-style-access"]) == (
        "true",
        "http://minio:9000",
        "true",
    )
    assert (props["s3.aws-access-key"], props["s3.aws-secret-key"]) == ("AK", "SK")


def test_trino_is_assembled_from_its_modules_at_one_version():
    server, plugin = group("trino-server"), group("trino-plugin-iceberg")
    assert [c.artifact for c in server.artifacts] == ["trino-main"]
    assert [c.artifact for c in plugin.artifacts] == ["trino-iceberg"]
    # One release throughout: the modules and the BOM their dependencies' versions come from.
    versions = {c.version for c in (*server.artifacts, *plugin.artifacts)}
    assert versions == {server.bom.version} == {plugin.bom.version}, versions
    assert int(server.bom.version) >= 480  # v3 deletion vectors, initial-default, $row_id
    # What the server gives every plugin stays out of the plugin's own class path.
    assert {"io.trino:trino-spi", "io.airlift:slice", "io.opentelemetry:opentelemetry-api"} <= set(plugin.exclude)
    # ~480 MB: resolved when Trino is first used, not by every setup.
    assert server.on_demand and plugin.on_demand
    assert not {"trino-server", "trino-plugin-iceberg"} & set(default_groups())


def test_a_trino_target_names_the_field_and_the_fix(monkeypatch):
    from lakestream.errors import QueryError
    from lakestream.read.trino import STACK_URI, TrinoTarget

    for name in ("LAKESTREAM_TRINO_URI", "LAKESTREAM_TRINO_USER", "LAKESTREAM_TRINO_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    assert TrinoTarget.from_env() == TrinoTarget(STACK_URI, "lakestream", None)
    monkeypatch.setenv("LAKESTREAM_TRINO_URI", "https://trino.example.com:8443")
    monkeypatch.setenv("LAKESTREAM_TRINO_PASSWORD", "pw")
    target = TrinoTarget.from_env(user="ana")
    assert (target.uri, target.user, target.password) == ("https://trino.example.com:8443", "ana", "pw")
    assert "pw" not in repr(target)  # never in a log line
    with pytest.raises(QueryError, match=r"--trino-uri / LAKESTREAM_TRINO_URI.*fix"):
        TrinoTarget.from_env(uri="trino.example.com:8080")
    with pytest.raises(QueryError, match=r"LAKESTREAM_TRINO_PASSWORD is set but .* http://.*fix"):
        TrinoTarget.from_env(uri="http://trino.example.com:8080")


def test_a_stack_with_trino_gives_it_the_stack_catalog_and_store(tmp_path):
    from lakestream.stack import Stack, StackSettings

    stack = Stack(StackSettings(state_dir=tmp_path, storage="s3", trino=True, trino_port=18999))
    (name, props), *others = stack.trino.catalogs.items()
    assert name == "lake" and not others
    assert props["iceberg.jdbc-catalog.catalog-name"] == "lake"
    assert props["iceberg.jdbc-catalog.default-warehouse-dir"] == stack.warehouse
    assert (props["s3.endpoint"], props["s3.aws-access-key"]) == (stack.objectstore.endpoint, "lakestream")
    assert not any(k.startswith("fs.native-local") for k in props)
    assert stack.info().trino_uri == "http://127.0.0.1:18999"
    assert stack.trino in stack._services()
    assert Stack(StackSettings(state_dir=tmp_path)).info().trino_uri is None


def test_a_stack_refuses_trino_beside_a_rest_server_it_cannot_trust(tmp_path):
    from lakestream.errors import ConfigError
    from lakestream.stack import StackSettings

    with pytest.raises(ConfigError, match=r"rest_server='lakestream'.*fix: use rest_server='iceberg'"):
        StackSettings(state_dir=tmp_path, catalog="rest", rest_server="lakestream", trino=True)
    assert StackSettings(state_dir=tmp_path, catalog="rest", trino=True).trino
