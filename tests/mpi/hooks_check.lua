-- The research hooks under mpirun against the same engine in one process.
--   build/muon run tests/mpi/hooks_check.lua MODE MESH [PATH]
-- MESH as tests/mpi/dist_check.lua: "shard:4", "replicate:2,shard:2",
-- "shard:2,shard2:2" (shard: a parameter's first shard dim, shard2: its
-- second).
-- MODE:
--   variants  AdaMuon, Newton-Muon and MuonH (the shipped configs' hooks:
--             pre_ortho_fn with matrix and cols_cols state, post_ortho_fn,
--             post_update_fn with ctx.global_norm on sharded weights) and a
--             post_update_fn of every reduction: 10 steps bitwise equal to
--             one process (values, momentum, hook state; the reductions'
--             results); the mesh's checkpoint of step 5 holds the
--             one-process state bitwise (PATH)
--   mismatch  post_update_fn calls ctx.allreduce once more on one rank,
--             with another op on one rank, or raises on one rank while the
--             others reduce: every rank fails the step with the same
--             message naming the parameter and both sides (no hang)
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local engine = require("muon.engine")

local mode, mesh_arg, path = arg[1], arg[2], arg[3]

local AXES = H.axes(mesh_arg)

-- name, global shape, shard dims (shard, shard2 axes), group
local PARAMS = {
  { "a.w", { 8, 6 }, { 1, 2 }, 1 }, { "a.experts", { 3, 6, 4 }, { 1, 2 }, 1 },
  { "n.w", { 9, 5 }, { 1, 2 }, 2 }, { "n.col", { 5, 7 }, { 2, 1 }, 2 }, { "n.empty", { 2, 9 }, { 1, 2 }, 2 },
  { "h.w", { 10, 6 }, { 1, 2 }, 3 }, { "h.col", { 6, 11 }, { 2, 1 }, 3 }, { "h.rep", { 6, 6 }, {}, 3 },
  { "r.w", { 7, 5 }, { 1, 2 }, 4 },
  { "bias", { 10 }, { 1 }, 5 },
}
local seed_of = H.seed_of
local numel = H.numel

local bits_equal = H.bits_equal

-- What the reductions returned, per engine: seen[tag][name][step] = list.
local seen = {}
local function record(tag, ctx, values)
  local t = seen[tag] or {}
  seen[tag] = t
  t[ctx.param_fqn] = t[ctx.param_fqn] or {}
  t[ctx.param_fqn][ctx.step] = values
end

local BAD = {} -- mismatch mode: what this rank does wrong (set per step)

local function config(dist, tag)
  local ada = dofile("configs/adamuon.lua").groups[1]
  local newton = dofile("configs/newton_muon.lua").groups[1]
  local ball = dofile("configs/muonh.lua").groups[1]
  local groups = {
    { name = "adamuon", optimizer = "muon", lr = 0.02, weight_decay = 0.1, matched_adamw_rms = 0,
      zero_rms_scale_mode = "use_lr", hook_state = ada.hook_state, pre_ortho_fn = ada.pre_ortho_fn,
      post_ortho_fn = ada.post_ortho_fn },
    { name = "newton", optimizer = "muon", lr = 0.02, weight_decay = 0.1, hook_state = newton.hook_state,
      pre_ortho_fn = newton.pre_ortho_fn },
    { name = "muonh", optimizer = "muon", lr = 0.02, weight_decay = 0, matched_adamw_rms = 0,
      zero_rms_scale_mode = "use_lr", post_ortho_fn = ball.post_ortho_fn, post_update_fn = ball.post_update_fn },
    { name = "reduce", optimizer = "muon", lr = 0.03,
      post_update_fn = function(_, w, ctx)
        local v = { ctx.allreduce(w, "sum"), ctx.allreduce(w, "max"), ctx.allreduce(w, "min"), ctx.global_norm(w),
          ctx.allreduce(w:mul(w):mul(w), "sum") }
        if BAD.extra then v[#v + 1] = ctx.allreduce(w, "sum") end
        if BAD.op then v[#v + 1] = ctx.allreduce(w, "max") elseif BAD.other_op then v[#v + 1] = ctx.allreduce(w, "min") end
        if BAD.raise then error("boom on this rank", 0) end
        if BAD.raise_peer then v[#v + 1] = ctx.allreduce(w, "sum") end
        record(tag, ctx, v)
      end },
    { name = "adamw", optimizer = "adamw", lr = 1e-2 },
  }
  return H.grouped_config(groups, PARAMS, dist and AXES)
end

local function setup()
  local ref = engine.new(H.alone(config(false, "ref")))
  local eng = engine.new(config(true, "mesh"))
  local locals = H.add_mesh_params(ref, eng, PARAMS, AXES, function(spec, full)
    if spec[4] == 3 then -- MuonH: on its sphere (radius sqrt(rows))
      local rows = 1
      for d = 1, #spec[2] - 1 do rows = rows * spec[2][d] end
      full:mul_(math.sqrt(rows) / full:norm())
    end
  end)
  return ref, eng, locals
end

local function set_inputs(ref, eng, locals, step)
  for name, l in pairs(locals) do
    local g = T.randn(l.spec[2], seed_of(name) * 64 + step)
    ref:param(name).grad:copy(g)
    if numel(l.box.len) > 0 then l.grad:copy(D.box_view(g, l.box)) end
    if l.spec[4] == 2 then
      local cols = l.spec[2][#l.spec[2]]
      local Z = T.randn({ cols, 2 * cols }, seed_of(name) + 7 * step, "float64")
      local zz = Z:mm(Z:transpose(1, 2)):div(2 * cols):flat()
      ref:set_signal("zz." .. name, zz)
      eng:set_signal("zz." .. name, zz)
    end
  end
end

H.main(function()
  H.init()
  local W, me = H.size, H.rank
  local function ref_step(ref) assert(H.ref_step(ref)) end
  if mode == "variants" then
    local ref, eng, locals = setup()
    for step = 1, 10 do
      set_inputs(ref, eng, locals, step)
      eng:step()
      ref_step(ref)
      if step == 5 and path then
        eng:save(path)
        local one = engine.new(H.alone(config(false, "one")))
        for _, spec in ipairs(PARAMS) do one:add_param(spec[1], T.zeros(spec[2]), T.zeros(spec[2])) end
        one:load(path)
        local same, first = true, nil
        for _, spec in ipairs(PARAMS) do
          for k, t in pairs(ref:state(spec[1]) or {}) do
            if T.is_tensor(t) and not bits_equal(one:state(spec[1])[k], t) then
              same, first = false, first or (spec[1] .. " " .. k)
            end
          end
        end
        H.check("hooks-checkpoint-holds-the-one-process-state", same, first)
      end
    end
    local ok, first = true, nil
    for name, l in pairs(locals) do
      local good, why = bits_equal(l.value, D.box_view(ref:param(name).value, l.box))
      if not good then ok, first = false, first or (name .. " value " .. why) end
      local s, rs = eng:state(name), ref:state(name)
      for k, t in pairs(s or {}) do
        if T.is_tensor(t) then
          local box = k:find("^hook%.") and eng.stepper:record(eng:param(name)).hook_records[k].mine or l.box
          local g2, why2 = bits_equal(t, D.box_view(rs[k], box))
          if not g2 then ok, first = false, first or (name .. " " .. k .. " " .. why2) end
        end
      end
    end
    H.check("hooks-variants-bitwise-10-steps", ok, first)
    local same, detail = true, nil
    for step = 1, 10 do
      for _, name in ipairs({ "r.w" }) do
        local a, b = seen.ref[name][step], seen.mesh[name][step]
        for i = 1, #a do
          if a[i] ~= b[i] then same, detail = false, detail or ("%s step %d value %d: %.17g vs %.17g"):format(name, step, i, a[i], b[i]) end
        end
      end
    end
    H.check("hooks-reductions-bitwise", same, detail)
    -- MuonH's weights stay on their sphere (the mesh's norm of the whole)
    local onball = true
    for _, name in ipairs({ "h.w", "h.col", "h.rep" }) do
      local w = ref:param(name).value
      local rows = w:size(1)
      onball = onball and math.abs(w:norm() - math.sqrt(rows)) < 1e-5 * math.sqrt(rows)
    end
    H.check("hooks-muonh-on-the-sphere", onball)
  elseif mode == "mismatch" then
    local _, eng = setup()
    local last = W - 1
    local cases = {
      { "extra-call", { extra = me == last },
        ("rank 0 had returned from its hooks, rank %d made call 6 for parameter 'r.w' (post_update_fn): ctx.allreduce(x, 'sum')") },
      { "other-op", { op = me ~= last, other_op = me == last },
        ("rank 0 made call 6 for parameter 'r.w' (post_update_fn): ctx.allreduce(x, 'max'), rank %d made call 6 for parameter 'r.w' (post_update_fn): ctx.allreduce(x, 'min')") },
      { "raise-while-others-reduce", { raise = me == last, raise_peer = me ~= last },
        ("rank 0 made call 6 for parameter 'r.w' (post_update_fn): ctx.allreduce(x, 'sum'), rank %d had stopped: one of its hooks raised an error") },
    }
    for k, c in ipairs(cases) do
      for key in pairs(BAD) do BAD[key] = nil end
      for key, v in pairs(c[2]) do BAD[key] = v end
      for _, p in ipairs(PARAMS) do
        local g = eng:param(p[1]).grad
        if g:numel() > 0 then g:copy(T.randn(g:size(), 100 * k + seed_of(p[1]))) end
        if p[4] == 2 then
          local cols = p[2][#p[2]]
          local Z = T.randn({ cols, 2 * cols }, 9 * k, "float64")
          eng:set_signal("zz." .. p[1], Z:mm(Z:transpose(1, 2)):flat())
        end
      end
      local ok, err = pcall(eng.step, eng)
      local msg = tostring(err)
      if W == 1 then
        -- one process: no mismatch is possible (the raise still fails)
        H.check("mismatch-" .. c[1], (c[2].raise and not ok) or (not c[2].raise and ok), msg)
      else
        local want = c[3]:format(last)
        local good = not ok and msg:find(want, 1, true) ~= nil
        if c[1] == "raise-while-others-reduce" then
          -- the lowest failing rank's error: rank 0's mismatch, naming the rank that raised
          good = not ok and (msg:find(want, 1, true) ~= nil or msg:find("boom on this rank", 1, true) ~= nil)
        end
        H.check("mismatch-" .. c[1], good, msg)
      end
    end
  end
end)
