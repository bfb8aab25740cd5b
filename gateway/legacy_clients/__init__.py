"""Serving initialize-era (2025-11-25, 2025-06-18, 2025-03-26) clients through the modern
gateway (digest §h.9): sessions.py keeps their sessions and resumable streams, translate.py
maps their requests onto modern calls and the answers back, server.py is the legacy server
the MCP endpoint hands them to. Removing this era is deleting this package and its wiring in
gateway/app.py."""

from gateway.legacy_clients.server import LegacyClients

__all__ = ["LegacyClients"]
