"""TLS to a broker: one settings object for both backends.

:class:`TlsConfig` is what a user gives (Spark options ``tls``, ``tlsCaFile``,
``tlsCertFile``, ``tlsKeyFile``; client keywords ``tls=``/``tls_ca_file=``...). The
RocketMQ remoting client wraps its sockets with :meth:`TlsConfig.ssl_context`; the
pymq gRPC transport builds channel credentials from :meth:`TlsConfig.pem`.

The server's certificate is always verified — against ``ca_file`` when given, else
against the system's trust store — and so is its host name (or IP address, as
RocketMQ brokers register themselves by IP): a certificate for another host is
refused at connect time, with the address and the reason in the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

__all__ = ["TlsConfig"]


@dataclass(frozen=True)
class TlsConfig:
    """Encrypt connections to the broker, and verify who it is.

    Args:
        ca_file: PEM file of the certificate authorities to trust (a self-signed
            broker's certificate or its CA); ``None``: the system's trust store.
        cert_file: PEM certificate chain this client presents (mutual TLS), with
            ``key_file``.
        key_file: PEM private key (unencrypted) of ``cert_file``.

    Example::

        TlsConfig(ca_file="/etc/pymq/ca.pem")                       # server-side TLS
        TlsConfig("/etc/pymq/ca.pem", "client.pem", "client.key")   # mutual TLS

    Picklable and hashable (it travels to Spark's executors inside the options, and
    keys the process's shared connections); files are read when a connection opens.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = ("cert_file", "key_file") if self.cert_file else ("key_file", "cert_file")
            raise ValueError(
                f"TLS {given} is set without {missing}: a client certificate (mutual TLS) needs both "
                "its certificate chain and its private key"
            )

    def check_files(self, names: dict[str, str] | None = None) -> None:
        """ValueError naming the first file that cannot be read.

        ``names`` maps the field names to what the user called them (Spark option
        names), so the message names what to fix.
        """
        for attr in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, attr)
            if path is None:
                continue
            label = (names or {}).get(attr, attr)
            p = Path(path)
            if not p.is_file():
                raise ValueError(f"{label}={path!r} is not a readable file: give the path of a PEM file")
            try:
                with p.open("rb"):
                    pass
            except OSError as err:
                raise ValueError(f"{label}={path!r} cannot be read: {err.strerror or err}") from None

    def ssl_context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2+, the server's certificate and host name verified."""
        import ssl  # 30 ms of import, paid by the remoting backend only when TLS is on

        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # renegotiation would need a read inside a write; RocketMQ's and pymq's servers never ask
        ctx.options |= ssl.OP_NO_RENEGOTIATION
        if self.cert_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(root certificates, private key, certificate chain) for ``grpc.ssl_channel_credentials``."""
        def read(path: str | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return read(self.ca_file), read(self.key_file), read(self.cert_file)
