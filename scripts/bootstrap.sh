#!/usr/bin/env bash
# Idempotent setup for a fresh machine of this kind: system packages, the venv, the package.
# Every JVM jar comes by Maven coordinates (lakestream/runtime/jars.toml), resolved with mvn; see docs/stack.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LAKESTREAM_VENV:-.venv}
# LAKESTREAM_PYSPARK=X.Y.Z: the venv gets that pyspark instead of requirements.lock's (`make test-spark4` makes
# .venv-spark4 so); every other pin stays. The Iceberg runtime is then the jars.toml group for that Spark.
PYSPARK=${LAKESTREAM_PYSPARK:-}
requirements() {
  if [ -n "$PYSPARK" ]; then sed "s/^pyspark==.*/pyspark==$PYSPARK/" requirements.lock; else cat requirements.lock; fi
}

need_apt=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || need_apt+=(postgresql-15)
# MariaDB 10.11, the second source database (`lakestream stack up --source mariadb`, tests/capture/test_mariadb_*).
[ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
# cargo for the native payload parser (lakestream/decode/payloads_rs): rustup's where it is, else Debian's.
command -v cargo >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/cargo" ] || need_apt+=(cargo)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v runuser >/dev/null 2>&1 || need_apt+=(util-linux)
# Headless Chromium for the dashboard's browser test (driven by the playwright wheel; never `playwright install`).
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[bootstrap] apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

stamp="$VENV/.lakestream-stamp"
want="$( { requirements; cat pyproject.toml; } | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[bootstrap] creating $VENV (pinned requirements.lock${PYSPARK:+, pyspark $PYSPARK})"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r <(requirements) 2> >(grep -v "^WARNING: Location" >&2)
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e . 2> >(grep -v "^WARNING: Location" >&2)
  echo "$want" > "$stamp"
fi
# Resolve the jar groups of lakestream/runtime/jars.toml this venv uses with Maven (checksums checked) into ~/.cache/lakestream/jars,
# then compile the small JVM helpers (commit properties, offset lookup; the capture classes; the local REST
# catalog server) against them.
"$VENV/bin/python" -m lakestream.runtime.jars
"$VENV/bin/python" -m lakestream.runtime.jvm_jars >/dev/null
# The native parser of Debezium payloads (lakestream/decode/payloads_rs, no dependencies), built with cargo into the same
# cache under a digest of its sources.
"$VENV/bin/python" -m lakestream.decode.native >/dev/null
# The stack's and the tests' S3-compatible store: Versity's S3 gateway, built from its Go module (go install at a
# pinned version; Go 1.21+ on PATH or in /usr/local/go) into ~/.cache/lakestream/bin/, once per version.
"$VENV/bin/python" -m lakestream.stack.gateway >/dev/null
# The stack's and the tests' Schema Registry: Apicurio Registry's runnable assembly by Maven coordinates.
"$VENV/bin/python" -m lakestream.runtime.jars --distribution apicurio-registry >/dev/null
echo "[bootstrap] ready: $VENV"
