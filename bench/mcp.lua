-- wrk script: POST one real MCP request over and over, print a JSON summary in done().
--
--   wrk -t1 -c32 -d10s -s bench/mcp.lua http://127.0.0.1:9001/mcp
--
-- Selected per workload through the environment (bench/run.py sets these):
--   MCP_METHOD            Mcp-Method header       (default "tools/call"; "" = omit header)
--   MCP_NAME              Mcp-Name header         (default "echo";      "" = omit header)
--   MCP_PROTOCOL_VERSION  MCP-Protocol-Version    (default "2026-07-28"; "" = omit header)
--   MCP_SESSION_ID        Mcp-Session-Id header   (legacy targets only; default: omitted)
--   MCP_BODY              the JSON-RPC body       (default: tools/call echo, modern _meta)
-- The same values may be given as script args instead: wrk ... -- key=value ...
-- (args win over the environment).

local defaults = {
  MCP_METHOD = "tools/call",
  MCP_NAME = "echo",
  MCP_PROTOCOL_VERSION = "2026-07-28",
  MCP_SESSION_ID = "",
  MCP_BODY = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo",'
    .. '"arguments":{"text":"hi"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    .. '"io.modelcontextprotocol/clientCapabilities":{}}}}',
}

local function setting(args, key)
  if args[key] ~= nil then return args[key] end
  local v = os.getenv(key)
  if v ~= nil then return v end
  return defaults[key]
end

function init(args)
  local kv = {}
  for _, a in ipairs(args) do
    local k, v = a:match("^([%w_]+)=(.*)$")
    if k then kv[k] = v end
  end
  wrk.method = "POST"
  wrk.body = setting(kv, "MCP_BODY")
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Accept"] = "application/json, text/event-stream"
  local pv = setting(kv, "MCP_PROTOCOL_VERSION")
  if pv ~= "" then wrk.headers["MCP-Protocol-Version"] = pv end
  local m = setting(kv, "MCP_METHOD")
  if m ~= "" then wrk.headers["Mcp-Method"] = m end
  local n = setting(kv, "MCP_NAME")
  if n ~= "" then wrk.headers["Mcp-Name"] = n end
  local sid = setting(kv, "MCP_SESSION_ID")
  if sid ~= "" then wrk.headers["Mcp-Session-Id"] = sid end
  req = wrk.format()
end

function request()
  return req
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,'
    .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
    .. '"latency_us":{"min":%d,"mean":%.1f,"max":%d,"stdev":%.1f,"p50":%d,"p90":%d,"p99":%d,"p999":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max, latency.stdev,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9)))
end
