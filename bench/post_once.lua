-- wrk script for the end-to-end benchmark: posts every body of the pool exactly once, then
-- stops. Arguments after "--": <pool file>. The pool has one "<signature> <body>" line per
-- request (bench.bodies.write_pool). Once every body was sent, the connections still open ask
-- for GET /ping until the thread stops.
-- done() prints one line "BENCH_JSON {...}" for the harness. Use one thread (-t1).
function init(args)
  sigs, bodies = {}, {}
  for line in io.lines(args[1]) do
    local sp = line:find(" ", 1, true)
    sigs[#sigs + 1] = line:sub(1, sp - 1)
    bodies[#bodies + 1] = line:sub(sp + 1)
  end
  n, sent, pings, answered = #bodies, 0, 0, 0
  hdrs = {["Content-Type"] = "application/json"}
  ping = wrk.format("GET", "/ping")
end

function request()
  -- wrk asks each thread for one request before it opens the connections, and never sends
  -- it: that one must not use up a body.
  if not probed then
    probed = true
    return ping
  end
  if sent >= n then
    pings = pings + 1
    return ping
  end
  sent = sent + 1
  hdrs["X-Webhook-Signature-512"] = sigs[sent]
  return wrk.format("POST", wrk.path, hdrs, bodies[sent])
end

function response(status, headers, body)
  answered = answered + 1
  -- Each connection has one request in flight: once every body was sent and as many
  -- answers came back, at most one POST per connection is unanswered; the server finishes
  -- it all the same (the harness counts what was stored, not what was answered).
  if sent >= n and answered >= n then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nBENCH_JSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"status_errors":%d,' ..
    '"timeouts":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
