-- wrk script for the receive benchmark.
-- Arguments after "--": <pool file> <thread count>. The pool has one "<signature> <body>"
-- line per request: each request posts a body with a unique event_id and its own
-- HMAC-SHA512. With the pool "-" every request is a plain GET (the trivial endpoint).
-- done() prints one line "BENCH_JSON {...}" for the harness.
local counter = 1
local threads = {}

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local path, nthreads = args[1], tonumber(args[2] or "1")
  sigs, bodies = {}, {}
  n, idx, wraps = 0, 0, 0
  if path == nil or path == "-" then
    return
  end
  local i = 0
  for line in io.lines(path) do
    if i % nthreads == tid - 1 then
      local sp = line:find(" ", 1, true)
      sigs[#sigs + 1] = line:sub(1, sp - 1)
      bodies[#bodies + 1] = line:sub(sp + 1)
    end
    i = i + 1
  end
  n = #bodies
  hdrs = {["Content-Type"] = "application/json"}
end

function request()
  if n == 0 then
    return wrk.format("GET", wrk.path)
  end
  idx = idx + 1
  if idx > n then
    idx, wraps = 1, wraps + 1
  end
  hdrs["X-Webhook-Signature-512"] = sigs[idx]
  return wrk.format("POST", wrk.path, hdrs, bodies[idx])
end

function done(summary, latency, requests)
  local w = 0
  for _, t in ipairs(threads) do
    w = w + t:get("wraps")
  end
  local e = summary.errors
  io.write(string.format(
    '\nBENCH_JSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%f,"connect_errors":%d,"read_errors":%d,"write_errors":%d,' ..
    '"status_errors":%d,"timeouts":%d,"wraps":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.status,
    e.timeout, w))
end
