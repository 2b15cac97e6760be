"""TLS and tokens for the client's channels, as the C++ processes' flags (common/security.h).

    cluster = pscluster.connect(address, tls_ca="ca.pem", token_file="cluster.token")

- tls_ca: PEM file of the CA that signs the servers' certificates; given (or tls_cert
  given), every channel is TLS. tls_cert/tls_key: this client's certificate, for mutual TLS.
  server_name: the name the servers' certificates carry when it is not the host dialled.
- token / token_file: the cluster (or admin) token, sent as "authorization: Bearer T" on
  every call. Without TLS a token goes over gRPC's local credentials, to loopback
  addresses only (as common/security.h); between machines tokens need TLS.
Each argument not given falls back to an environment variable (deploy/local_cluster.sh
--run sets them): PSCLUSTER_TLS_CA, PSCLUSTER_TLS_CERT, PSCLUSTER_TLS_KEY,
PSCLUSTER_TLS_SERVER_NAME, PSCLUSTER_TOKEN_FILE.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import grpc

MIN_TOKEN_CHARS = 16  # as common/security.cc


def _read(what: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"{what}={path}: cannot read it ({e.strerror})") from None
    if not data:
        raise ValueError(f"{what}={path}: the file is empty")
    return data


def _check_token(token: str, where: str) -> str:
    token = token.strip()
    if any(not 0x21 <= ord(c) <= 0x7e for c in token):
        raise ValueError(f"{where}: a token is one line of printable ASCII without spaces")
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{where}: the token has {len(token)} characters; at least "
                         f"{MIN_TOKEN_CHARS} are needed (openssl rand -hex 32 > FILE)")
    return token


@dataclass(frozen=True)
class Security:
    """How the client's channels are made. Security() is plaintext without a token."""
    ca: Optional[bytes] = None
    cert: Optional[bytes] = None
    key: Optional[bytes] = None
    token: Optional[str] = None
    server_name: Optional[str] = None
    tls: bool = False

    @staticmethod
    def load(tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
             tls_key: Optional[str] = None, token: Optional[str] = None,
             token_file: Optional[str] = None,
             server_name: Optional[str] = None) -> "Security":
        """From files (each defaulting to its environment variable); ValueError naming the
        argument and file that cannot be used."""
        env = os.environ.get
        tls_ca = tls_ca or env("PSCLUSTER_TLS_CA")
        tls_cert = tls_cert or env("PSCLUSTER_TLS_CERT")
        tls_key = tls_key or env("PSCLUSTER_TLS_KEY")
        server_name = server_name or env("PSCLUSTER_TLS_SERVER_NAME")
        if token is None:
            token_file = token_file or env("PSCLUSTER_TOKEN_FILE")
            if token_file:
                token = _check_token(_read("token_file", token_file).decode("ascii", "replace"),
                                     f"token_file={token_file}")
        else:
            token = _check_token(token, "token")
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("tls_cert and tls_key go together: a certificate and its key")
        tls = bool(tls_ca or tls_cert)
        return Security(
            ca=_read("tls_ca", tls_ca) if tls_ca else None,
            cert=_read("tls_cert", tls_cert) if tls_cert else None,
            key=_read("tls_key", tls_key) if tls_key else None,
            token=token, server_name=server_name, tls=tls)

    def channel(self, address: str,
                options: Sequence[Tuple[str, object]] = ()) -> grpc.Channel:
        """A channel to `address` with this TLS and token (a token without TLS: loopback
        only, through gRPC's local credentials)."""
        if not self.tls and not self.token:
            return grpc.insecure_channel(address, options=list(options))
        if not self.tls:
            credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert)
        if self.token:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(self.token))
        options = list(options)
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.secure_channel(address, credentials, options=options)
