"""A small bundled MCP backend so that `mcp-gateway serve` works with no configuration."""
