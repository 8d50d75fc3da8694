"""The JVM jars lakestream uses, by Maven coordinates (``jars.toml``), resolved by Maven into a local cache.

Each group of ``jars.toml`` becomes a small pom; ``mvn dependency:copy-dependencies`` resolves it from the
configured Maven repositories (Maven Central unless the user's ``~/.m2/settings.xml`` names a mirror) with
strict checksums (``-C``: a jar whose SHA-1 does not match the repository's fails the resolution), into
``<cache>/jars/<group>-<digest>/``. The digest covers the group's coordinates, so changing a version resolves
anew and never mixes versions. ``scripts/bootstrap.sh`` resolves the groups its venv uses; the first use resolves a
group that is missing (a lock keeps two processes from resolving one group at once).

A group with a ``pyspark`` line (``"3.5"``, ``"4.1"``) holds the Spark session's jars for that Spark and its
Scala; ``spark_group`` picks the one of the running pyspark. On a Spark cluster the same coordinates go into
``spark.jars.packages`` (``python -m lakestream.runtime.jars --packages spark spark-aws``; ``spark4`` for Spark
4.1), where Spark's Ivy resolves them.

A group may take its dependencies' versions from a BOM (``bom``: a pom imported into the resolving pom's
``dependencyManagement``, as the project that publishes the artifacts builds them), and may be resolved only when
asked for (``on_demand``: ``python -m lakestream.runtime.jars NAME``, or its first use) rather than by a plain
``python -m lakestream.runtime.jars`` and ``scripts/bootstrap.sh``.

A distribution (``[distributions.<name>]``: an archive such as a server's tarball) is resolved the same
way, checksums checked, and the entries it lists under ``include`` are unpacked into
``<cache>/dist/<name>-<digest>/``; it is resolved only when asked for (``--distribution NAME``, or its first use).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from xml.sax.saxutils import escape

from lakestream.errors import LakestreamError

MANIFEST = Path(__file__).parent / "jars.toml"


@dataclass(frozen=True)
class Coordinate:
    """``group:artifact:version`` of one Maven artifact, ``group:artifact:type:version`` for an artifact that is
    not a jar, or ``group:artifact:type:classifier:version`` for a secondary artifact of a project (its test
    fixtures, say) — Maven's own order: the type and classifier before the version."""

    group: str
    artifact: str
    version: str
    type: str = "jar"
    classifier: str = ""

    @classmethod
    def parse(cls, text: str) -> Coordinate:
        parts = text.split(":")
        if not all(parts) or len(parts) not in (3, 4, 5):
            raise LakestreamError(
                f"{MANIFEST}: {text!r} is not group:artifact:version (or group:artifact:type:version, "
                "group:artifact:type:classifier:version)"
            )
        if len(parts) == 5:
            return cls(parts[0], parts[1], parts[4], parts[2], parts[3])
        if len(parts) == 4:
            return cls(parts[0], parts[1], parts[3], parts[2])
        return cls(*parts)

    @property
    def file_name(self) -> str:
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.{self.type}"

    def __str__(self) -> str:
        if self.classifier:
            return f"{self.group}:{self.artifact}:{self.type}:{self.classifier}:{self.version}"
        if self.type != "jar":
            return f"{self.group}:{self.artifact}:{self.type}:{self.version}"
        return f"{self.group}:{self.artifact}:{self.version}"


@dataclass(frozen=True)
class JarGroup:
    """One group of ``jars.toml``: the artifacts one class path needs."""

    name: str
    artifacts: tuple[Coordinate, ...]
    transitive: bool
    # ``group:artifact`` patterns (``*`` for any) left out of the dependencies of a transitive group: what the
    # process that loads the group already provides (a Connect plugin leaves out the worker's Kafka jars).
    exclude: tuple[str, ...] = ()
    pyspark: str | None = None  # "major.minor" of the Spark whose session these jars are for; None: any JVM
    # A pom whose dependencyManagement sets the versions of the artifacts' dependencies (Trino's trino-root).
    bom: Coordinate | None = None
    on_demand: bool = False  # resolved when first used or named, not by a plain `python -m lakestream.runtime.jars`

    @property
    def digest(self) -> str:
        key = f"{self.name}|{self.transitive}|" + "|".join(map(str, self.artifacts))
        if self.exclude:
            key += "|exclude:" + "|".join(self.exclude)
        if self.bom:
            key += f"|bom:{self.bom}"
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    def pom(self) -> str:
        """A pom whose dependencies are this group's artifacts (all their dependencies excluded unless
        ``transitive``; then those matching ``exclude``)."""
        patterns = self.exclude if self.transitive else ("*:*",)
        exclusions = "".join(
            f"<exclusion><groupId>{escape(g)}</groupId><artifactId>{escape(a)}</artifactId></exclusion>"
            for g, a in (p.split(":", 1) for p in patterns)
        )
        exclusions = f"<exclusions>{exclusions}</exclusions>" if exclusions else ""
        deps = "\n".join(
            f"    <dependency><groupId>{escape(c.group)}</groupId><artifactId>{escape(c.artifact)}</artifactId>"
            f"<version>{escape(c.version)}</version><type>{escape(c.type)}</type>"
            f"{f'<classifier>{escape(c.classifier)}</classifier>' if c.classifier else ''}{exclusions}</dependency>"
            for c in self.artifacts
        )
        managed = ""
        if self.bom:
            managed = (
                "  <dependencyManagement><dependencies><dependency>"
                f"<groupId>{escape(self.bom.group)}</groupId><artifactId>{escape(self.bom.artifact)}</artifactId>"
                f"<version>{escape(self.bom.version)}</version><type>pom</type><scope>import</scope>"
                "</dependency></dependencies></dependencyManagement>\n"
            )
        return (
            '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
            "  <modelVersion>4.0.0</modelVersion>\n"
            f"  <groupId>lakestream.jars</groupId><artifactId>{escape(self.name)}</artifactId>"
            "<version>1</version><packaging>pom</packaging>\n"
            f"{managed}"
            f"  <dependencies>\n{deps}\n  </dependencies>\n</project>\n"
        )


@dataclass(frozen=True)
class Distribution:
    """One distribution of ``jars.toml``: an archive by coordinates, of which the entries under ``include``
    (paths below the archive's top directory) are unpacked."""

    name: str
    artifact: Coordinate
    include: tuple[str, ...]

    @property
    def group(self) -> JarGroup:
        """The archive alone, resolved like a group of one artifact."""
        return JarGroup(f"dist-{self.name}", (self.artifact,), transitive=False)

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.artifact}|{'|'.join(self.include)}".encode()).hexdigest()[:12]


def _manifest() -> dict:
    with MANIFEST.open("rb") as f:
        return tomllib.load(f)


@cache
def groups() -> dict[str, JarGroup]:
    """Every group of ``jars.toml`` by name."""
    out = {}
    for name, spec in _manifest()["groups"].items():
        exclude = tuple(spec.get("exclude", ()))
        for pattern in exclude:
            if pattern.count(":") != 1 or not all(pattern.split(":")):
                raise LakestreamError(
                    f"{MANIFEST}: groups.{name}.exclude: {pattern!r} is not group:artifact (use * for any)"
                )
        out[name] = JarGroup(
            name,
            tuple(Coordinate.parse(a) for a in spec["artifacts"]),
            bool(spec.get("transitive")),
            exclude,
            spec.get("pyspark"),
            Coordinate.parse(spec["bom"]) if spec.get("bom") else None,
            bool(spec.get("on_demand")),
        )
    return out


def spark_group(pyspark_version: str | None = None) -> str:
    """The name of the group with the Spark session's jars (Iceberg's runtime for that Spark and Scala, the JDBC
    driver) for ``pyspark_version`` (default: the installed pyspark's)."""
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    line = ".".join(pyspark_version.split(".")[:2])
    for g in groups().values():
        if g.pyspark == line:
            return g.name
    served = ", ".join(g.pyspark for g in groups().values() if g.pyspark)
    raise LakestreamError(
        f"pyspark {pyspark_version} is not supported: {MANIFEST} has Iceberg runtimes for Spark "
        f"{served} only — fix: install a pyspark of one of those lines"
    )


def default_groups() -> list[str]:
    """The groups this installation uses: the running pyspark's Spark group and every group for no Spark that is
    not resolved on demand."""
    spark = spark_group()
    return [n for n, g in groups().items() if (g.pyspark is None and not g.on_demand) or n == spark]


@cache
def distributions() -> dict[str, Distribution]:
    """Every distribution of ``jars.toml`` by name."""
    return {
        name: Distribution(name, Coordinate.parse(spec["artifact"]), tuple(spec.get("include", ())))
        for name, spec in _manifest().get("distributions", {}).items()
    }


def distribution(name: str) -> Path:
    """The unpacked directory of distribution ``name`` (the archive's top directory), resolved and unpacked on
    first use."""
    try:
        d = distributions()[name]
    except KeyError:
        raise LakestreamError(
            f"no distribution {name!r} in {MANIFEST}; distributions: {', '.join(distributions())}"
        ) from None
    target = cache_root().parent / "dist" / f"{d.name}-{d.digest}"
    if not (target / ".complete").exists():
        archive = next((p for p in jars(d.group) if p.name == d.artifact.file_name), None)
        if archive is None:
            raise LakestreamError(f"{d.artifact.file_name} missing from the resolved distribution {name!r}")
        _unpack(d, archive, target)
        # The archive's copy in the jar cache is no longer read (Maven's own repository keeps one).
        shutil.rmtree(archive.parent, ignore_errors=True)
    return unpacked_root(target)


def unpacked_root(target: Path) -> Path:
    """The distribution's home in its unpacked ``target``: an archive with one top directory (Trino's) is that
    directory; one without (Apicurio's: ``quarkus-run.jar``, ``lib/``, ...) is ``target`` itself."""
    entries = [p for p in target.iterdir() if p.name != ".complete"]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else target


def _unpack(d: Distribution, archive: Path, target: Path) -> None:
    """Extract the entries of ``archive`` below its top directory that ``d.include`` lists into ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return
        print(f"[jars] unpacking {archive.name}: {', '.join(d.include) or 'everything'}", file=sys.stderr)
        partial = target.parent / f".{target.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)

        def wanted(member: tarfile.TarInfo) -> bool:
            inner = member.name.split("/", 1)[1] if "/" in member.name else ""
            return not d.include or any(inner == i or inner.startswith(i + "/") for i in d.include)

        with tarfile.open(archive) as tar:
            # The "data" filter refuses absolute paths, links out of the tree and device files.
            tar.extractall(partial, members=[m for m in tar if wanted(m)], filter="data")
        (partial / ".complete").write_text(f"{d.artifact}\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)


def group(name: str) -> JarGroup:
    try:
        return groups()[name]
    except KeyError:
        raise LakestreamError(f"no jar group {name!r} in {MANIFEST}; groups: {', '.join(groups())}") from None


def cache_root() -> Path:
    path = Path(os.environ.get("LAKESTREAM_CACHE", Path.home() / ".cache" / "lakestream")) / "jars"
    path.mkdir(parents=True, exist_ok=True)
    return path


def jars(name: str | JarGroup) -> list[Path]:
    """The jars (the artifacts) of group ``name``, resolved on first use."""
    g = name if isinstance(name, JarGroup) else group(name)
    target = cache_root() / f"{g.name}-{g.digest}"
    if not (target / ".complete").exists():
        _resolve(g, target)
    named = {c.file_name for c in g.artifacts}
    return sorted(p for p in target.iterdir() if p.suffix == ".jar" or p.name in named)


def jar(name: str, artifact: str) -> Path:
    """The jar of ``artifact`` in group ``name`` (its file is ``<artifact>-<version>.jar``)."""
    coordinate = next((c for c in group(name).artifacts if c.artifact == artifact), None)
    if coordinate is None:
        raise LakestreamError(f"jar group {name!r} of {MANIFEST} has no artifact {artifact!r}")
    path = next((j for j in jars(name) if j.name == f"{artifact}-{coordinate.version}.jar"), None)
    if path is None:
        raise LakestreamError(f"{artifact}-{coordinate.version}.jar missing from the resolved group {name!r}")
    return path


def packages(*names: str) -> str:
    """The artifacts of ``names`` as ``spark.jars.packages`` takes them (Ivy resolves their dependencies)."""
    return ",".join(str(c) for n in names for c in group(n).artifacts)


def _resolve(g: JarGroup, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LakestreamError("mvn not found: run ./scripts/bootstrap.sh (it installs Maven) or apt-get install maven")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return  # another process resolved it while this one waited
        print(f"[jars] resolving {g.name}: {', '.join(map(str, g.artifacts))}", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            (Path(tmp) / "pom.xml").write_text(g.pom())
            out = Path(tmp) / "jars"
            result = subprocess.run(
                [
                    mvn,
                    "-B",
                    "-q",
                    "-C",
                    "-f",
                    str(Path(tmp) / "pom.xml"),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={out}",
                    "-DincludeScope=runtime",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise LakestreamError(
                    f"resolving jar group {g.name!r} ({MANIFEST}) with Maven failed "
                    f"(exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
                )
            (out / ".complete").write_text("\n".join(map(str, g.artifacts)) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            out.rename(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lakestream.runtime.jars", description=__doc__.split("\n")[0])
    parser.add_argument(
        "groups",
        nargs="*",
        help="groups to resolve or print (default: the installed pyspark's and those for no Spark, not on demand)",
    )
    parser.add_argument("--packages", action="store_true", help="print the groups as spark.jars.packages")
    parser.add_argument("--classpath", action="store_true", help="print the resolved jars, one per line")
    parser.add_argument(
        "--distribution",
        action="append",
        default=[],
        metavar="NAME",
        help="resolve and unpack a distribution and print its directory",
    )
    args = parser.parse_args(argv)
    if args.distribution:
        for name in args.distribution:
            print(distribution(name))
        return 0
    names = args.groups or default_groups()
    if args.packages:
        print(packages(*names))
        return 0
    for name in names:
        resolved = jars(name)
        if args.classpath:
            print("\n".join(map(str, resolved)))
        else:
            print(f"[jars] {name}: {len(resolved)} jars", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
