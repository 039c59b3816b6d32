"""TLS contexts for the worker's gRPC endpoint (tritonserver's --grpc-use-ssl flags) and for the
load generator's connections (perf_analyzer's --ssl-* flags), from certificate files.

HTTP/2 over TLS is chosen by ALPN ("h2"), as gRPC requires. A file that cannot be read, or a
certificate that does not load, is one sentence naming the flag and the file.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from analyzer.errors import AnalyzerError


class TlsError(AnalyzerError):
    """A TLS flag names a file that is missing or not a usable certificate or key."""


@dataclass(frozen=True)
class ServerTls:
    """tritonserver's --grpc-server-cert/--grpc-server-key, --grpc-root-cert and
    --grpc-use-ssl-mutual (clients must then present a certificate the root signed)."""

    cert: str
    key: str
    root: str = ""
    mutual: bool = False

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        _load(context.load_cert_chain, "--grpc-server-cert/--grpc-server-key", self.cert, self.key)
        if self.mutual:
            if not self.root:
                raise TlsError("--grpc-use-ssl-mutual needs --grpc-root-cert (the CA that signs "
                               "the clients' certificates)")  # fmt: skip
            _load(context.load_verify_locations, "--grpc-root-cert", self.root)
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["h2"])
        return context


@dataclass(frozen=True)
class ClientTls:
    """perf_analyzer's --ssl-grpc-* (gRPC) and --ssl-https-* (HTTPS) flags."""

    grpc: bool = False  # --ssl-grpc-use-ssl
    grpc_root: str = ""  # --ssl-grpc-root-certifications-file
    grpc_key: str = ""  # --ssl-grpc-private-key-file
    grpc_chain: str = ""  # --ssl-grpc-certificate-chain-file
    https_verify_peer: bool = True  # --ssl-https-verify-peer 1
    https_verify_host: bool = True  # --ssl-https-verify-host 2 (0: no)
    https_ca: str = ""  # --ssl-https-ca-certificates-file
    https_cert: str = ""  # --ssl-https-client-certificate-file (PEM)
    https_key: str = ""  # --ssl-https-private-key-file (PEM)

    def context(self, protocol: str) -> ssl.SSLContext:
        """The client context for gRPC (ALPN h2) or HTTPS."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if protocol == "grpc":
            if self.grpc_root:
                _load(context.load_verify_locations, "--ssl-grpc-root-certifications-file",
                      self.grpc_root)  # fmt: skip
            if self.grpc_chain or self.grpc_key:
                _load(context.load_cert_chain, "--ssl-grpc-certificate-chain-file/"
                      "--ssl-grpc-private-key-file", self.grpc_chain, self.grpc_key or None)
            context.set_alpn_protocols(["h2"])
            return context
        if self.https_ca:
            _load(context.load_verify_locations, "--ssl-https-ca-certificates-file", self.https_ca)
        if self.https_cert or self.https_key:
            _load(context.load_cert_chain, "--ssl-https-client-certificate-file/"
                  "--ssl-https-private-key-file", self.https_cert, self.https_key or None)
        if not self.https_verify_host or not self.https_verify_peer:
            context.check_hostname = False
        if not self.https_verify_peer:
            context.verify_mode = ssl.CERT_NONE
        return context

    def grpc_credentials(self):
        """grpcio's channel credentials for the control calls and streams."""
        import grpc

        def read(flag: str, path: str) -> bytes | None:
            if not path:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as err:
                raise TlsError(f"{flag} '{path}' cannot be read ({err.strerror})") from None

        return grpc.ssl_channel_credentials(
            read("--ssl-grpc-root-certifications-file", self.grpc_root),
            read("--ssl-grpc-private-key-file", self.grpc_key),
            read("--ssl-grpc-certificate-chain-file", self.grpc_chain),
        )


SSL_FLAGS = (
    "ssl-grpc-use-ssl", "ssl-grpc-root-certifications-file", "ssl-grpc-private-key-file",
    "ssl-grpc-certificate-chain-file", "ssl-https-verify-peer", "ssl-https-verify-host",
    "ssl-https-ca-certificates-file", "ssl-https-client-certificate-type",
    "ssl-https-client-certificate-file", "ssl-https-private-key-type",
    "ssl-https-private-key-file",
)  # fmt: skip


def client_tls(flags: dict, where: str = "") -> ClientTls | None:
    """ClientTls from perf_analyzer's --ssl-* values (`flags` keyed by the flag names without
    dashes in front); None when none is given. PEM files only, as Python's ssl reads them."""
    given = {k: v for k, v in flags.items() if k in SSL_FLAGS and v not in (None, "")}
    if not given:
        return None
    for kind in ("ssl-https-client-certificate-type", "ssl-https-private-key-type"):
        if str(given.get(kind, "PEM")).upper() != "PEM":
            raise TlsError(f"{where}{kind} '{given[kind]}': only PEM files are read here; "
                           "convert it with openssl")  # fmt: skip

    def number(key: str, default: int, allowed: tuple[int, ...]) -> int:
        try:
            value = int(given.get(key, default))
        except (TypeError, ValueError):
            value = -1
        if value not in allowed:
            raise TlsError(f"{where}{key} '{given[key]}' must be one of "
                           f"{', '.join(map(str, allowed))}")  # fmt: skip
        return value

    use = given.get("ssl-grpc-use-ssl", False)
    return ClientTls(
        grpc=use is None or use is True or str(use).lower() in ("1", "true", "yes", "on", ""),
        grpc_root=str(given.get("ssl-grpc-root-certifications-file", "")),
        grpc_key=str(given.get("ssl-grpc-private-key-file", "")),
        grpc_chain=str(given.get("ssl-grpc-certificate-chain-file", "")),
        https_verify_peer=number("ssl-https-verify-peer", 1, (0, 1)) == 1,
        https_verify_host=number("ssl-https-verify-host", 2, (0, 1, 2)) != 0,
        https_ca=str(given.get("ssl-https-ca-certificates-file", "")),
        https_cert=str(given.get("ssl-https-client-certificate-file", "")),
        https_key=str(given.get("ssl-https-private-key-file", "")),
    )


def _load(method, flag: str, *paths) -> None:
    try:
        method(*paths)
    except FileNotFoundError as err:
        raise TlsError(f"{flag}: '{err.filename}' does not exist") from None
    except (ssl.SSLError, OSError) as err:
        raise TlsError(f"{flag}: {', '.join(str(p) for p in paths if p)} cannot be loaded as "
                       f"a certificate or key ({err})") from None  # fmt: skip
