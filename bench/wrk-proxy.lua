-- wrk-proxy.lua: make wrk act as a client of an HTTP *forward* proxy.
--
-- wrk connects to the URL given on its command line (the proxy, e.g.
-- http://127.0.0.1:13128) and this script rewrites every request into the
-- absolute form a browser sends to a proxy:
--
--     GET http://127.0.0.1:18080/1k HTTP/1.1
--     Host: 127.0.0.1:18080
--
-- Environment (read once per wrk thread, at load time):
--   WRK_TARGET  absolute URI to request   (default http://127.0.0.1:18080/1k)
--   WRK_CLOSE   "1": add "Connection: close" to every request, so each
--               request travels on a fresh client->proxy connection
--               (wrk reconnects when the response says Connection: close;
--               a proxy that closes without saying so shows up as read errors)
--
-- No response() callback is defined on purpose: defining one makes wrk hand
-- every response to Lua, which costs far more CPU on the load generator than
-- the request itself. Response correctness is checked separately by
-- http-core.sh with curl, and status >= 400 is still counted by wrk itself
-- (summary.errors.status).
--
-- done() prints one machine-readable line, prefixed "WRKJSON ", that
-- http-core.sh parses. Latencies are in microseconds, duration in
-- microseconds, bytes is the total read from the proxy.

local target = os.getenv("WRK_TARGET") or "http://127.0.0.1:18080/1k"
local close = os.getenv("WRK_CLOSE") == "1"

local authority = target:match("^%a+://([^/]+)")
assert(authority, "WRK_TARGET must be an absolute http:// URI: " .. target)

wrk.method = "GET"
wrk.path = target
wrk.headers["Host"] = authority
if close then
   wrk.headers["Connection"] = "close"
end

-- No request() function either: with wrk.method/path/headers set and no
-- request() defined, wrk formats the request once per thread and sends the
-- same bytes every time, with no Lua call on the hot path.

done = function(summary, latency, requests)
   local e = summary.errors
   local function p(q) return latency:percentile(q) end
   io.write(string.format(
      'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latency_us":{"min":%d,"mean":%.1f,"stdev":%.1f,"max":%d,' ..
      '"p50":%d,"p90":%d,"p99":%d,"p999":%d},"close":%s,"target":"%s"}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.min, latency.mean, latency.stdev, latency.max,
      p(50), p(90), p(99), p(99.9), tostring(close), target))
end
