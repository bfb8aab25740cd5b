"""The gateway's opaque pagination cursor for aggregated lists.

It carries, per backend still holding pages, that backend's own cursor (opaque to us, passed
back unchanged: spec server/utilities/pagination), plus the method it belongs to. It is plain
base64url JSON and needs no signature: everything in it is something the client could ask the
backend directly, and caches key private pages by principal, not by cursor.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from gateway.protocol import jsonrpc as rpc

_VERSION = 1


def encode(method: str, pending: dict[str, str]) -> str:
    payload = orjson.dumps({"v": _VERSION, "m": method, "p": pending})
    return base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")


def decode(method: str, cursor: Any, request_id: rpc.RequestId | None) -> dict[str, str]:
    """Backend name → backend cursor, for the backends that still have pages."""
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
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in data["p"].items())
    ):
        raise rpc.invalid_params("invalid cursor", request_id)
    return data["p"]
