"""The typed pipeline config: errors name the field and the fix; secrets stay out of logs."""

from __future__ import annotations

import pytest

from lakestream.config import load_config, parse_config, redact
from lakestream.errors import ConfigError

BASE = {
    "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
    "catalog": {"uri": "jdbc:postgresql://h/db", "user": "u", "password": "s3cret", "warehouse": "file:///w"},
    "streams": [{"topics": ["shop.public.orders"]}],
}


def with_(path: str, value):
    import copy

    data = copy.deepcopy(BASE)
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[parts[-1]] = value
    return data


def test_minimal_config_gets_defaults():
    config = parse_config(BASE)
    assert config.engine.max_records_per_batch == 200_000
    assert config.streams[0].mode == "upsert" and config.streams[0].record_format == "debezium"
    assert config.stream_for("shop.public.orders") is config.streams[0]
    assert config.stream_for("other") is None


@pytest.mark.parametrize(
    "path,value,expected",
    [
        ("streams.0.mode", "upsrt", "streams[0].mode"),
        ("streams.0.topic_pattern", "(", "streams[0].topic_pattern"),
        ("streams.0.table", "{tabel}", "unknown placeholder"),
        ("streams.0.namespace", "bad-ns", "streams[0].namespace"),
        ("engine.max_records_per_batch", 0, "engine.max_records_per_batch"),
        ("engine.dead_letter_table", "nodot", "<namespace>.<table>"),
        ("kafka.client", {"group.id": "x"}, "kafka.group_id"),
        ("kafka.bootstrap_srvers", "x", "remove it or check its spelling"),
    ],
)
def test_errors_name_the_field_and_fix(path, value, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(with_(path, value))
    assert expected in str(info.value)


def test_missing_section_is_named():
    data = dict(BASE)
    del data["kafka"]
    with pytest.raises(ConfigError, match=r"kafka: Field required — fix: add it"):
        parse_config(data)


def test_route_field_needs_field_placeholder():
    with pytest.raises(ConfigError, match=r"\{field\}"):
        parse_config(with_("streams.0.route_field", "kind"))


def test_env_expansion_and_missing_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("LS_TEST_PW", "from-env")
    path = tmp_path / "p.yaml"
    path.write_text(
        "kafka: {bootstrap_servers: 'k:9092'}\n"
        "catalog: {uri: 'jdbc:postgresql://h/d', password: '${LS_TEST_PW}', warehouse: 'file:///w'}\n"
        "streams: [{topics: [a]}]\n"
    )
    config = load_config(path)
    assert config.catalog.password.get_secret_value() == "from-env"
    assert "from-env" not in repr(config) and "from-env" not in str(config.model_dump())
    path.write_text(path.read_text().replace("LS_TEST_PW", "LS_TEST_UNSET"))
    with pytest.raises(ConfigError, match="LS_TEST_UNSET"):
        load_config(path)


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kafka: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_redact_hides_credentials():
    out = redact({"sasl.password": "x", "nested": {"ssl.key.password": "y", "api_key": "z"}, "linger.ms": 5})
    assert out == {"sasl.password": "***", "nested": {"ssl.key.password": "***", "api_key": "***"}, "linger.ms": 5}
    assert redact({"value.converter.basic.auth.user.info": "u:p"}) == {"value.converter.basic.auth.user.info": "***"}


def test_table_layout_rules_match_first():
    data = with_("table_layouts", [{"tables": r"cdc\.orders", "partition_by": ["bucket(16, id)"]}])
    config = parse_config(data)
    assert config.layout_for("cdc.orders", config.streams[0]).partition_by == ["bucket(16, id)"]
    assert config.layout_for("cdc.other", config.streams[0]).partition_by == []


def test_the_pipelines_jvm_compiles_with_c1_only_when_it_runs_no_spark_sql_of_its_own():
    """``spark.jit: auto`` (the default): C1 only for `lakestream run`'s JVM, unless it runs Spark SQL itself
    (derived tables, windows, inline maintenance); every other session keeps the JVM's tiered JIT; c1 and tiered
    are what they say for every session."""
    from lakestream.runtime.spark import client_compiler

    config = parse_config(BASE)
    assert config.spark.jit == "auto"
    assert client_compiler(config, pipeline=True) is True
    assert client_compiler(config, pipeline=False) is False  # lakestream sql, verify, maintain, ...
    inline = parse_config(with_("maintenance.mode", "inline"))
    assert client_compiler(inline, pipeline=True) is False
    for field in ("derived_tables", "windows"):
        # (any entry: what it holds does not matter here)
        assert client_compiler(config.model_copy(update={field: [object()]}), pipeline=True) is False
    assert client_compiler(parse_config(with_("spark.jit", "c1")), pipeline=False) is True
    assert client_compiler(parse_config(with_("spark.jit", "tiered")), pipeline=True) is False
    with pytest.raises(ConfigError, match="spark.jit"):
        parse_config(with_("spark.jit", "c2"))
