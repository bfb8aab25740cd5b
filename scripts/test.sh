#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs, then runs pytest
# (unit, integration, and the official conformance suite through the gateway).
#
#   bash scripts/test.sh [pytest args...]
#
# What it installs when missing (each step is idempotent):
#   - a virtualenv at ${MCPGW_VENV:-.venv} with the gateway and its test extras
#   - redis-server (Debian package, through apt-get; the tests start their own on free ports)
#   - redis-sentinel (Debian package; the Sentinel tests fall back to redis-server --sentinel)
#   - the mcp==1.30.0 virtualenv for legacy fixture servers (scripts/legacy-venv.sh)
#   - Node 22 and the conformance suite (scripts/node22.sh, scripts/conformance.sh)
#   - tini (Debian package: the image's PID 1, run by tests/deploy) and the deployment
#     validators' venv (scripts/deploy-tools.sh); without them those tests skip, saying why
#   - @modelcontextprotocol/server-filesystem from npm (scripts/server-filesystem.sh)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="${MCPGW_VENV:-$repo/.venv}"
export MCPGW_CACHE_DIR="${MCPGW_CACHE_DIR:-$repo/.cache}"

step() { printf '\n== %s\n' "$*" >&2; }

step "python environment ($venv)"
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test,otlp]" >&2

step "redis-server"
if ! command -v redis-server >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >&2
        # The package starts a system instance; the tests start their own on free ports.
        (service redis-server stop || true) >/dev/null 2>&1
    else
        echo "redis-server is missing and this is not root: sudo apt-get install redis-server" >&2
        exit 1
    fi
fi
redis-server --version >&2

step "redis-sentinel"
# The Sentinel tests (tests/integration/test_redis_shapes.py) start three Sentinels; without
# Debian's package they fall back to `redis-server --sentinel`, the same binary.
if ! command -v redis-sentinel >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-sentinel \
        || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-sentinel)) >&2 \
        || echo "redis-sentinel could not be installed; the tests use redis-server --sentinel" >&2
    (service redis-sentinel stop || true) >/dev/null 2>&1
fi

step "legacy fixture venv (mcp==1.30.0)"
LEGACY_PYTHON_BIN="$(bash scripts/legacy-venv.sh)"
export MCPGW_LEGACY_PYTHON="$LEGACY_PYTHON_BIN"

step "node 22 + conformance suite"
NODE22_BIN="$(bash scripts/node22.sh)"
export MCPGW_NODE22_BIN="$NODE22_BIN"

step "deployment checks: tini + validators (tests/deploy skip without them)"
if ! command -v tini >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tini) >&2 \
        || echo "tini could not be installed: its tests will skip" >&2
fi
if DEPLOY_TOOLS_BIN="$(bash scripts/deploy-tools.sh)"; then
    export MCPGW_DEPLOY_TOOLS_BIN="$DEPLOY_TOOLS_BIN"
else
    echo "the deployment validators could not be installed: their tests will skip" >&2
fi
step "@modelcontextprotocol/server-filesystem (npm; its test skips without it)"
MCPGW_SERVER_FILESYSTEM="$(PATH="$NODE22_BIN:$PATH" bash scripts/server-filesystem.sh)"
export MCPGW_SERVER_FILESYSTEM

step "pytest"
exec "$venv/bin/python" -m pytest "$@"
