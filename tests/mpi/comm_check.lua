-- Collectives under mpirun: values against hand-computed expectations and
-- the byte counters against the logical volume of each call.
local H = require("mpi.harness")
local T = require("muon.tensor")
local comm = require("muon.comm")

H.main(function()
  local w = H.init()
  local r, n = H.rank, H.size
  H.check("world-size", n == comm.world_size() and r >= 0 and r < n, ("rank %d size %d"):format(r, n))

  -- alltoallv: rank r sends (q + r) % 3 elements to rank q, value 1000*r + 10*q + j.
  for _, dtype in ipairs({ "float32", "float64" }) do
    local function cnt(from, to) return (to + from) % 3 end
    local sc, rc, stot, rtot = {}, {}, 0, 0
    for q = 0, n - 1 do
      sc[q + 1], rc[q + 1] = cnt(r, q), cnt(q, r)
      stot, rtot = stot + sc[q + 1], rtot + rc[q + 1]
    end
    local send = T.zeros({ math.max(stot, 1) }, dtype)
    local k = 1
    for q = 0, n - 1 do
      for j = 1, sc[q + 1] do send:set(1000 * r + 10 * q + j, k); k = k + 1 end
    end
    local recv = T.zeros({ math.max(rtot, 1) }, dtype)
    w:reset_stats()
    w:alltoallv(send, sc, recv, rc)
    local good, k2 = true, 1
    for q = 0, n - 1 do
      for j = 1, rc[q + 1] do
        if recv:get(k2) ~= 1000 * q + 10 * r + j then good = false end
        k2 = k2 + 1
      end
    end
    H.check("alltoallv-values-" .. dtype, good)
    local es = dtype == "float32" and 4 or 8
    local s = w:stats()
    H.check("alltoallv-bytes-" .. dtype,
      s.calls == 1 and s.bytes_sent == (stot - sc[r + 1]) * es and s.bytes_recv == (rtot - rc[r + 1]) * es,
      ("sent %d recv %d"):format(s.bytes_sent, s.bytes_recv))
  end

  -- ialltoallv: everyone sends its rank to everyone.
  do
    local sc, rc = {}, {}
    for q = 1, n do sc[q], rc[q] = 1, 1 end
    local send, recv = T.zeros({ n }, "float64"), T.zeros({ n }, "float64")
    send:fill(r + 0.5)
    w:reset_stats()
    local req = w:ialltoallv(send, sc, recv, rc)
    req:wait()
    local good = true
    for q = 0, n - 1 do good = good and recv:get(q + 1) == q + 0.5 end
    local s = w:stats()
    H.check("ialltoallv", good and s.bytes_sent == (n - 1) * 8 and s.bytes_recv == (n - 1) * 8)
  end

  -- allgatherv: rank q contributes q + 1 elements of value q.
  do
    local counts, tot = {}, 0
    for q = 0, n - 1 do counts[q + 1] = q + 1; tot = tot + q + 1 end
    local send = T.zeros({ r + 1 })
    send:fill(r)
    local recv = T.zeros({ tot })
    w:reset_stats()
    w:allgatherv(send, recv, counts)
    local good, k = true, 1
    for q = 0, n - 1 do
      for _ = 1, q + 1 do good = good and recv:get(k) == q; k = k + 1 end
    end
    local s = w:stats()
    H.check("allgatherv", good and s.bytes_sent == (r + 1) * 4 * (n - 1) and s.bytes_recv == (tot - r - 1) * 4,
      ("sent %d recv %d"):format(s.bytes_sent, s.bytes_recv))
  end

  -- bcast / ibcast from the last rank.
  do
    local root = n - 1
    local t = T.zeros({ 5 }, "float64")
    if r == root then for i = 1, 5 do t:set(i * 1.25, i) end end
    w:reset_stats()
    w:bcast(t, root)
    local good = true
    for i = 1, 5 do good = good and t:get(i) == i * 1.25 end
    local s = w:stats()
    local es = r == root and 5 * 8 * (n - 1) or 0
    local er = r == root and 0 or 40
    H.check("bcast", good and s.bytes_sent == es and s.bytes_recv == er)
    local u = T.zeros({ 3 })
    if r == 0 then u:fill(7) end
    local q = w:ibcast(u, 0)
    q:wait()
    H.check("ibcast", u:get(1) == 7 and u:get(3) == 7)
    H.check("bcast-string", w:bcast_string(r == root and "héllo" or "", root) == "héllo")
  end

  -- allreduce.
  do
    local s = w:allreduce({ r, 1, -r }, "sum")
    H.check("allreduce-sum-i64", s[1] == n * (n - 1) / 2 and s[2] == n and s[3] == -n * (n - 1) / 2)
    local m = w:allreduce({ r, -r }, "max")
    H.check("allreduce-max-i64", m[1] == n - 1 and m[2] == 0)
    local mi = w:allreduce({ r + 0.25 }, "min", "f64")
    H.check("allreduce-min-f64", mi[1] == 0.25)
    local ok = pcall(w.allreduce, w, { 1 }, "prod")
    H.check("allreduce-bad-op", not ok)
  end

  -- split: even and odd ranks; sub-communicator ranks ordered by key.
  do
    local sub = w:split(r % 2, -r)
    local members = math.floor((n - 1 - r % 2) / 2) + 1
    local higher = 0
    for q = r + 2, n - 1, 2 do higher = higher + 1 end
    H.check("split", sub:size() == members and sub:rank() == higher,
      ("size %d rank %d"):format(sub:size(), sub:rank()))
    local sum = sub:allreduce({ r }, "sum")[1]
    local want = 0
    for q = r % 2, n - 1, 2 do want = want + q end
    H.check("split-allreduce", sum == want)
    sub:barrier()
    sub:free()
  end

  -- misuse: counts table of the wrong length names the parameter.
  do
    local ok, err = pcall(w.alltoallv, w, T.zeros({ 1 }), {}, T.zeros({ 1 }), {})
    H.check("alltoallv-bad-counts", not ok and tostring(err):find("sendcounts", 1, true) ~= nil, err)
  end
  w:barrier()
end)
