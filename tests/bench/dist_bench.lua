-- Distributed step benchmark (`make bench`): relaunches itself under mpirun
-- (the README's Open MPI settings) and prints, per rank,
--   np 2, mesh shard:2 with OPENBLAS_NUM_THREADS=1 (one rank per core: the
--     honest overlap figure), then np 4, mesh replicate:2 x shard:2 (owners
--     by NS flops, then by numel; oversubscribed on 2 cores, so labelled):
--     the bytes its NS routing moves per step (measured by the counters, and
--     the plan's formula) next to what the seed's all-gather + full-update
--     broadcast + replica broadcast would move for the same owners; the NS
--     flops each rank runs and the measured NS and step times; the median
--     over steps of step time / the slowest rank's NS time (the exchanges
--     run under Newton-Schulz: target <= 1.05) and how many exchanges were
--     non-blocking (muon.router's pipeline); the data bytes of all ranks
--     against the owner-free floor (target <= 1.05) and the NS imbalance;
--   np 2, mesh replicate:2 x shard:1: optimizer-state bytes per rank against
--     the same model in one process (eng:memory()), target <= 0.55x.
--   luajit tests/bench/dist_bench.lua [d] [layers]
local comm = require("muon.comm")

local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua")
local sh = B.sh

if comm.world_size() == 1 and arg[1] ~= "--worker" then
  local d, layers = arg[1] or "256", arg[2] or "3"
  local env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
    .. "OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl=self,vader OMPI_MCA_plm=isolated"
  local f = io.open("build/muon", "r")
  local host = f and "build/muon run" or "luajit"
  if f then f:close() end
  -- np 2 with one BLAS thread per rank is one rank per core on this
  -- 2-core machine: the honest overlap figure; np 4 time-shares the cores
  -- (oversubscribed).
  for _, run in ipairs({ { 2, "shard:2", "split", "OPENBLAS_NUM_THREADS=1 " },
                         { 2, "replicate:1,shard:2", "flops", "OPENBLAS_NUM_THREADS=1 " },
                         { 4, "replicate:2,shard:2", "flops", "" }, { 4, "replicate:2,shard:2", "numel", "" },
                         { 2, "replicate:2,shard:1", "flops", "" } }) do
    local cmd = ("%s %s timeout -k 10 300 mpirun --timeout 280 --stdin none -np %d %s tests/bench/dist_bench.lua --worker %s %s %s %s </dev/null")
      :format(env, run[4], run[1], host, sh(run[2]), sh(run[3]), sh(d), sh(layers))
    local ok = os.execute(cmd)
    if ok ~= 0 and ok ~= true then error("dist_bench: mpirun failed (" .. tostring(ok) .. ")") end
  end
  return
end

local T = require("muon.tensor")
local D = require("muon.dist")
local ns = require("muon.ns")
local engine = require("muon.engine")

local now = B.now
-- Time spent in Newton-Schulz on this rank.
local ns_seconds = 0
for _, name in ipairs({ "zeropower_into", "zeropower_many" }) do
  local f = ns[name]
  ns[name] = function(...)
    local t0 = now()
    local r = f(...)
    ns_seconds = ns_seconds + (now() - t0)
    return r
  end
end

-- Where the step goes besides Newton-Schulz (per rank, ms per step): the
-- router's posts (packing + MPI_Ialltoallv) and waits (for the peers, then
-- unpacking), the control all-reduces (call gate, step agreement, failure
-- agreement) and the rest of the step outside the router (momentum,
-- finiteness checks, commit, AdamW).
local where = {}
local function timed(tbl, name, label)
  local f = tbl[name]
  tbl[name] = function(...)
    local t0 = now()
    local a, b, c = f(...)
    where[label] = (where[label] or 0) + (now() - t0)
    return a, b, c
  end
end
do
  local RM = getmetatable(require("muon.router").new(comm.world()))
  timed(RM, "_post", "post"); timed(RM, "_finish", "wait")
  local run = RM.run_batches
  RM.run_batches = function(...)
    local t0, n0 = now(), ns_seconds
    run(...)
    where.route = (where.route or 0) + (now() - t0) - (ns_seconds - n0)
  end
end
local mesh_arg, balance, d, layers = arg[2], arg[3], tonumber(arg[4]), tonumber(arg[5])
local axes = {}
for name, n in mesh_arg:gmatch("(%w+):(%d+)") do axes[#axes + 1] = { name, tonumber(n) } end
local w = comm.world()
local rank, size = w:rank(), w:size()

-- np 2, one BLAS thread per rank: one 2048 x 8192 float32 Muon matrix
-- sharded on dim 1, the engine's step with its Newton-Schulz split over
-- both ranks (split_ns = "auto") against split_ns = "off" (one owner),
-- interleaved steps of two engines in the same run: the medians of the
-- step times and their ratio (target <= 0.6).
if balance == "split" then
  local shape, mesh1 = { 2048, 8192 }, D.mesh(axes, size)
  local engines, times, order = {}, {}, { "auto", "off" }
  for _, mode in ipairs(order) do
    local e = engine.new({ groups = { { optimizer = "muon" } }, dist = { mesh = axes, split_ns = mode } })
    local box = D.local_box(shape, D.placement({ "S(1)" }, mesh1, 2), mesh1, rank)
    e:add_param("w", T.randn(box.len, 1 + rank), T.randn(box.len, 2 + rank), { "S(1)", shape = shape })
    engines[mode], times[mode] = e, {}
  end
  for round = 0, 5 do
    for _, mode in ipairs(order) do
      w:barrier()
      local t0 = now()
      engines[mode]:step()
      w:barrier()
      if round > 0 then table.insert(times[mode], now() - t0) end
    end
  end
  if rank == 0 then
    local grp = engines.auto:plan().records[1].ns_group
    local a, o = B.median(times.auto), B.median(times.off)
    print(("split step, np %d, 1 BLAS thread per rank, one 2048x8192 float32 matrix (S(1)): group of %d; "
      .. "step %.1f ms split, %.1f ms one owner (medians of 5 interleaved): split/off %.2f (target <= 0.6)")
      :format(size, grp and grp.size or 1, a * 1e3, o * 1e3, a / o))
  end
  return
end

-- A transformer-like model: attention, MLP, a stack of experts, embeddings.
local shapes = {}
for l = 1, layers do
  shapes[#shapes + 1] = { ("l%d.attn.qkv"):format(l), { 3 * d, d } }
  shapes[#shapes + 1] = { ("l%d.attn.o"):format(l), { d, d } }
  shapes[#shapes + 1] = { ("l%d.mlp.up"):format(l), { 4 * d, d } }
  shapes[#shapes + 1] = { ("l%d.mlp.down"):format(l), { d, 4 * d } }
  shapes[#shapes + 1] = { ("l%d.moe.experts"):format(l), { 4, d, math.floor(d / 2) } }
  shapes[#shapes + 1] = { ("l%d.wide"):format(l), { 2 * d, 2 * d } }
end
local function config(dist)
  local c = { groups = { { optimizer = "muon", match = "^l" }, { optimizer = "adamw" } } }
  if dist then c.dist = { mesh = axes, balance = balance } end
  return c
end
local eng = engine.new(config(true))
local one = engine.new(config(false)) -- the same model in one process (state bytes)
local mesh = D.mesh(axes, size)
local function add(e, name, shape, i, pl)
  local box = pl and D.local_box(shape, D.placement(pl, mesh, #shape), mesh, rank) or { len = shape }
  local spec = pl and { pl[1], pl[2], shape = shape } or nil
  e:add_param(name, T.randn(box.len, i), T.randn(box.len, 1000 + i), spec)
end
for i, s in ipairs(shapes) do
  add(eng, s[1], s[2], i, { "R", "S(1)" })
  if balance == "flops" and mesh_arg:find("shard:1", 1, true) then add(one, s[1], s[2], i, nil) end
end
add(eng, "embed", { 1000, d }, 7, { "R", "S(1)" })
if mesh_arg:find("shard:1", 1, true) then add(one, "embed", { 1000, d }, 7, nil) end

do
  local AM = getmetatable(eng.stepper.agree) -- (muon.agree: the step's agreements)
  for _, n in ipairs({ "gate", "run", "failure" }) do timed(AM, n, "control") end
end
local warm, steps = 2, 9
for _ = 1, warm do eng:step() end
local st0 = eng:comm_stats().data
-- Per step: this rank's step and NS seconds (the ratio line takes, per
-- step, the step time over the slowest rank's NS time, then the median).
local per_step, per_ns = {}, {}
ns_seconds = 0
where = {}
local t0 = now()
for i = 1, steps do
  local a, n0 = now(), ns_seconds
  eng:step()
  per_step[i], per_ns[i] = now() - a, ns_seconds - n0
end
local step_s = (now() - t0) / steps
local st1 = eng:comm_stats().data
local mx_step = w:allreduce(per_step, "max", "f64")
local mx_ns = w:allreduce(per_ns, "max", "f64")
local function median(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  local n = #c
  return n % 2 == 1 and c[(n + 1) / 2] or (c[n / 2] + c[n / 2 + 1]) / 2
end
local ratios = {}
for i = 1, steps do ratios[i] = mx_step[i] / mx_ns[i] end
local sent, recv = (st1.bytes_sent - st0.bytes_sent) / steps, (st1.bytes_recv - st0.bytes_recv) / steps
local plan = eng.stepper.plan
local es, er = D.step_elements(plan, rank)
local _, er_ns = D.step_elements(plan, rank, function(r) return r.ns end)
local seed_recv = D.seed_step_elements(plan, rank) * 4
local flops = 0
for _, r in ipairs(plan.records) do
  for _, it in ipairs(r.items) do
    if it.ns and it.owner == rank then flops = flops + require("muon.ns").shape_cost(it.region.len, r.nd_mode, r.ns_opts) end
  end
end
-- The owner-free floor of the items this rank owns: whoever owns an item,
-- every source piece but the largest moves in and every destination piece
-- but the largest moves out.
local floor = 0
for _, r in ipairs(plan.records) do
  for _, it in ipairs(r.items) do
    if it.owner == rank then
      local sin, min_, sout = 0, 0, 0
      for _, sp in ipairs(it.sources) do
        local n = D.numel(sp.box.len)
        sin, min_ = sin + n, math.max(min_, n)
      end
      for _, dp in ipairs(D.dests(it)) do sout = sout + D.numel(dp.box.len) end
      floor = floor + (sin - min_) + (sout - min_)
    end
  end
end
local mem = eng:memory()
local line = { rank, sent, recv, es * 4, er * 4, seed_recv, flops, ns_seconds / steps, step_s,
  (st1.seconds - st0.seconds) / steps, mem.state_bytes, mem.scratch_bytes, er_ns * 4, floor * 4,
  (where.post or 0) / steps, (where.wait or 0) / steps, (where.control or 0) / steps, (where.route or 0) / steps }
local rows = {}
for q = 0, size - 1 do
  local v = {}
  for i = 1, #line do v[i] = q == rank and line[i] or 0 end
  rows[q] = w:allreduce(v, "sum", "f64")
end
if rank == 0 then
  local total = 0
  for _, s in ipairs(shapes) do total = total + D.numel(s[2]) end
  local blas1 = os.getenv("OPENBLAS_NUM_THREADS") == "1"
  print(("dist_bench: np=%d mesh %s, d=%d, %d layers (%d Muon matrices, %.2f M elements) + a 1000x%d AdamW embedding, float32, owners by %s%s")
    :format(size, mesh:describe(), d, layers, #shapes, total / 1e6, d, balance,
      size > 2 and " [oversubscribed: np > 2 ranks time-share 2 cores]" or (blas1 and " [one rank per core, one BLAS thread each]" or "")))
  if mesh_arg:find("shard:1", 1, true) then
    one:step()
    local ob = one:memory().state_bytes
    local worst = 0
    for q = 0, size - 1 do
      local r = rows[q]
      worst = math.max(worst, r[11] / ob)
      print(("rank %d: state %d B (%.3fx one process's %d B), scratch %d B, step %.1f ms")
        :format(q, r[11], r[11] / ob, ob, r[12], r[9] * 1e3))
    end
    print(("replicated state: the largest rank holds %.3fx the state of one process (target <= 0.55x)"):format(worst))
  else
    print("rank  sent B/step  recv B/step  formula(sent,recv)   NS recv  seed NS recv  ratio  NS GFLOP  NS ms  step ms  comm ms  state B")
    local mx, tot, mxt, seedtot, ourtot, sent_tot, floor_tot = 0, 0, 0, 0, 0, 0, 0
    for q = 0, size - 1 do
      local r = rows[q]
      print(("%4d  %11d  %11d  (%d, %d)  %8d  %12d  %5.2f  %8.3f  %5.1f  %7.1f  %7.1f  %7d"):format(q, r[2], r[3], r[4], r[5],
        r[13], r[6], r[6] / math.max(r[13], 1), r[7] * 5 / 1e9, r[8] * 1e3, r[9] * 1e3, r[10] * 1e3, r[11]))
      mx = math.max(mx, r[7]); tot = tot + r[7]; mxt = math.max(mxt, r[8])
      seedtot, ourtot = seedtot + r[6], ourtot + r[13]
      sent_tot, floor_tot = sent_tot + r[4], floor_tot + r[14]
    end
    for q = 0, size - 1 do
      local r = rows[q]
      print(("rank %d, ms per step: NS %.1f, router posts (packing + posting) %.1f, router waits (peers + unpacking) %.1f, "
        .. "router other %.1f, control all-reduces %.1f, rest of the step (momentum, checks, commit, AdamW) %.1f")
        :format(q, r[8] * 1e3, r[15] * 1e3, r[16] * 1e3, (r[18] - r[15] - r[16]) * 1e3, r[17] * 1e3,
          (r[9] - r[18] - r[17] - r[8]) * 1e3))
    end
    print(("data bytes per step, all ranks: %d B against the owner-free floor %d B: %.3fx (target <= 1.05); "
      .. "NS imbalance by flops (largest rank / mean): %.3f (target <= 1.05; the plan's: %.3f)")
      :format(sent_tot, floor_tot, sent_tot / math.max(floor_tot, 1), mx / (tot / size), D.imbalance(plan)))
    print(("NS routing received per step, all ranks: ours %d B, the seed's scheme %d B (%.2fx less); NS flops max/mean = %.3f; max NS time %.1f ms/step")
      :format(ourtot, seedtot, seedtot / math.max(ourtot, 1), mx / (tot / size), mxt * 1e3))
    print(("overlap%s: median over %d steps: step %.1f ms, slowest rank's NS %.1f ms, step / slowest NS = %.3f (target <= 1.05 at np 2, one BLAS thread per rank); "
      .. "data exchanges %d non-blocking of %d, %d already done at their wait")
      :format(size > 2 and " (oversubscribed)" or "", steps, median(mx_step) * 1e3, median(mx_ns) * 1e3, median(ratios), st1.nonblocking - st0.nonblocking,
        st1.calls - st0.calls, st1.done_before_wait - st0.done_before_wait))
    if size == 2 and blas1 then
      -- The same model in one process (no routing, no control traffic):
      -- its step / NS is what momentum, checks, commit and AdamW add alone.
      local solo = engine.new(config(false))
      for i, s in ipairs(shapes) do add(solo, s[1], s[2], i, nil) end
      add(solo, "embed", { 1000, d }, 7, nil)
      for _ = 1, warm do solo:step() end
      local sr = {}
      for i = 1, steps do
        local a, n0 = now(), ns_seconds
        solo:step()
        sr[i] = (now() - a) / (ns_seconds - n0)
      end
      print(("the same model in one process (one BLAS thread, rank 0 alone, the other rank idle): median step / NS = %.3f "
        .. "(what the work outside Newton-Schulz adds without any communication)"):format(median(sr)))
    end
  end
end
w:barrier()
comm.finalize()
