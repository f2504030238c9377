"""Throwaway certificates for tests: a CA, and certificates it signs, made with
the ``openssl`` command (3.0 or later: ``req -x509 -CA``) in a directory the
caller owns (and removes).

    pki = make_pki(tmp_path)         # ca.pem, server.pem (IP:127.0.0.1), client.pem
    pki.ca                           # the CA certificate: a client's ca_file
    pki.server.cert, pki.server.key  # the server's pair
    pki.client.cert, pki.client.key  # a client's pair (client certificate auth)

Keys are EC P-256 (fast to make), certificates are valid for two days, and
they carry what strict verifiers ask for (basicConstraints, keyUsage, key
identifiers). The server certificate is also good for client authentication:
etcd's JSON gateway connects to etcd's own gRPC server with it, which etcd
checks like any client certificate under ``--client-cert-auth``.

``make_pki``'s server and client certificates have no CommonName (subject
``O=dbwrap-py, OU=<name>``): with ``--client-cert-auth`` and auth on, etcd
3.4's JSON gateway refuses any client certificate that has one ("CommonName
of client sending a request against gateway will be ignored"), since etcd
would take a CN for the user name.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from dbwrap_py.servers import ServerError

DAYS = 2

# One configuration for every certificate: the section picks the kind.
_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = {san}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclasses.dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key (PEM files)."""

    cert: Path
    key: Path


@dataclasses.dataclass(frozen=True)
class Pki:
    """A CA and the server and client certificates it signed."""

    ca: KeyPair
    server: KeyPair
    client: KeyPair


class CertificateError(ServerError):
    """openssl is missing or failed."""


def make_ca(directory: Path, name: str = "ca", common_name: str = "dbwrap-py test CA") -> KeyPair:
    """A self-signed CA: ``<name>.pem`` and ``<name>.key`` in ``directory``."""
    pair = _pair(directory, name)
    _openssl(directory, "ca", ["-subj", f"/CN={common_name}"], pair)
    return pair


def issue(
    ca: KeyPair,
    directory: Path,
    name: str,
    *,
    server: bool,
    common_name: str | None = None,
    ips: Sequence[str] = ("127.0.0.1",),
) -> KeyPair:
    """A certificate signed by ``ca``: for a server (SANs ``ips``, server and
    client auth) or for a client (client auth only). Without ``common_name``
    the subject has no CN: ``O=dbwrap-py, OU=<name>``."""
    pair = _pair(directory, name)
    subject = f"/O=dbwrap-py/CN={common_name}" if common_name else f"/O=dbwrap-py/OU={name}"
    args = ["-subj", subject, "-CA", str(ca.cert), "-CAkey", str(ca.key)]
    _openssl(directory, "server" if server else "client", args, pair, san=",".join(f"IP:{ip}" for ip in ips))
    return pair


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate
    (neither with a CommonName), in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory)
    return Pki(
        ca=ca,
        server=issue(ca, directory, "server", server=True),
        client=issue(ca, directory, "client", server=False),
    )


def _pair(directory: Path, name: str) -> KeyPair:
    return KeyPair(cert=directory / f"{name}.pem", key=directory / f"{name}.key")


def _openssl(directory: Path, section: str, args: list[str], pair: KeyPair, san: str = "IP:127.0.0.1") -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise CertificateError("no openssl on PATH (Debian: apt-get install openssl)")
    config = directory / f"{pair.cert.stem}.cnf"
    config.write_text(_CONFIG.format(san=san))
    argv = [
        binary, "req", "-x509",
        "-config", str(config),
        "-extensions", section,
        "-newkey", "ec",
        "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout", str(pair.key),
        "-out", str(pair.cert),
        "-days", str(DAYS),
        *args,
    ]
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        raise CertificateError(f"openssl failed for {pair.cert.name}: {result.stderr.strip()}")
