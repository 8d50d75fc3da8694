"""Certificates for the local stack's TLS listeners, made with the JDK's keytool (no other tool needed).

A certificate authority of the stack's own signs a server certificate for 127.0.0.1 and localhost; the
server keeps its key and chain in a PKCS12 key store, clients trust the CA's PEM file (librdkafka's
``ssl.ca.location``). Made once per directory and kept: a restart serves the same certificate.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lakestream.errors import StackError
from lakestream.stack.process import LOOPBACK

# Protects nothing beyond the files' own mode (the keys never leave their directory): a fixed value.
KEYSTORE_PASSWORD = "lakestream-local"
_SAN = f"san=ip:{LOOPBACK},dns:localhost"


@dataclass(frozen=True)
class ServerCertificate:
    """A server's PKCS12 key store (its key, its certificate and the CA's) and the CA's PEM for clients."""

    keystore: Path
    ca_pem: Path
    keystore_password: str = KEYSTORE_PASSWORD


def make_ca(tls_dir: Path, name: str) -> Path:
    """A new certificate authority in ``tls_dir`` (``ca.p12``, ``ca.pem``) unless one is there; its PEM."""
    ca_store, ca_pem = tls_dir / "ca.p12", tls_dir / "ca.pem"
    if ca_store.exists() and ca_pem.exists():
        return ca_pem
    tls_dir.mkdir(parents=True, exist_ok=True)
    ca_store.unlink(missing_ok=True)
    store = _store_args("ca", ca_store)
    _keytool(
        "-genkeypair",
        *store,
        "-keyalg",
        "RSA",
        "-keysize",
        "2048",
        "-validity",
        "3650",
        "-dname",
        f"CN={name} CA",
        "-ext",
        "bc:c",
    )
    _keytool("-exportcert", *store, "-rfc", "-file", str(ca_pem))
    return ca_pem


def make_server_certificate(tls_dir: Path, name: str) -> ServerCertificate:
    """A CA and a server certificate it signs for 127.0.0.1/localhost, in ``tls_dir``, unless made before."""
    cert = ServerCertificate(keystore=tls_dir / "server.p12", ca_pem=tls_dir / "ca.pem")
    if cert.keystore.exists() and cert.ca_pem.exists():
        return cert
    make_ca(tls_dir, name)
    cert.keystore.unlink(missing_ok=True)
    server = _store_args("server", cert.keystore)
    request, signed = tls_dir / "server.csr", tls_dir / "server.pem"
    _keytool(
        "-genkeypair",
        *server,
        "-keyalg",
        "RSA",
        "-keysize",
        "2048",
        "-validity",
        "3650",
        "-dname",
        f"CN={name}",
        "-ext",
        _SAN,
    )
    _keytool("-certreq", *server, "-file", str(request))
    # The SAN must be repeated here: gencert does not copy the request's extensions.
    _keytool(
        "-gencert",
        *_store_args("ca", tls_dir / "ca.p12"),
        "-infile",
        str(request),
        "-outfile",
        str(signed),
        "-rfc",
        "-validity",
        "3650",
        "-ext",
        _SAN,
        "-ext",
        "ku:c=digitalSignature,keyEncipherment",
        "-ext",
        "eku=serverAuth",
    )
    # The chain is only accepted on top of a trusted CA: import the CA first, then the signed reply.
    _keytool("-importcert", *_store_args("ca", cert.keystore), "-file", str(cert.ca_pem), "-noprompt")
    _keytool("-importcert", *server, "-file", str(signed), "-noprompt")
    request.unlink()
    return cert


def _store_args(alias: str, store: Path) -> list[str]:
    return ["-alias", alias, "-keystore", str(store), "-storetype", "PKCS12", "-storepass", KEYSTORE_PASSWORD]


def _keytool(*args: str) -> None:
    keytool = shutil.which("keytool")
    if keytool is None:
        raise StackError("keytool not found: it comes with the JDK (apt-get install openjdk-17-jdk-headless)")
    done = subprocess.run([keytool, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise StackError(
            f"keytool {args[0]} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}"
        )
