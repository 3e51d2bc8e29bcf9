-- wrk script of bench/load_test.py --goodput: one fixed request, answers tallied by status.
-- BENCH_BODY: path of the body; BENCH_HEADERS: "Name: value" lines.
wrk.method = "POST"
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()
for line in string.gmatch(os.getenv("BENCH_HEADERS") or "", "[^\n]+") do
  local name, value = string.match(line, "^([^:]+):%s*(.*)$")
  wrk.headers[name] = value
end

threads = {}
function setup(thread)
  table.insert(threads, thread)
end

counts = {}  -- status -> n, read by done() from every thread
function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end

function done(summary, latency, requests)
  local e = summary.errors
  local parts = {}
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("counts")) do
      table.insert(parts, string.format("[%d, %d]", status, n))
    end
  end
  io.write(string.format(
    "GOODPUT {\"requests\": %d, \"duration_us\": %d, \"p50_us\": %d, \"p99_us\": %d, " ..
    "\"socket_errors\": %d, \"counts\": [%s]}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, table.concat(parts, ", ")))
end
