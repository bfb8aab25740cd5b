"""Wire-level MCP: JSON-RPC framing, headers, versions, SSE. No I/O policy lives here."""
