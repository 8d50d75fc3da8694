"""Where data files live: table locations (``file:/...``, ``s3://...``) as pyarrow filesystems."""
from __future__ import annotations

from lakestream.storage import ensure_dir, filesystem_path  # noqa: F401 — re-exported

__all__ = ["canonical_location", "filesystem_path"]


def canonical_location(location: str) -> str:
    """A location in the form Iceberg's HadoopFileIO (Hadoop ``Path.toString()``) gives the files it
    writes, which is how Spark-written files appear in ``<table>.files``: ``file:///x`` and
    ``file:/x`` become ``file:/x``, repeated slashes collapse; other URIs and plain paths are kept."""
    if location.startswith("file:"):
        rest = location[len("file:"):]
        if rest.startswith("//") and not rest.startswith("///"):
            raise ValueError(f"file URI with a host is not supported: {location}")
        return "file:/" + "/".join(part for part in rest.split("/") if part)
    return location
