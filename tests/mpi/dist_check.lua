-- The distributed step under mpirun against the same run in one process.
--   luajit tests/mpi/dist_check.lua equal A B      mesh {{"replicate",A},{"shard",B}}: 10 steps, bitwise
--   luajit tests/mpi/dist_check.lua save A B PATH   5 steps, save (full tensors) to PATH
--   luajit tests/mpi/dist_check.lua resume A B PATH load PATH at step 5, 5 more steps, bitwise vs 10
--   luajit tests/mpi/dist_check.lua shape A B       the last rank registers a different global shape
--   luajit tests/mpi/dist_check.lua hook A B        reshape_fn raises on the owner of one parameter
--   luajit tests/mpi/dist_check.lua posthook A B    post_update_fn raises on rank 1 only
-- Each rank computes the single-process reference itself on full tensors.
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local DS = require("muon.optim.dist_step")
local Muon = require("muon.optim.muon")
local AdamW = require("muon.optim.adamw")
local P = require("muon.param")
local foreach = require("muon.foreach")

local mode, A, B, path = arg[1], tonumber(arg[2]), tonumber(arg[3]), arg[4]

-- Parameters: name, global shape, placement on (axis 1, axis 2), group.
local PARAMS = {
  { "w_even", { 8, 6 }, { "R", "S(1)" }, 1 },
  { "w_uneven", { 7, 5 }, { "R", "S(1)" }, 1 },
  { "w_empty", { 2, 9 }, { "R", "S(1)" }, 1 },     -- empty shards at 3 and 4 ranks
  { "w_col", { 5, 10 }, { "R", "S(2)" }, 2 },
  { "experts", { 3, 6, 4 }, { "R", "S(1)" }, 1 },  -- 3-D expert stack, sharded over experts
  { "experts_in", { 4, 5, 6 }, { "R", "S(2)" }, 2 },
  { "conv", { 6, 1, 5 }, { "R", "S(1)" }, 1 },     -- conv-like A x 1 x B
  { "rep", { 6, 6 }, { "R", "R" }, 1 },            -- replicated everywhere
  { "w2d", { 9, 7 }, { "S(1)", "S(2)" }, 1 },      -- two axes shard dims 1 and 2
  { "w2d_t", { 5, 11 }, { "S(2)", "S(1)" }, 2 },
  { "nested", { 13, 3 }, { "S(1)", "S(1)" }, 1 },  -- two axes shard the same dim
  { "nograd", { 4, 4 }, { "R", "S(1)" }, 1, nograd = true },
  { "w_f64", { 6, 5 }, { "R", "S(2)" }, 4, dtype = "float64" },   -- a float64 group
  { "embed", { 9, 4 }, { "R", "S(2)" }, 3 },       -- AdamW, sharded
  { "bias", { 10 }, { "R", "S(1)" }, 3 },          -- AdamW, 1-D
}

local seen_shapes = {}
local function post_update(p, value, ctx)
  seen_shapes[p.name] = table.concat(ctx.logical_shape, "x")
  foreach.scale({ value }, 0.999)
end

local function groups(hooks)
  hooks = hooks or {}
  return {
    { optimizer = "muon", lr = 0.02, weight_decay = 0.1, reshape_fn = hooks.reshape_fn },
    { optimizer = "muon", lr = 0.05, weight_decay = 0.01, nesterov = false, ns_variant = "legacy",
      momentum = { 0.9, 0.8 }, post_update_fn = hooks.post_update_fn or post_update },
    { optimizer = "adamw", lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.01 },
    { optimizer = "muon", lr = 0.03, weight_decay = 0.05 },
  }
end

local function seed_of(name)
  return D.hash(name) % 100000
end

local function grad_for(spec, step)
  return T.randn(spec[2], seed_of(spec[1]) * 64 + step, spec.dtype or "float32")
end

-- Single-process reference on full tensors: returns params by name and a stepper.
local function reference(hooks)
  local gs = groups(hooks)
  local byname, lists = {}, { {}, {}, {}, {} }
  for _, spec in ipairs(PARAMS) do
    local p = P.new(spec[1], T.randn(spec[2], seed_of(spec[1]), spec.dtype or "float32"),
      (not spec.nograd) and T.zeros(spec[2], spec.dtype or "float32") or nil)
    byname[spec[1]] = p
    table.insert(lists[spec[4]], p)
  end
  local function group_table(i)
    local g = { params = lists[i] }
    for k, v in pairs(gs[i]) do if k ~= "optimizer" then g[k] = v end end
    return g
  end
  local muon = Muon.new({ group_table(1), group_table(2), group_table(4) }, {})
  local adamw = AdamW.new({ group_table(3) }, {})
  local step = 0
  local function advance(n)
    for _ = 1, n do
      step = step + 1
      for _, spec in ipairs(PARAMS) do
        if not spec.nograd then byname[spec[1]].grad:copy(grad_for(spec, step)) end
      end
      muon:step()
      adamw:step()
    end
  end
  return byname, advance, muon, adamw
end

local function box_of(t, box, shape)
  local v = t
  for d = 1, #shape do
    if box.len[d] ~= shape[d] then v = v:narrow(d, box.start[d] + 1, box.len[d]) end
  end
  return v
end

local function numel(s) local n = 1 for _, x in ipairs(s) do n = n * x end return n end

-- The distributed run: this rank's shards.
local function distributed(w, hooks, opts)
  opts = opts or {}
  local ds = DS.new({ comm = w, mesh = { { "replicate", A }, { "shard", B } }, groups = groups(hooks) })
  local locals = {}
  for _, spec in ipairs(PARAMS) do
    local shape = spec[2]
    if opts.bad_shape and spec[1] == "w_even" and H.rank == H.size - 1 then shape = { 8, 7 } end
    local pl = D.placement(spec[3], ds.mesh, #shape)
    local box = D.local_box(shape, pl, ds.mesh, H.rank)
    local dt = spec.dtype or "float32"
    local full = T.randn(shape, seed_of(spec[1]), dt)
    local value = numel(box.len) > 0 and box_of(full, box, shape):clone() or T.zeros(box.len, dt)
    local grad = (not spec.nograd) and T.zeros(box.len, dt) or nil
    ds:add_param(spec[1], value, grad, { shape = shape, placement = spec[3], group = spec[4] })
    locals[spec[1]] = { value = value, grad = grad, box = box, shape = shape, spec = spec }
  end
  local step = 0
  local function advance(n)
    for _ = 1, n do
      step = step + 1
      for _, l in pairs(locals) do
        if l.grad and numel(l.box.len) > 0 then l.grad:copy(box_of(grad_for(l.spec, step), l.box, l.shape)) end
      end
      ds:step()
    end
  end
  local function set_step(s) step = s end
  return ds, locals, advance, set_step
end

local function bits_equal(a, b)
  if a:numel() ~= b:numel() then return false, "numel differs" end
  if a:numel() == 0 then return true end
  local fa, fb = a:contiguous():flat(), b:contiguous():flat()
  for i = 1, #fa do
    if fa[i] ~= fb[i] then return false, ("element %d: %.9g vs %.9g"):format(i, fa[i], fb[i]) end
  end
  return true
end

local function compare(tag, ds, locals, ref, muon_ref, adamw_ref)
  local all_ok, first = true, nil
  for name, l in pairs(locals) do
    local rv = box_of(ref[name].value, l.box, l.shape)
    local ok, why = bits_equal(l.value, rv)
    if not ok then all_ok = false; first = first or (name .. " value " .. why) end
    local dp = ds.by_name[name].param
    local opt = l.spec[4] == 3 and ds.adamw or ds.muon
    local ropt = l.spec[4] == 3 and adamw_ref or muon_ref
    local s, rs = opt.state[dp], ropt.state[ref[name]]
    if (s == nil) ~= (rs == nil) then all_ok = false; first = first or (name .. " state presence") end
    if s and rs then
      for _, k in ipairs({ "momentum_buffer", "exp_avg", "exp_avg_sq" }) do
        if rs[k] then
          local ok2, why2 = bits_equal(s[k], box_of(rs[k], l.box, l.shape))
          if not ok2 then all_ok = false; first = first or (name .. " " .. k .. " " .. why2) end
        end
      end
    end
  end
  H.check(tag, all_ok, first)
end

H.main(function()
  local w = H.init()
  local label = ("mesh %dx%d"):format(A, B)
  if mode == "equal" then
    local ref, radv, rm, ra = reference()
    radv(10)
    local ds, locals, advance = distributed(w)
    advance(10)
    compare("bitwise-10-steps", ds, locals, ref, rm, ra)
    local st = ds:comm_stats().data
    local es, er = ds:expected_step_bytes()
    H.check("bytes-vs-formula", st.bytes_sent == 10 * es and st.bytes_recv == 10 * er,
      ("measured sent %d recv %d, formula 10 x (%d, %d)"):format(st.bytes_sent, st.bytes_recv, es, er))
    local ls_ok = true
    for name, s in pairs(seen_shapes) do
      local spec
      for _, x in ipairs(PARAMS) do if x[1] == name then spec = x end end
      if s ~= table.concat(spec[2], "x") then ls_ok = false end
    end
    H.check("post_update-logical-shape", ls_ok and seen_shapes.w_col ~= nil)
    H.check("nograd-untouched", bits_equal(locals.nograd.value,
      box_of(T.randn({ 4, 4 }, seed_of("nograd"), "float32"), locals.nograd.box, { 4, 4 })))
  elseif mode == "engine" then
    -- The config engine with dist = { mesh = ... } vs the same config without it.
    local engine = require("muon.engine")
    local G = {}
    for _, spec in ipairs(PARAMS) do G[spec[1]] = spec[4] end
    local function config(with_dist)
      local gs = groups()
      local cfg = { groups = {}, schedule = function(step, g) return { lr = g.base_lr * (1 - 0.05 * step) } end }
      for i, g in ipairs(gs) do
        local c = {}
        for k, v in pairs(g) do c[k] = v end
        c.match = function(name) return G[name] == i end
        cfg.groups[i] = c
      end
      if with_dist then cfg.dist = { mesh = { { "replicate", A }, { "shard", B } } } end
      return cfg
    end
    local ref = engine.new(config(false))
    local eng = engine.new(config(true))
    local locals = {}
    local mesh = D.mesh({ { "replicate", A }, { "shard", B } }, H.size)
    for _, spec in ipairs(PARAMS) do
      local dt = spec.dtype or "float32"
      local full = T.randn(spec[2], seed_of(spec[1]), dt)
      local pl = D.placement(spec[3], mesh, #spec[2])
      local box = D.local_box(spec[2], pl, mesh, H.rank)
      local value = numel(box.len) > 0 and box_of(full, box, spec[2]):clone() or T.zeros(box.len, dt)
      local grad = (not spec.nograd) and T.zeros(box.len, dt) or nil
      local placement = { spec[3][1], spec[3][2], shape = spec[2] }
      eng:add_param(spec[1], value, grad, placement)
      ref:add_param(spec[1], full, (not spec.nograd) and T.zeros(spec[2], dt) or nil)
      locals[spec[1]] = { value = value, grad = grad, box = box, shape = spec[2], spec = spec, full = full }
    end
    for step = 1, 10 do
      for _, l in pairs(locals) do
        if l.grad then
          local g = grad_for(l.spec, step)
          ref:param(l.spec[1]).grad:copy(g)
          if numel(l.box.len) > 0 then l.grad:copy(box_of(g, l.box, l.shape)) end
        end
      end
      ref:step()
      eng:step()
    end
    local all_ok, first = true, nil
    for name, l in pairs(locals) do
      local ok, why = bits_equal(l.value, box_of(l.full, l.box, l.shape))
      if not ok then all_ok = false; first = first or (name .. " " .. why) end
    end
    H.check("engine-bitwise-10-steps", all_ok, first)
    local cs = eng:comm_stats()
    H.check("engine-comm-stats", eng:get("step") == 10 and cs.data and (H.size == 1 or cs.data.calls > 0)
      and (H.size == 1 or cs.data.bytes_sent + cs.data.bytes_recv > 0))
  elseif mode == "save" then
    local ds, _, advance = distributed(w)
    advance(5)
    ds:save(path)
    H.check("saved", true)
  elseif mode == "resume" then
    local ref, radv, rm, ra = reference()
    radv(5)
    local ds, locals, advance, set_step = distributed(w)
    for name, l in pairs(locals) do
      if numel(l.box.len) > 0 then l.value:copy(box_of(ref[name].value, l.box, l.shape)) end
    end
    ds:load(path)
    set_step(5)
    radv(5)
    advance(5)
    compare("resume-bitwise-10-steps", ds, locals, ref, rm, ra)
  elseif mode == "shape" then
    local ds = distributed(w, nil, { bad_shape = true })
    local ok, err = pcall(ds.step, ds)
    H.check("different-shape-fails-everywhere", not ok and tostring(err):find("w_even", 1, true) ~= nil
      and tostring(err):find("different parameters", 1, true) ~= nil, err)
  elseif mode == "hook" then
    local hooks = {
      reshape_fn = function(name, x)
        if name == "w_uneven" then error("boom from reshape_fn on " .. name, 0) end
        return nil
      end,
    }
    local ds, locals, advance = distributed(w, hooks)
    local before = {}
    for name, l in pairs(locals) do before[name] = l.value:clone() end
    local ok, err = pcall(advance, 1)
    H.check("hook-raise-fails-everywhere", not ok and tostring(err):find("boom from reshape_fn on w_uneven", 1, true) ~= nil, err)
    local same = true
    for name, l in pairs(locals) do same = same and bits_equal(l.value, before[name]) end
    H.check("hook-raise-commits-nothing", same and ds.stats.steps == 0)
  elseif mode == "posthook" then
    local hooks = {
      post_update_fn = function(p)
        if H.rank == 1 then error("post hook failed on rank 1 for " .. p.name, 0) end
      end,
    }
    local ds, _, advance = distributed(w, hooks)
    local ok, err = pcall(advance, 1)
    H.check("post-hook-raise-fails-everywhere", not ok and tostring(err):find("post hook failed on rank 1", 1, true) ~= nil, err)
    w:barrier()
    local _ = ds
  end
  local _ = label
end)
