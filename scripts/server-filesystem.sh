#!/usr/bin/env bash
# Install @modelcontextprotocol/server-filesystem (pinned) for tests/integration/test_legacy_roots.py:
# a real initialize-era stdio server that asks its client for roots at start-up.
#
# Installed from the npm registry under ${MCPGW_CACHE_DIR:-<repo>/.cache}/server-filesystem
# (no global install, no npx download). Idempotent: a second run only checks the file.
# Prints the path of the package's entry script on stdout; prints nothing (and exits 0) when
# it cannot be installed, so the test skips with its own message rather than the suite failing.
set -uo pipefail

VERSION="${SERVER_FILESYSTEM_VERSION:-2026.8.31}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MCPGW_CACHE_DIR:-$repo/.cache}"
prefix="$cache/server-filesystem-$VERSION"
entry="$prefix/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"

if [[ ! -f "$entry" ]]; then
    if ! command -v npm >/dev/null; then
        echo "server-filesystem.sh: npm not found; the server-filesystem test will skip" >&2
        exit 0
    fi
    mkdir -p "$prefix"
    echo "server-filesystem.sh: installing @modelcontextprotocol/server-filesystem@$VERSION into $prefix" >&2
    if ! npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error \
            "@modelcontextprotocol/server-filesystem@$VERSION" >&2; then
        echo "server-filesystem.sh: npm install failed; the server-filesystem test will skip" >&2
        exit 0
    fi
fi
[[ -f "$entry" ]] && echo "$entry"
exit 0
