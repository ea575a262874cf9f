-- Split Newton-Schulz in the engine's step under mpirun against the same
-- engine in one process (MU_NS_SPLIT_PLAN="64,16,16", set for every rank
-- by tests/mpi/split_step.sh, makes these small matrices blocked).
--   build/muon run tests/mpi/split_step_check.lua MODE MESH
-- MODE: "one" (one wide matrix dominates: it splits), "two" (a wide and a
-- tall one of equal cost: both split once there are more ranks than
-- matrices); MESH as tests/mpi/dist_check.lua.
-- Checks: the plan split what the rule says; 4 steps bitwise equal to
-- one process (values, momentum); the split NS bytes (comm_stats().split_ns)
-- equal the machines' formula; eng:stats() counts each split matrix once
-- (ns_matrices as one process's); a NaN gradient on one rank fails the step
-- on every rank, nothing changed; MU_NS_SPLIT_PLAN different on the last
-- rank fails a new engine's first step on every rank, naming it.
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local ns = require("muon.ns")
local E = require("muon.errors")
local engine = require("muon.engine")
local ffi = require("ffi")
ffi.cdef("int setenv(const char *, const char *, int);")

local mode, mesh_arg = arg[1], arg[2]
local AXES = H.axes(mesh_arg)

-- name, global shape, shard dims (shard, shard2 axes), group
local PARAMS = mode == "one" and {
  { "wide", { 96, 192 }, { 1, 2 }, 1 }, { "tall", { 160, 48 }, { 2, 1 }, 1 }, { "small", { 8, 12 }, { 1, 2 }, 1 },
  { "bias", { 10 }, { 1 }, 2 },
} or {
  { "wide", { 96, 192 }, { 2, 1 }, 1 }, { "tall", { 192, 96 }, { 1, 2 }, 1 }, { "small", { 8, 12 }, { 1, 2 }, 1 },
  { "bias", { 10 }, { 1 }, 2 },
}
local SPLIT = mode == "one" and { wide = true } or { wide = true, tall = true }

local function config(dist)
  return H.grouped_config({ { name = "muon", optimizer = "muon", lr = 0.02, weight_decay = 0.1 },
    { name = "adamw", optimizer = "adamw", lr = 1e-2 } }, PARAMS, dist and AXES)
end

H.main(function()
  H.init()
  local W = H.size
  local ref, eng = engine.new(H.alone(config(false))), engine.new(config(true))
  local locals = H.add_mesh_params(ref, eng, PARAMS, AXES)
  local function set_grads(step, nan_on)
    for name, l in pairs(locals) do
      local g = T.randn(l.spec[2], H.seed_of(name) * 64 + step)
      ref:param(name).grad:copy(g)
      if H.numel(l.box.len) > 0 then
        l.grad:copy(D.box_view(g, l.box))
        if nan_on == name then l.grad:fill(0 / 0) end
      end
    end
  end
  -- the plan: what splits (more than one rank, the rule's records)
  local plan = eng:plan()
  local split_ok, why = true, nil
  for _, r in ipairs(plan.records) do
    local want = W > 1 and SPLIT[r.name] or false
    if (r.ns_group ~= nil) ~= (want == true) then split_ok, why = false, ("%s: split %s"):format(r.name, tostring(r.ns_group ~= nil)) end
  end
  H.check("split-step-plan-splits-the-rule's-matrices", split_ok, why)
  local elements_ok, detail = true, nil
  for step = 1, 4 do
    set_grads(step)
    local before = step > 1 and eng:comm_stats().data or nil
    eng:step()
    if before then
      local after = eng:comm_stats().data
      local s, v = D.step_elements(eng.stepper.plan, H.rank)
      if after.bytes_sent - before.bytes_sent ~= 4 * s or after.bytes_recv - before.bytes_recv ~= 4 * v then
        elements_ok = false
        detail = ("step %d: sent %d (plan %d), received %d (plan %d)"):format(step, after.bytes_sent - before.bytes_sent,
          4 * s, after.bytes_recv - before.bytes_recv, 4 * v)
      end
    end
    assert(H.ref_step(ref))
  end
  H.check("split-step-data-bytes-are-the-plan's", elements_ok, detail)
  local ok, first = true, nil
  for name, l in pairs(locals) do
    local good, w = H.bits_equal(l.value, D.box_view(ref:param(name).value, l.box))
    if not good then ok, first = false, first or (name .. " value " .. w) end
    for k, t in pairs(eng:state(name) or {}) do
      if T.is_tensor(t) then
        local g2, w2 = H.bits_equal(t, D.box_view(ref:state(name)[k], l.box))
        if not g2 then ok, first = false, first or (name .. " " .. k .. " " .. w2) end
      end
    end
  end
  H.check("split-step-bitwise-4-steps", ok, first)
  local es, rs = eng:stats(), ref:stats()
  H.check("split-step-stats-count-matrices-as-one-process", es.ns_matrices == rs.ns_matrices,
    ("%s matrices, one process %s"):format(tostring(es.ns_matrices), tostring(rs.ns_matrices)))
  -- the groups' traffic: per step and group, the call's and the matrix's
  local sent, recv = 0, 0
  for _, r in ipairs(eng.stepper.plan.records) do
    local grp = r.ns_group
    if grp then
      for gq, q in ipairs(grp.ranks) do
        if q == H.rank then
          local c = ns.split_cost(r.shape[1], r.shape[2], r.ns_opts, grp.size, gq - 1)
          sent, recv = sent + 4 * (c.call_bytes_sent + c.bytes_sent), recv + 4 * (c.call_bytes_recv + c.bytes_recv)
        end
      end
    end
  end
  local st = eng:comm_stats().split_ns
  H.check("split-step-bytes-are-the-formula", st.bytes_sent == sent and st.bytes_recv == recv,
    ("sent %d (formula %d), received %d (formula %d)"):format(st.bytes_sent, sent, st.bytes_recv, recv))
  -- a NaN gradient of a split matrix on the last rank: every rank fails
  local before = {}
  for name, l in pairs(locals) do before[name] = l.value:clone() end
  set_grads(5, H.rank == W - 1 and "wide" or nil)
  local sok, err = pcall(eng.step, eng)
  local same = true
  for name, l in pairs(locals) do same = same and H.bits_equal(l.value, before[name]) end
  H.check("split-step-nan-fails-every-rank-nothing-changed", not sok and same, tostring(err))
  -- the plan's sizes differ on the last rank: the ranks would plan
  -- different groups (and wait on each other); the first step fails on
  -- every rank naming the variable, nothing changed
  if W > 1 then
    local plan_env = os.getenv("MU_NS_SPLIT_PLAN")
    if H.rank == W - 1 then ffi.C.setenv("MU_NS_SPLIT_PLAN", "off", 1) end
    local e2 = engine.new(config(true))
    local vals = {}
    for _, spec in ipairs(PARAMS) do
      local l = locals[spec[1]]
      local pl = H.placement(AXES, spec)
      pl.shape = spec[2]
      vals[spec[1]] = l.value:clone()
      e2:add_param(spec[1], vals[spec[1]], l.grad:clone(), pl)
    end
    local ok2, err2 = pcall(e2.step, e2)
    ffi.C.setenv("MU_NS_SPLIT_PLAN", plan_env, 1)
    local msg = not ok2 and E.message(err2) or ""
    local kept = true
    for name, l in pairs(locals) do kept = kept and H.bits_equal(vals[name], l.value) end
    H.check("split-step-plan-env-differs-fails-every-rank", not ok2 and kept and msg:find(
      ("configs differ across ranks at MU_NS_SPLIT_PLAN: rank 0 has 64,16,16, rank %d has off"):format(W - 1), 1, true)
      ~= nil, msg)
  end
end)
