"""TLS on the gateway's own MCP listener (`server.tls`), served by uvicorn.

uvicorn builds the listener's `ssl.SSLContext` from `server.tls` (certificate, key, and with
`client_ca_file` a required client certificate: mTLS). The context outlives the files: on
SIGHUP `reload_certificates` loads the certificate chain into the same context again, so
that a renewed certificate (cert-manager rewriting a mounted Secret, say) serves every new
handshake without a restart; connections already open keep the one they negotiated. A
reload that fails (a half-written file) keeps the current certificate and says why.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from gateway.settings import ServerTls

log = logging.getLogger("gateway.front_tls")


def uvicorn_options(tls: ServerTls) -> dict[str, Any]:
    options: dict[str, Any] = {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file}
    if tls.key_password is not None:
        options["ssl_keyfile_password"] = tls.key_password.get_secret_value()
    if tls.client_ca_file is not None:
        options["ssl_ca_certs"] = tls.client_ca_file
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


def reload_certificates(context: ssl.SSLContext | None, tls: ServerTls) -> bool:
    """Load `tls`'s certificate chain (and client CAs) into the serving context again; False
    (and a log line naming the file problem) when that fails, the old certificate serving on."""
    if context is None:
        return False
    password = tls.key_password.get_secret_value() if tls.key_password is not None else None
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, password)
        if tls.client_ca_file is not None:
            context.load_verify_locations(tls.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        log.error("server.tls: reloading %s failed (%s); the current certificate keeps serving",
                  tls.cert_file, getattr(exc, "strerror", None) or exc)
        return False
    log.info("server.tls: certificate reloaded from %s", tls.cert_file)
    return True
