"""The TLS context of one https backend, built once from `backends[].tls` and shared by
every connection the backend's clients open (the era probe's, the pass-through pool, legacy
sessions' GET streams).

Unset: `ssl.create_default_context()`, the system's trust store and hostname check. With
`ca_file`, only that bundle is trusted (a private CA is trusted only where configured);
`cert_file`/`key_file` are presented to a backend that asks for a client certificate
(mTLS); `server_name` is the name checked in the certificate and sent as SNI when the URL's
host is an address or an internal alias. `insecure_skip_verify` (which settings refuse
unless `allow_insecure_skip_verify` is also set) checks nothing.
"""

from __future__ import annotations

import ssl

from gateway.settings import BackendTls


class TlsConfigError(ValueError):
    pass


def client_context(tls: BackendTls | None) -> ssl.SSLContext:
    if tls is None:
        return ssl.create_default_context()
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"backends[].tls: {exc}") from None
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def server_hostname(tls: BackendTls | None, host: str) -> str:
    return tls.server_name if tls is not None and tls.server_name else host
