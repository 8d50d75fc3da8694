"""`lakestream.runtime.jars`: groups of Maven coordinates turned into poms (no Maven run here)."""

from __future__ import annotations

from lakestream.runtime.jars import Coordinate, JarGroup, distributions, groups, unpacked_root


def test_a_transitive_group_leaves_out_what_it_excludes():
    plugin = JarGroup(
        "p",
        (Coordinate.parse("io.debezium:debezium-connector-postgres:3.6.3.Final"),),
        True,
        ("org.apache.kafka:*", "org.slf4j:*"),
    )
    pom = plugin.pom()
    assert "<exclusion><groupId>org.apache.kafka</groupId><artifactId>*</artifactId></exclusion>" in pom
    assert "<exclusion><groupId>org.slf4j</groupId><artifactId>*</artifactId></exclusion>" in pom
    # the cache directory changes with what is left out: never a directory resolved with other exclusions
    assert plugin.digest != JarGroup("p", plugin.artifacts, True).digest
    assert "<exclusions>" not in JarGroup("p", plugin.artifacts, True).pom()


def test_a_non_transitive_group_takes_the_artifact_alone():
    pom = JarGroup("s", (Coordinate.parse("org.postgresql:postgresql:42.7.14"),), False).pom()
    assert "<exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion>" in pom


def test_the_connect_worker_and_its_plugin_are_listed():
    worker, plugin = groups()["connect"], groups()["connect-debezium-postgres"]
    assert any(c.artifact == "connect-runtime" for c in worker.artifacts)
    assert plugin.exclude == ("org.apache.kafka:*", "org.slf4j:*")


def test_a_classified_artifact_names_its_classifier_in_the_pom_and_the_file():
    fixtures = Coordinate.parse("org.apache.iceberg:iceberg-open-api:jar:test-fixtures:1.11.0")
    assert (fixtures.artifact, fixtures.version, fixtures.classifier) == ("iceberg-open-api", "1.11.0", "test-fixtures")
    assert fixtures.file_name == "iceberg-open-api-1.11.0-test-fixtures.jar"
    assert str(fixtures) == "org.apache.iceberg:iceberg-open-api:jar:test-fixtures:1.11.0"
    assert "<classifier>test-fixtures</classifier>" in JarGroup("r", (fixtures,), True).pom()
    assert "<classifier>" not in JarGroup("r", (Coordinate.parse("org.postgresql:postgresql:42.7.14"),), True).pom()
    server = groups()["iceberg-rest-server"]
    assert {c.classifier for c in server.artifacts if c.artifact in ("iceberg-open-api", "iceberg-core")} == {
        "test-fixtures",
        "tests",
        "",
    }


def test_a_group_with_a_bom_imports_it_and_resolves_apart():
    main = Coordinate.parse("io.trino:trino-main:483")
    with_bom = JarGroup("t", (main,), True, bom=Coordinate.parse("io.trino:trino-root:483"))
    pom = with_bom.pom()
    managed = pom[pom.index("<dependencyManagement>") : pom.index("</dependencyManagement>")]
    assert "<artifactId>trino-root</artifactId><version>483</version><type>pom</type><scope>import</scope>" in managed
    assert "trino-main" not in managed  # the artifact itself stays a dependency
    assert "<dependencyManagement>" not in JarGroup("t", (main,), True).pom()
    assert with_bom.digest != JarGroup("t", (main,), True).digest


def test_a_distribution_without_a_top_directory_is_its_unpacked_directory(tmp_path):
    apicurio = distributions()["apicurio-registry"]
    assert str(apicurio.artifact) == "io.apicurio:apicurio-registry-app:tar.gz:all:3.3.3"
    assert apicurio.artifact.file_name == "apicurio-registry-app-3.3.3-all.tar.gz" and apicurio.include == ()
    flat, nested = tmp_path / "flat", tmp_path / "nested"
    for name in ("lib", "app"):
        (flat / name).mkdir(parents=True)
    (flat / "quarkus-run.jar").write_bytes(b"")
    (flat / ".complete").write_text("x")
    (nested / "trino-server-476" / "lib").mkdir(parents=True)
    (nested / ".complete").write_text("x")
    assert unpacked_root(flat) == flat
    assert unpacked_root(nested) == nested / "trino-server-476"
