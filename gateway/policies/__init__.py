"""Header-phase policies: plain ASGI classes that run before any body is read.

Each one validates its options once in `__init__`, passes non-HTTP scopes through, does one
job, and either calls the next app or sends its own response (the shape of Starlette's
`TrustedHostMiddleware`). `gateway.app` declares their order in one list. Those that decide
from the head alone and synchronously are `head.HeadPolicy`s: a row of them runs as one ASGI
step (`head.HeadPhase`), in the declared order.
"""
