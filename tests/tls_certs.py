"""Certificates made at test time with openssl: a CA, a server certificate, a client certificate.

Usage::

    certs = make_certificates(tmp_path)            # files under tmp_path/certs
    certs.ca, certs.server_cert, certs.server_key  # PEM paths (str)
    certs.client_cert, certs.client_key            # for mutual TLS
    certs.other_ca                                  # a CA that signed none of them

The server certificate names ``localhost`` and ``127.0.0.1`` (brokers register by IP);
keys are unencrypted PKCS#8 PEM, which both Python's ssl, gRPC and Netty (RocketMQ) read.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certificates", "make_certificates"]


@dataclass(frozen=True)
class Certificates:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise RuntimeError(f"openssl {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-days", "2", "-subj", f"/CN=pymq test {name}", cwd=d)


def _leaf(d: Path, name: str, cn: str, ext: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={cn}", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


def make_certificates(base: Path) -> Certificates:
    """Make a CA and a server and a client certificate it signed, under ``base/certs``."""
    d = Path(base) / "certs"
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                    "extendedKeyUsage=serverAuth\n")
    _leaf(d, "client", "pymq-client", "extendedKeyUsage=clientAuth\n")
    return Certificates(
        ca=str(d / "ca.pem"), server_cert=str(d / "server.pem"), server_key=str(d / "server.key"),
        client_cert=str(d / "client.pem"), client_key=str(d / "client.key"), other_ca=str(d / "other-ca.pem"),
    )
