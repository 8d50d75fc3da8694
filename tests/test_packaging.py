"""`pip install .` carries every file lakestream reads at run time (pyproject's package data), not only the
modules: a file left out works from the checkout and fails in an installed copy."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_data_file_of_the_package_is_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["lakestream"]
    package = ROOT / "lakestream"
    data = [
        p.relative_to(package).as_posix()
        for p in package.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert data, "no data files found: the test would pass vacuously"
    missing = [f for f in data if not any(fnmatch.fnmatch(f, pattern) for pattern in patterns)]
    assert not missing, f"not in [tool.setuptools.package-data] of pyproject.toml: {missing}"
