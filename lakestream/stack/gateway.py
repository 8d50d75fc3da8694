"""Versity's S3 gateway (versitygw), the local object store's server, built from its Go module at a pinned version.

``go install <module>@<version>`` through the Go module proxy, into the cache under that version
(``~/.cache/lakestream/bin/versitygw-<version>/``): ``make setup`` builds it (``python -m lakestream.stack.gateway``),
once per machine and version. The module asks for Go 1.25; a Go 1.21 or later fetches that toolchain itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from lakestream.errors import StackError

GATEWAY_MODULE = "github.com/versity/versitygw/cmd/versitygw"
GATEWAY_VERSION = "v1.8.0"
GATEWAY_NAME = "versitygw"


def gateway_path() -> Path:
    """Where the gateway binary of ``GATEWAY_VERSION`` is (or would be) built."""
    root = Path(os.environ.get("LAKESTREAM_CACHE", Path.home() / ".cache" / "lakestream"))
    return root / "bin" / f"{GATEWAY_NAME}-{GATEWAY_VERSION}" / GATEWAY_NAME


def build_gateway() -> Path:
    """The gateway binary, built with ``go install <module>@<version>`` unless already in the cache."""
    target = gateway_path()
    if target.exists():
        return target
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise StackError(
            f"the object store ({GATEWAY_NAME} {GATEWAY_VERSION}) is not built and no Go toolchain is on PATH "
            "— fix: install Go 1.21 or later (it fetches the 1.25 toolchain the module asks for; Debian 12's "
            "golang-go is 1.19, too old) and run `make setup`, which builds the store"
        )
    partial = target.parent.with_name(f".{target.parent.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"[objectstore] building {GATEWAY_MODULE}@{GATEWAY_VERSION}", file=sys.stderr)
    # GOTOOLCHAIN=auto: an older go fetches the toolchain the module asks for from the module proxy.
    env = {**os.environ, "GOBIN": str(partial), "GOFLAGS": "-trimpath", "GOTOOLCHAIN": "auto"}
    result = subprocess.run(
        [go, "install", f"{GATEWAY_MODULE}@{GATEWAY_VERSION}"], env=env, capture_output=True, text=True
    )
    if result.returncode != 0 or not (partial / GATEWAY_NAME).exists():
        shutil.rmtree(partial, ignore_errors=True)
        raise StackError(
            f"building {GATEWAY_MODULE}@{GATEWAY_VERSION} failed (exit {result.returncode}):\n{result.stderr[-3000:]}"
        )
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.rename(target.parent)  # atomic: a stack starting meanwhile never runs half a binary
    except OSError:  # another process built it first
        shutil.rmtree(partial, ignore_errors=True)
    return target


def main() -> int:
    """Build the gateway binary (``make setup``) and print its path."""
    try:
        print(build_gateway())
    except StackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
