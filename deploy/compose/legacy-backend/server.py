"""An initialize-era (2025-11-25) MCP server for the compose stack, on the official SDK's
last initialize-era line (mcp 1.x): the gateway serves it to 2026-07-28 clients, and to
initialize-era clients through gateway sessions. Streamable HTTP on 0.0.0.0:$PORT/mcp."""

import os

from mcp.server.fastmcp import FastMCP

server = FastMCP("compose-legacy-example", host="0.0.0.0", port=int(os.environ.get("PORT", "9002")))


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


@server.tool()
def word_count(text: str) -> int:
    """How many words the text has."""
    return len(text.split())


@server.resource("notes://readme")
def readme() -> str:
    """A static note."""
    return "served by an initialize-era backend behind mcp-gateway"


if __name__ == "__main__":
    server.run(transport="streamable-http")
