#!/usr/bin/env bash
# Create (once) the venv that runs the legacy, initialize-era MCP fixture servers.
#
# mcp==1.30.0 (last initialize-era SDK line) cannot share a venv with the gateway's
# mcp 2.x, so it lives in its own: ${MCPGW_CACHE_DIR:-<repo>/.cache}/venv-legacy.
# Idempotent: a venv that already has the pinned packages is left as it is.
# Prints the venv's python path on stdout (and nothing else there).
#
# Environment: MCPGW_CACHE_DIR (cache dir), LEGACY_PYTHON (interpreter to build the
# venv with; default python3.11, else python3 if it is >= 3.10).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MCPGW_CACHE_DIR:-$repo/.cache}"
venv="$cache/venv-legacy"
py="$venv/bin/python"
pins=("mcp==1.30.0" "uvicorn>=0.30")
stamp="$venv/.mcp-gateway-legacy-pins"
want="${pins[*]}"

if [[ -x "$py" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
    && "$py" -c 'import mcp, uvicorn' >/dev/null 2>&1; then
    echo "$py"
    exit 0
fi

base="${LEGACY_PYTHON:-}"
if [[ -z "$base" ]]; then
    for cand in python3.11 python3.12 python3.13 python3; do
        if command -v "$cand" >/dev/null 2>&1 \
            && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            base="$cand"; break
        fi
    done
fi
[[ -n "$base" ]] || { echo "legacy-venv: need python >= 3.10 (python3.11)" >&2; exit 1; }

mkdir -p "$cache"
# Serialise concurrent callers (parallel test workers) on one lock file.
exec 9>"$cache/.venv-legacy.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

# Re-check under the lock: another caller may have finished meanwhile.
if ! [[ -x "$py" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    [[ -x "$py" ]] || "$base" -m venv "$venv" >&2
    "$py" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
    "$py" -c 'import mcp, uvicorn' >&2
    printf '%s' "$want" >"$stamp"
fi
echo "$py"
