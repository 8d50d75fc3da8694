#!/usr/bin/env bash
# The bench-only venv for the Flink peer of `make bench-peers` (bench/peers/flink_sink.py): PyFlink from PyPI,
# pinned by bench/peers/requirements-peers.lock. Apart from the main venv, whose pyspark needs another py4j.
# Idempotent: a venv whose stamp matches the lock is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LAKESTREAM_PEERS_VENV:-.venv-peers}
LOCK=bench/peers/requirements-peers.lock
want=$(sha256sum "$LOCK" | cut -d' ' -f1)
stamp="$VENV/.lakestream-peers-stamp"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[peers] creating $VENV (PyFlink, $LOCK)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$LOCK"
  echo "$want" > "$stamp"
fi
echo "[peers] ready: $VENV"
