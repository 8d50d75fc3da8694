"""Where data files live: table locations (``file:/...``, ``s3://...``) as pyarrow filesystems."""
from __future__ import annotations

import pyarrow.fs as pafs


def filesystem_path(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and in-filesystem path of a table file URI or plain path."""
    if uri.startswith("file:"):
        rest = uri[len("file:"):]
        if rest.startswith("//") and not rest.startswith("///"):
            raise ValueError(f"file URI with a host is not supported: {uri}")
        return pafs.LocalFileSystem(), "/" + rest.lstrip("/")
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    return pafs.FileSystem.from_uri(uri)


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
