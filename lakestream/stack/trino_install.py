"""Trino's server assembled from its Maven modules, laid out as Trino's own distribution lays it out.

Maven Central serves these machines Trino's jars but not its server tarball (after 476), its
``trino-server-main`` or its plugins' zips. Trino builds its distribution with provisio
(``core/trino-server/src/main/provisio/trino.xml``): ``lib/`` holds ``trino-main`` and its runtime dependencies
plus ``trino-server-main``'s launcher, each plugin is unpacked into ``plugin/<name>/``. The same layout here,
from the ``trino-server`` and ``trino-plugin-iceberg`` groups of ``jars.toml`` (hard links into the jar cache,
no second copy), under ``<cache>/dist/trino-<digest>/``:

- ``lib/``: the ``trino-server`` group and ``lakestream-trino-server.jar``, the launcher compiled from
  ``lakestream/java/trino/`` (what ``TrinoServer`` does: ``new io.trino.server.Server().start(version)``);
- ``plugin/iceberg/``: the ``trino-plugin-iceberg`` group and ``iceberg-plugin-services.jar``, which holds the
  one file the published ``trino-iceberg`` jar lacks, ``META-INF/services/io.trino.spi.Plugin`` (it ships in
  the plugin zip's ``-services.jar``): Trino finds a plugin's entry class with Java's ServiceLoader.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import zipfile
from pathlib import Path

from lakestream.runtime import jars
from lakestream.runtime.jvm_jars import trino_launcher_jar

SERVER_GROUP = "trino-server"
PLUGINS = {"iceberg": ("trino-plugin-iceberg", "io.trino.plugin.iceberg.IcebergPlugin")}
MAIN_CLASS = "lakestream.trino.LakestreamTrinoServer"


def version() -> str:
    """The Trino release the ``trino-server`` group holds (``trino-main``'s version)."""
    return next(c.version for c in jars.group(SERVER_GROUP).artifacts if c.artifact == "trino-main")


def install_dir() -> Path:
    """The assembled server (``lib/``, ``plugin/<name>/``), resolved and assembled on first use."""
    launcher = trino_launcher_jar()
    names = [SERVER_GROUP, *(group for group, _ in PLUGINS.values())]
    key = "|".join(f"{n}-{jars.group(n).digest}" for n in names) + f"|{launcher.name}|{sorted(PLUGINS.items())}"
    target = jars.cache_root().parent / "dist" / f"trino-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            _assemble(target, launcher)
    return target


def _assemble(target: Path, launcher: Path) -> None:
    partial = target.parent / f".{target.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    _link_all([*jars.jars(SERVER_GROUP), launcher], partial / "lib")
    for name, (group, entry_class) in PLUGINS.items():
        plugin = partial / "plugin" / name
        _link_all(jars.jars(group), plugin)
        with zipfile.ZipFile(plugin / f"{name}-plugin-services.jar", "w") as services:
            services.writestr("META-INF/services/io.trino.spi.Plugin", f"{entry_class}\n")
    (partial / ".complete").write_text(f"trino {version()}\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _link_all(files: list[Path], directory: Path) -> None:
    directory.mkdir(parents=True)
    for file in files:
        try:
            os.link(file, directory / file.name)
        except OSError:  # another file system (LAKESTREAM_CACHE elsewhere): a copy
            shutil.copy2(file, directory / file.name)


if __name__ == "__main__":
    print(install_dir())
