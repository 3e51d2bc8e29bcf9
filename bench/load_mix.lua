-- wrk script of bench/load_test.py: a weighted mix of requests, statuses tallied per kind of request.
-- Arguments (after --): triples of  kind path body-file  repeated, each triple once per unit of weight.
-- Each request carries X-Request-ID: <kind>-<n>; the server echoes it, so every answer is tallied
-- under the kind of request it answers.
local requests = {}
counts = {}  -- "kind status" -> n, read by done() from every thread

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end
threads = {}

function init(args)
  math.randomseed(os.time() * 1000 + (id or 0))
  local bodies = {}
  for i = 1, #args, 3 do
    local kind, path, file = args[i], args[i + 1], args[i + 2]
    if not bodies[file] then
      local f = assert(io.open(file, "rb"))
      bodies[file] = f:read("*a")
      f:close()
    end
    table.insert(requests, {kind = kind, path = path, body = bodies[file]})
  end
end

local n = 0
function request()
  local r = requests[math.random(#requests)]
  n = n + 1
  return wrk.format("POST", r.path, {["Content-Type"] = "application/json", ["X-Request-ID"] = r.kind .. "-" .. n}, r.body)
end

function response(status, headers, body)
  local rid = headers["x-request-id"] or headers["X-Request-ID"] or "unknown"
  local key = (string.match(rid, "^(.*)-%d+$") or rid) .. " " .. status
  counts[key] = (counts[key] or 0) + 1
end

function done(summary, latency, requests)
  local e = summary.errors
  local parts = {}
  for _, t in ipairs(threads) do
    for key, value in pairs(t:get("counts")) do
      table.insert(parts, string.format("[%q, %d]", key, value))
    end
  end
  io.write(string.format(
    "LOAD {\"requests\": %d, \"duration_us\": %d, \"p50_us\": %d, \"p90_us\": %d, \"p99_us\": %d, \"max_us\": %d, " ..
    "\"errors\": {\"connect\": %d, \"read\": %d, \"write\": %d, \"timeout\": %d}, \"counts\": [%s]}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.timeout, table.concat(parts, ", ")))
end
