"""The gateway's opaque pagination cursor for aggregated lists.

It carries, per backend still holding pages, that backend's own cursor (opaque to us, passed
back unchanged: spec server/utilities/pagination), plus the method it belongs to. A backend
that failed or was late for a page stays in the cursor with the cursor it was asked with
(`null` for its first page) and a count of its failed attempts, so that paging on retries it;
the count bounds the retries, so a list whose backend stays down still ends.

It is plain base64url JSON and needs no signature: everything in it is something the client
could ask the backend directly, and caches key private pages by principal, not by cursor.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from gateway.protocol import jsonrpc as rpc

_VERSION = 1
# A backend left out of a page is asked again on at most this many following pages.
RETRY_BUDGET = 2

# Backend name → its cursor, or None for "its first page" (a retry of a failed first page).
Pending = dict[str, str | None]
# Backend name → failed attempts so far, for backends carried as retries.
Retries = dict[str, int]


def encode(method: str, pending: Pending, retries: Retries | None = None) -> str:
    data: dict[str, Any] = {"v": _VERSION, "m": method, "p": pending}
    if retries:
        data["r"] = retries
    return base64.urlsafe_b64encode(orjson.dumps(data)).rstrip(b"=").decode("ascii")


def decode(method: str, cursor: Any, request_id: rpc.RequestId | None) -> Pending:
    """Backend name → backend cursor, for the backends that still have pages."""
    return decode_position(method, cursor, request_id)[0]


def decode_position(method: str, cursor: Any, request_id: rpc.RequestId | None) -> tuple[Pending, Retries]:
    """The pending backends and the failed attempts of those carried as retries."""
    if not isinstance(cursor, str):
        raise rpc.invalid_params("cursor must be a string", request_id)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = orjson.loads(raw)
    except (binascii.Error, ValueError):
        raise rpc.invalid_params("invalid cursor", request_id) from None
    if (
        not isinstance(data, dict)
        or data.get("v") != _VERSION
        or data.get("m") != method
        or not isinstance(data.get("p"), dict)
        or not all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in data["p"].items())
        or not isinstance(data.get("r", {}), dict)
        or not all(
            k in data["p"] and isinstance(v, int) and not isinstance(v, bool) and 0 < v <= RETRY_BUDGET
            for k, v in data.get("r", {}).items()
        )
    ):
        raise rpc.invalid_params("invalid cursor", request_id)
    return data["p"], data.get("r", {})
