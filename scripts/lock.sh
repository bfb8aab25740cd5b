#!/usr/bin/env bash
# Re-resolve constraints.txt (the image's pinned Python packages) from pyproject.toml in a
# throw-away venv: the runtime dependencies plus the `otlp` extra, on this python3 (use 3.11,
# the image's). Review the diff before committing it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check "$repo[otlp]"
{
    sed -n '/^#/p' "$repo/constraints.txt"
    "$tmp/venv/bin/pip" freeze --exclude-editable | grep -vi '^mcp-gateway'
} > "$tmp/constraints.txt"
mv "$tmp/constraints.txt" "$repo/constraints.txt"
