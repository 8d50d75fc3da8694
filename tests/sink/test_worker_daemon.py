"""The Python worker daemon's zip archives: read once, read again only when they change (a subprocess each, as the
patch is process-wide, like the worker it is made for)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_CHECK = textwrap.dedent(
    """
    import importlib, sys, zipfile, zipimport
    archive = sys.argv[1]
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/first.py", "VALUE = 1")
        for i in range(200):
            z.writestr(f"data/{i}.txt", "x")
    sys.path.insert(0, archive)
    import pkg.first

    from lakestream.sink.write.worker_daemon import keep_zip_directories

    reads = []
    read_directory = zipimport._read_directory
    zipimport._read_directory = lambda path: reads.append(path) or read_directory(path)
    keep_zip_directories()
    for _ in range(3):
        importlib.invalidate_caches()  # what PySpark's worker does before each task
    print("unchanged", len([p for p in reads if p == archive]))

    with zipfile.ZipFile(archive, "a") as z:
        z.writestr("pkg/second.py", "VALUE = 2")
    importlib.invalidate_caches()
    import pkg.second
    print("changed", len([p for p in reads if p == archive]), pkg.second.VALUE)
    """
)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="Python 3.13 invalidates zip directories lazily itself")
def test_an_unchanged_archive_is_not_read_again_and_a_changed_one_is(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _CHECK, str(tmp_path / "lib.zip")], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "unchanged 0", out
    assert out[1].startswith("changed ") and int(out[1].split()[1]) >= 1 and out[1].endswith(" 2"), out
