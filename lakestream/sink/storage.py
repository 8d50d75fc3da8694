"""Where data files live: table locations (``file:/...``, ``s3://...``) as pyarrow filesystems."""
from __future__ import annotations

import pyarrow.fs as pafs


def filesystem_path(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and in-filesystem path of a table file URI or plain path."""
    if uri.startswith("file:"):
        rest = uri[len("file:"):]
        while rest.startswith("//"):
            rest = rest[1:]
        return pafs.LocalFileSystem(), rest
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    return pafs.FileSystem.from_uri(uri)
