-- Distributed step benchmark (`make bench`): relaunches itself under mpirun
-- (np 4, mesh 2x2: replicate x shard, the DESIGN.md recipe) and prints, per
-- rank, the bytes its NS routing moves per step (measured by the counters,
-- and the plan's formula) next to what the seed's all-gather + full-update
-- broadcast + replica broadcast would move for the same owners; then the
-- owner rule's balance by NS flops vs by numel (modeled and measured).
--   luajit tests/bench/dist_bench.lua [d] [layers]
local comm = require("muon.comm")

local function sh(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

if comm.world_size() == 1 and arg[1] ~= "--worker" then
  local d, layers = arg[1] or "256", arg[2] or "3"
  local env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
    .. "OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl=self,vader OMPI_MCA_plm=isolated"
  local host = io.open("build/muon", "r") and "build/muon run" or "luajit"
  if host == "build/muon run" then io.close(io.open("build/muon", "r")) end
  for _, balance in ipairs({ "flops", "numel" }) do
    local cmd = ("%s timeout -k 10 300 mpirun --timeout 280 --stdin none -np 4 %s tests/bench/dist_bench.lua --worker %s %s %s </dev/null")
      :format(env, host, sh(balance), sh(d), sh(layers))
    local ok = os.execute(cmd)
    if ok ~= 0 and ok ~= true then error("dist_bench: mpirun failed (" .. tostring(ok) .. ")") end
  end
  return
end

local T = require("muon.tensor")
local D = require("muon.dist")
local DS = require("muon.optim.dist_step")

local balance, d, layers = arg[2], tonumber(arg[3]), tonumber(arg[4])
local w = comm.world()
local rank, size = w:rank(), w:size()
local mesh_spec = { { "replicate", 2 }, { "shard", math.floor(size / 2) } }
if size % 2 ~= 0 then mesh_spec = { { "replicate", 1 }, { "shard", size } } end

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
local ds = DS.new({ comm = w, mesh = mesh_spec, balance = balance,
  groups = { { optimizer = "muon" }, { optimizer = "adamw" } } })
local grads = {}
for i, s in ipairs(shapes) do
  local pl = { "R", "S(1)" }
  local box = D.local_box(s[2], D.placement(pl, ds.mesh, #s[2]), ds.mesh, rank)
  local v = T.randn(box.len, i)
  local g = T.randn(box.len, 1000 + i)
  grads[i] = g
  ds:add_param(s[1], v, g, { shape = s[2], placement = pl, group = 1 })
end
local ebox = D.local_box({ 1000, d }, D.placement({ "R", "S(1)" }, ds.mesh, 2), ds.mesh, rank)
ds:add_param("embed", T.randn(ebox.len, 7), T.randn(ebox.len, 8), { shape = { 1000, d }, placement = { "R", "S(1)" }, group = 2 })

local warm, steps = 2, 5
for _ = 1, warm do ds:step() end
ds.data:reset_stats()
ds.stats.ns_seconds, ds.stats.step_seconds = 0, 0
for _ = 1, steps do ds:step() end
local st = ds.data:stats()
local es, er = ds:expected_step_bytes()
local seed_recv = 0
for _, r in ipairs(ds.records) do
  if r.kind == "owner" then
    seed_recv = seed_recv + D.seed_step_elements({ mesh = ds.mesh, records = { r } }, rank) * 4
  end
end
-- Modeled NS flops per rank under this plan.
local flops = 0
for _, r in ipairs(ds.records) do
  if r.owner == rank then flops = flops + D.ns_flops(r.shape) end
end
local line = { rank, st.bytes_sent / steps, st.bytes_recv / steps, es, er, seed_recv, flops,
  ds.stats.ns_seconds / steps, ds.stats.step_seconds / steps, st.seconds / steps }
local all = {}
for i = 1, #line do all[i] = 0 end
-- Gather every rank's line on rank 0 (sum of one-hot vectors).
local rows = {}
for q = 0, size - 1 do
  local v = {}
  for i = 1, #line do v[i] = q == rank and line[i] or 0 end
  rows[q] = w:allreduce(v, "sum", "f64")
end
if rank == 0 then
  local total = 0
  for _, s in ipairs(shapes) do total = total + D.numel(s[2]) end
  print(("dist_bench: np=%d mesh %s, d=%d, %d layers (%d Muon matrices, %.2f M elements), float32, balance by %s")
    :format(size, ds.mesh:describe(), d, layers, #shapes, total / 1e6, balance))
  print("rank  sent B/step  recv B/step  formula(sent,recv)   seed recv B/step  ratio  NS GFLOP  NS ms  step ms  comm ms")
  local mx, tot, mxt, seedtot, ourtot = 0, 0, 0, 0, 0
  for q = 0, size - 1 do
    local r = rows[q]
    print(("%4d  %11d  %11d  (%d, %d)  %16d  %5.2f  %8.3f  %5.1f  %7.1f  %7.1f"):format(q, r[2], r[3], r[4], r[5], r[6],
      r[6] / math.max(r[3], 1), r[7] * 5 / 1e9, r[8] * 1e3, r[9] * 1e3, r[10] * 1e3))
    mx = math.max(mx, r[7]); tot = tot + r[7]; mxt = math.max(mxt, r[8])
    seedtot, ourtot = seedtot + r[6], ourtot + r[3]
  end
  print(("total recv per step: ours %d B, seed %d B (%.2fx less); NS flops max/mean = %.3f; max NS time %.1f ms/step")
    :format(ourtot, seedtot, seedtot / math.max(ourtot, 1), mx / (tot / size), mxt * 1e3))
  -- The two owner rules side by side on this model (modeled NS flops).
  local costs_f, costs_n, nsr = {}, {}, {}
  for _, r in ipairs(ds.records) do
    if r.kind == "owner" then
      costs_f[#costs_f + 1] = D.ns_flops(r.shape)
      costs_n[#costs_n + 1] = r.numel
    end
  end
  local of = D.build_owner_by_size(costs_f, size)
  local on = D.build_owner_by_size(costs_n, size)
  print(("modeled NS-flop imbalance (max/mean): owners by flops %.3f, owners by numel %.3f")
    :format(D.imbalance(of, costs_f, size), D.imbalance(on, costs_f, size)))
  if balance == "flops" then
    local parts = {}
    for _, n in ipairs({ 2, 3, 4, 6, 8, 16 }) do
      local a = D.build_owner_by_size(costs_f, n)
      local b = D.build_owner_by_size(costs_n, n)
      parts[#parts + 1] = ("np=%d %.3f vs %.3f"):format(n, D.imbalance(a, costs_f, n), D.imbalance(b, costs_f, n))
    end
    print("same model, NS-flop makespan/mean, owners by flops vs by numel: " .. table.concat(parts, "; "))
  end
end
w:barrier()
comm.finalize()
