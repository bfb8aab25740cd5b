#!/usr/bin/env bash
# Wake-ups and CPU per request of the proxy, its backend and wrk, for one target under wrk -c32:
#
#   bash bench/wakeups.sh call|list [gateway|nginx|direct]
#
# Same processes and CPU layout as bench/run.py's shared layout (backend and proxy on CPU 1,
# nice -10; wrk on CPU 0), one 8 s run after a 2 s warm-up. Prints req/s, then per request:
# the voluntary and involuntary context switches of the proxy and of the backend (from
# /proc/PID/status), their CPU time (utime + stime from /proc/PID/stat) and wrk's context
# switches (perf stat). bench/README.md "Fifth round" says what these showed. Needs `perf`
# only for the wrk column (linux-perf); without it that column is left out.
set -euo pipefail
MODE=${1:-call}
TARGET=${2:-gateway}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# The project's virtualenv (scripts/test.sh makes it), or $PYTHON.
PY=${PYTHON:-${MCPGW_VENV:-$ROOT/.venv}/bin/python}
[ -x "$PY" ] || { echo "no Python at $PY: run scripts/test.sh once, or set PYTHON" >&2; exit 2; }
WORK=$(mktemp -d /tmp/mcp-wakeups-XXXXXX)
free_port() { "$PY" -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
BP=$(free_port); GP=$(free_port)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
exec 9>/tmp/mcp-gateway-bench.lock
flock -w 900 9  # one measurement at a time, as bench/run.py

cd "$ROOT"
setsid taskset -c 1 nice -n -10 "$PY" bench/backend.py --port "$BP" --mode modern --tools 50 --ttl-ms 60000 \
  >"$WORK/backend.log" 2>&1 & PIDS+=($!); BACKEND=$!
case "$TARGET" in
  gateway)
    printf 'backends:\n  - {name: bench, url: "http://127.0.0.1:%s/mcp", era: modern, prefix: ""}\ncache: {store: memory}\n' \
      "$BP" >"$WORK/gw.yaml"
    setsid taskset -c 1 nice -n -10 "$PY" -m gateway serve --config "$WORK/gw.yaml" --host 127.0.0.1 --port "$GP" \
      >"$WORK/gw.log" 2>&1 & PIDS+=($!); PROXY=$!
    URL=http://127.0.0.1:$GP/mcp ;;
  nginx)
    mkdir -p "$WORK/nginx/logs" "$WORK/nginx/tmp"
    "$PY" - "$WORK/nginx" "$BP" "$GP" >"$WORK/nginx/nginx.conf" <<'EOF'
import string, sys
prefix, backend_port, port = sys.argv[1:]
print(string.Template(open("bench/nginx.conf.template").read()).substitute(
    prefix=prefix, backend_host="127.0.0.1", backend_port=backend_port, listen_host="127.0.0.1", listen_port=port))
EOF
    setsid taskset -c 1 nice -n -10 /usr/sbin/nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" \
      -e "$WORK/nginx/logs/error.log" & PIDS+=($!); NGINX=$!
    URL=http://127.0.0.1:$GP/mcp ;;
  direct) URL=http://127.0.0.1:$BP/mcp ;;
  *) echo "target: gateway, nginx or direct" >&2; exit 2 ;;
esac
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$BP/stats" && { [ "$TARGET" = direct ] || curl -s -o /dev/null "$URL" -X GET; } && break; sleep 0.1; done
if [ "$TARGET" = nginx ]; then PROXY=$(pgrep -P "$NGINX" | head -1); fi  # the one worker
if [ "$MODE" = list ]; then
  export MCP_METHOD=tools/list MCP_NAME= \
    MCP_BODY='{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
fi
taskset -c 0 wrk -t1 -c32 -d2s --timeout 5s -s bench/mcp.lua "$URL" >/dev/null

switches() { awk '/^voluntary_ctxt_switches/{v=$2} /^nonvoluntary_ctxt_switches/{n=$2} END{print v, n}' "/proc/$1/status"; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
read -r bv0 bn0 < <(switches "$BACKEND"); bt0=$(ticks "$BACKEND")
if [ -n "${PROXY:-}" ]; then read -r pv0 pn0 < <(switches "$PROXY"); pt0=$(ticks "$PROXY"); fi
WRK=(wrk -t1 -c32 -d8s --timeout 5s -s bench/mcp.lua "$URL")
if command -v perf >/dev/null; then
  taskset -c 0 perf stat -x, -e context-switches -o "$WORK/wrk.stat" "${WRK[@]}" >"$WORK/wrk.out"
else
  taskset -c 0 "${WRK[@]}" >"$WORK/wrk.out"
fi
read -r bv1 bn1 < <(switches "$BACKEND"); bt1=$(ticks "$BACKEND")
if [ -n "${PROXY:-}" ]; then read -r pv1 pn1 < <(switches "$PROXY"); pt1=$(ticks "$PROXY"); fi
N=$(grep -oP '"requests":\K[0-9]+' "$WORK/wrk.out")
HZ=$(getconf CLK_TCK)
per() { awk -v a="$1" -v n="$N" 'BEGIN{printf "%.3f", a / n}'; }
us() { awk -v t="$1" -v n="$N" -v hz="$HZ" 'BEGIN{printf "%.1f", t * 1e6 / hz / n}'; }
echo "$MODE via $TARGET: $(grep 'Requests/sec' "$WORK/wrk.out" | awk '{print $2}') req/s ($N requests), per request:"
[ -n "${PROXY:-}" ] && echo "  proxy    switches voluntary $(per $((pv1 - pv0)))  involuntary $(per $((pn1 - pn0)))  CPU $(us $((pt1 - pt0))) µs"
echo "  backend  switches voluntary $(per $((bv1 - bv0)))  involuntary $(per $((bn1 - bn0)))  CPU $(us $((bt1 - bt0))) µs"
[ -f "$WORK/wrk.stat" ] && echo "  wrk      switches $(per "$(grep context-switches "$WORK/wrk.stat" | cut -d, -f1)")"
exit 0
