-- wrk script of bench/bench_http.py: sends one fixed request and prints the latency percentiles.
-- BENCH_METHOD: POST (default) or GET; BENCH_BODY: path of the body; BENCH_HEADERS: "Name: value" lines.
wrk.method = os.getenv("BENCH_METHOD") or "POST"
if wrk.method == "POST" then
  local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
  wrk.body = f:read("*a")
  f:close()
end
for line in string.gmatch(os.getenv("BENCH_HEADERS") or "", "[^\n]+") do
  local name, value = string.match(line, "^([^:]+):%s*(.*)$")
  wrk.headers[name] = value
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH {\"requests\": %d, \"duration_us\": %d, \"p50_us\": %d, \"p99_us\": %d, \"p999_us\": %d, " ..
    "\"max_us\": %d, \"mean_us\": %.1f, \"non_2xx\": %d, \"socket_errors\": %d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
    latency.max, latency.mean, e.status, e.connect + e.read + e.write + e.timeout))
end
