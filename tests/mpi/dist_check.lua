-- The distributed step under mpirun against the same engine in one process.
--   build/muon run tests/mpi/dist_check.lua MODE MESH [PATH]
-- MESH: mesh axes as "name:size,...", with names replicate, shard (shards
-- each parameter's first shard dim) and shard2 (its second), e.g. "shard:4",
-- "replicate:2,shard:2", "shard:2,shard2:2".
-- MODE:
--   equal    12 steps with failures injected on one rank only (schedule
--            values, a NaN gradient, a raising post_update_fn, a scheduled
--            value that differs between ranks) and a grad that becomes nil:
--            the same errors on every rank, nothing changed by a failed step,
--            and values and state bitwise equal to the one-process engine
--            (run here with 1 BLAS thread, the mesh with OPENBLAS_NUM_THREADS);
--            data bytes = the plan's formula
--   save PATH / resume PATH   5 steps then save; load, 5 more, == 10 steps
--   config   one rank's config differs: every rank fails naming key and ranks
--            (PATH "hook_state": a nested table option, hook_state, differs)
--   experts  a (4, 32, 48) expert stack sharded on dim 1: 0 bytes moved
--   memory   state bytes per rank against one process (replicated state)
--   variants NorMuon (hook state), cautious decay, spectral scale, conv
--            flattening, QK-clip (signals): 10 steps bitwise vs one process
--   nothing  a step where no rank has a grad steps nothing (on every rank);
-- MU_TEST_STATE_DTYPE=bfloat16 runs the float32 groups with bfloat16 state.
-- MU_TEST_SHARDED=1: save writes a sharded checkpoint (PATH a directory).
-- MU_TEST_NS_DTYPE=bfloat16 runs the float32 Muon groups' Newton-Schulz in bfloat16
-- (MU_TEST_NS_METHOD=gram: the Gram iteration).
--            empty shards without a grad step with their parameter; a grad
--            on some holding ranks only fails everywhere
--   overlap  small batches (many pipelined waves): every data exchange is
--            a non-blocking one; a post_ortho_fn that raises in the middle
--            of step 4 on the rank that owns same.2 fails the step on every
--            rank with nothing changed; 8 steps bitwise vs one process
--   direct   row-sharded matrices: every NS input this rank routes was
--            written by the momentum pass where it leaves from (a peer's
--            send segment, its own region buffer), none copied; 3 steps
--            bitwise vs one process
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local E = require("muon.errors")
local engine = require("muon.engine")
local foreach = require("muon.foreach")

local mode, mesh_arg, path = arg[1], arg[2], arg[3]

local AXES = H.axes(mesh_arg)

-- name, global shape, shard dims (for the shard and shard2 axes), group
local PARAMS = {
  { "same.0", { 64, 96 }, { 1, 2 }, 1 },   -- four of one shape: batched differently
  { "same.1", { 64, 96 }, { 1, 2 }, 1 },   -- in one process and on a mesh
  { "same.2", { 64, 96 }, { 2, 1 }, 1 },
  { "same.3", { 64, 96 }, { 1, 2 }, 1 },
  { "w_uneven", { 7, 5 }, { 1, 2 }, 1 },
  { "w_empty", { 2, 9 }, { 1, 2 }, 1 },     -- empty shards at 3 and 4 ranks
  { "w_col", { 5, 10 }, { 2, 1 }, 2 },
  { "experts", { 3, 6, 4 }, { 1, 2 }, 1 },  -- batch-sharded: stays local
  { "experts_in", { 4, 5, 6 }, { 2, 3 }, 2 },
  { "conv", { 6, 1, 5 }, { 1, 3 }, 1 },     -- conv-like A x 1 x B
  { "rep", { 6, 6 }, {}, 1 },               -- replicated everywhere
  { "late", { 4, 4 }, { 1, 2 }, 1 },        -- its grad becomes nil at step 6
  { "nograd", { 4, 4 }, { 1, 2 }, 1, nograd = true },
  { "w_f64", { 6, 5 }, { 2, 1 }, 4, dtype = "float64" },
  { "embed", { 9, 4 }, { 2, 1 }, 3 },       -- AdamW, sharded
  { "bias", { 10 }, { 1 }, 3 },             -- AdamW, 1-D
  { "lion.w", { 8, 6 }, { 1, 2 }, 5 },      -- Lion, sharded
  { "lion.b", { 10 }, { 1 }, 5 },           -- Lion, 1-D
}
if mode == "experts" then PARAMS = { { "experts", { 4, 32, 48 }, { 1 }, 1 } } end
if mode == "direct" then
  PARAMS = { { "d.a", { 16, 12 }, { 1 }, 1 }, { "d.b", { 24, 8 }, { 1 }, 1 }, { "d.c", { 12, 20 }, { 1 }, 1 },
    { "d.d", { 8, 8 }, { 1 }, 4 } }
end
if mode == "variants" then
  PARAMS = {
    { "n.a", { 8, 6 }, { 1, 2 }, 1 }, { "n.b", { 9, 5 }, { 2, 1 }, 1 }, { "n.experts", { 3, 6, 4 }, { 1, 2 }, 1 },
    { "c.a", { 7, 5 }, { 1, 2 }, 2 }, { "c.rep", { 6, 6 }, {}, 2 },
    { "s.a", { 4, 9 }, { 2, 1 }, 3 }, { "f.conv", { 4, 3, 2, 2 }, { 1, 2 }, 4 },
    { "layers.0.attn.wq", { 8, 6 }, { 1, 2 }, 5 }, { "layers.0.attn.wk", { 8, 6 }, { 2, 1 }, 5 },
    { "bias", { 10 }, { 1 }, 6 },
  }
end

local seed_of = H.seed_of
local function grad_for(spec, step) return T.randn(spec[2], seed_of(spec[1]) * 64 + step, spec.dtype or "float32") end

-- The placement of a spec on this mesh (H.placement).
local function placement(spec) return H.placement(AXES, spec) end

-- Failures injected at given steps; `here` says whether this process takes
-- the failing branch (the one-process engine always does).
local INJECT = { wd_nan = 3, betas = 5, eps = 7, post = 8, nan_grad = 9, lr_differs = 10, ortho = 4 }
local CUR = 0 -- the test's step (a failed step does not advance the engine's)

-- The variants' groups: the hooks of the shipped configs.
local function variant_config(dist)
  local normuon = dofile("configs/normuon.lua").groups[1]
  local clip = dofile("configs/muonclip.lua").groups[1].post_update_fn
  local groups = {
    { name = "normuon", optimizer = "muon", lr = 0.02, weight_decay = 0.1, hook_state = normuon.hook_state,
      post_ortho_fn = normuon.post_ortho_fn },
    { name = "cautious", optimizer = "muon", lr = 0.05, weight_decay = 0.5, weight_decay_mode = "cautious" },
    { name = "spectral", optimizer = "muon", lr = 0.05, scale_mode = "spectral" },
    { name = "flatten", optimizer = "muon", lr = 0.05, nd_mode = "flatten" },
    { name = "clip", optimizer = "muon", lr = 0.05, post_update_fn = clip },
    { name = "adamw", optimizer = "adamw", lr = 1e-2 },
  }
  return H.grouped_config(groups, PARAMS, dist and AXES)
end

local function make_config(dist, here, variant)
  if mode == "variants" then return variant_config(dist) end
  local groups = {
    { name = "hidden", optimizer = "muon", lr = 0.02, weight_decay = 0.1 },
    { name = "legacy", optimizer = "muon", lr = 0.05, weight_decay = 0.01, nesterov = false, ns_variant = "legacy",
      momentum = { 0.9, 0.8 },
      post_update_fn = function(p, value, ctx)
        if mode == "equal" and CUR == INJECT.post then
          -- raises on one rank only (and changes nothing anywhere that step)
          if here.post then error("boom in post_update_fn on " .. p.name, 0) end
          return
        end
        if value:numel() > 0 then foreach.scale({ value }, 0.999) end
      end },
    { name = "adamw", optimizer = "adamw", lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.01 },
    { name = "f64", optimizer = "muon", lr = 0.03, weight_decay = 0.05 },
    { name = "lion", optimizer = "lion", lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 },
  }
  if variant == "lr" then groups[1].lr = 0.021 end
  if variant then
    -- a nested table: hook_state's keys and rules are compared too
    groups[1].post_ortho_fn = function() end
    groups[1].hook_state = { a = "rows", b = variant == "hook_state" and "cols" or "rows" }
  end
  -- MU_TEST_STATE_DTYPE=bfloat16: the float32 groups keep bfloat16 state
  local sd = os.getenv("MU_TEST_STATE_DTYPE")
  if sd and sd ~= "" then
    for _, i in ipairs({ 1, 2, 3, 5 }) do groups[i].state_dtype = sd end
  end
  -- MU_TEST_NS_DTYPE=bfloat16: the float32 Muon groups run Newton-Schulz in bfloat16
  local nd = os.getenv("MU_TEST_NS_DTYPE")
  if nd and nd ~= "" then
    for _, i in ipairs({ 1, 2 }) do groups[i].ns_dtype = nd end
  end
  -- MU_TEST_NS_METHOD=gram: and the Gram iteration
  local nm = os.getenv("MU_TEST_NS_METHOD")
  if nm and nm ~= "" then
    for _, i in ipairs({ 1, 2 }) do groups[i].ns_method = nm end
  end
  if mode == "overlap" then
    groups[1].post_ortho_fn = function(_, _, ctx)
      if CUR == INJECT.ortho and ctx.param_fqn == "same.2" then error("boom in post_ortho_fn on same.2", 0) end
    end
  end
  local cfg = H.grouped_config(groups, PARAMS)
  cfg.schedule = function(step, g)
    local v = { lr = g.base_lr * (1 - 0.03 * step) }
    if g.optimizer == "lion" then -- every Lion option scheduled
      v.betas, v.weight_decay = { 0.9 - 0.01 * step, 0.99 - 0.001 * step }, 0.1 + 0.01 * step
    end
    if mode == "equal" then
      if CUR == INJECT.wd_nan and g.index == 1 and here.wd_nan then v.weight_decay = 0 / 0 end
      if CUR == INJECT.betas and g.index == 3 and here.betas then v.betas = { 0.9, 1.5 } end
      if CUR == INJECT.eps and g.index == 3 and here.eps then v.eps = -1 end
      if CUR == INJECT.lr_differs and g.index == 2 and here.lr_differs then v.lr = v.lr * 1.0000001 end
    end
    return v
  end
  if dist then cfg.dist = { mesh = AXES, max_batch_numel = mode == "overlap" and 3000 or nil } end
  return cfg
end

local numel = H.numel

local bits_equal = H.bits_equal

-- Both engines: the one-process reference on full tensors, and this rank's
-- part of the mesh engine.
local function setup(here, variant)
  local ref = engine.new(H.alone(make_config(false, { wd_nan = true, betas = true, eps = true, post = true, nan_grad = true })))
  local eng = engine.new(make_config(true, here, variant))
  local mesh = D.mesh(AXES, H.size)
  local locals = {}
  for _, spec in ipairs(PARAMS) do
    local dt, shape = spec.dtype or "float32", spec[2]
    local full = T.randn(shape, seed_of(spec[1]), dt)
    local pl = placement(spec)
    local box = D.local_box(shape, D.placement(pl, mesh, #shape), mesh, H.rank)
    local value = numel(box.len) > 0 and D.box_view(full, box):clone() or T.zeros(box.len, dt)
    local grad = (not spec.nograd) and T.zeros(box.len, dt) or nil
    pl.shape = shape
    eng:add_param(spec[1], value, grad, pl)
    ref:add_param(spec[1], full, (not spec.nograd) and T.zeros(shape, dt) or nil)
    locals[spec[1]] = { value = value, grad = grad, box = box, shape = shape, spec = spec, full = full }
  end
  return ref, eng, locals
end

local function set_grads(ref, locals, step)
  for name, l in pairs(locals) do
    if l.spec[1] == "late" and step >= 6 then
      l.grad_saved = l.grad_saved or l.grad
      ref:param(name).grad = nil
      -- every rank drops it (the C API's "grad NULL on every rank")
    elseif l.grad or l.grad_saved then
      local g = grad_for(l.spec, step)
      if mode == "equal" and step == INJECT.nan_grad and name == "w_uneven" then g:set(0 / 0, 1, 1) end
      ref:param(name).grad:copy(g)
      if numel(l.box.len) > 0 then l.grad:copy(D.box_view(g, l.box)) end
    end
  end
end

local function drop_late(eng, locals, step)
  if step >= 6 and locals.late then eng:param("late").grad = nil end
end

-- Compare this rank's values and held state with the reference.
local function compare(tag, ref, eng, locals)
  local ok, first = true, nil
  for name, l in pairs(locals) do
    local good, why = bits_equal(l.value, D.box_view(ref:param(name).value, l.box))
    if not good then ok, first = false, first or (name .. " value " .. why) end
    local s, rs = eng:state(name), ref:state(name)
    if s then
      for _, k in ipairs({ "momentum_buffer", "exp_avg", "exp_avg_sq" }) do
        if s[k] then
          local g2, why2 = bits_equal(s[k], D.box_view(rs[k], l.box))
          if not g2 then ok, first = false, first or (name .. " " .. k .. " " .. why2) end
          local want = l.value:dtype() == "float32" and os.getenv("MU_TEST_STATE_DTYPE") or ""
          if want ~= "" and s[k]:dtype() ~= want then
            ok, first = false, first or (("%s %s is %s, not %s"):format(name, k, s[k]:dtype(), want))
          end
        end
      end
      if s.step ~= rs.step then ok, first = false, first or (name .. " step count") end
    end
  end
  H.check(tag, ok, first)
end

local function snapshot(locals)
  local s = {}
  for name, l in pairs(locals) do s[name] = l.value:clone() end
  return s
end

local function unchanged(locals, snap)
  for name, l in pairs(locals) do
    if not bits_equal(l.value, snap[name]) then return false, name end
  end
  return true
end

H.main(function()
  H.init()
  local W, me = H.size, H.rank
  local ref_step = H.ref_step
  if mode == "equal" then
    local last = W - 1
    local here = { wd_nan = me == last, betas = me == 0, eps = me == last, post = me == math.min(1, last),
      lr_differs = W > 1 and me == last }
    local ref, eng, locals = setup(here)
    local expect = {
      [INJECT.wd_nan] = { E.EINVAL, "group 1 ('hidden'), step 3: ", "weight_decay must be a finite number, got nan" },
      [INJECT.betas] = { E.EINVAL, "group 3 ('adamw'), step 4: ", "betas[2] must be in [0, 1), got 1.5" },
      [INJECT.eps] = { E.EINVAL, "group 3 ('adamw'), step 5: ", "eps must be >= 0, got -1" },
      -- (after the routing, before the commit: nothing changes anywhere)
      [INJECT.post] = { E.ELUA, "post_update_fn: boom in post_update_fn on w_col", routed = true },
      -- (the momentum pass finds it, so the step's exchanges still run)
      [INJECT.nan_grad] = { E.ENONFINITE, "parameter 'w_uneven': gradient holds NaN or Inf", routed = true },
    }
    -- The NaN gradient (element 1, 1 of w_uneven) stops the step before its
    -- exchanges when a rank that does not hold its state has it (the step's
    -- gradient check, agreed); state holders find it in their momentum pass
    -- (kind.checks), after the agreement: the exchanges then run.
    local l = locals.w_uneven
    local holds = eng.stepper:record(eng:param("w_uneven")).holds -- (the plan's first build is collective)
    local early = numel(l.box.len) > 0 and l.box.start[1] == 0 and l.box.start[2] == 0 and not holds
    expect[INJECT.nan_grad].routed = H.world:allreduce({ early and 1 or 0 }, "max")[1] == 0
    if W > 1 then
      expect[INJECT.lr_differs] = { E.EINVAL, "scheduled values differ across ranks at group 2 ('legacy').lr",
        ("ranks that differ from rank 0: %d"):format(W - 1), ref_skips = true }
    end
    local all_ok, first = true, nil
    local moved = 0
    local function bytes_of_step(step)
      local st = eng.stepper
      local esize = { float32 = 4, float64 = 8 }
      local n = 0
      for _, r in ipairs(st.plan.records) do
        if not (r.name == "nograd" or (r.name == "late" and step >= 6)) then
          local s = D.step_elements({ records = { r } }, me)
          n = n + s * esize[r.dtype]
        end
      end
      return n
    end
    for step = 1, 12 do
      CUR = step
      set_grads(ref, locals, step)
      drop_late(eng, locals, step)
      local want = expect[step]
      local snap = snapshot(locals)
      local ok, err = pcall(eng.step, eng)
      local rok, rerr = true, nil
      if not (want and want.ref_skips) then rok, rerr = ref_step(ref) end
      if want then
        local msg = tostring(err)
        local good = not ok and E.code(err) == want[1] and msg:find(want[2], 1, true) ~= nil
          and (want[3] == nil or msg:find(want[3], 1, true) ~= nil)
        if not good then all_ok, first = false, first or ("step " .. step .. ": " .. msg) end
        if not want.ref_skips and (rok or E.code(rerr) ~= want[1]) then
          all_ok, first = false, first or ("step " .. step .. " one process: " .. tostring(rerr))
        end
        local same, which = unchanged(locals, snap)
        if not same then all_ok, first = false, first or ("step " .. step .. " changed " .. which) end
        if want.routed then moved = moved + bytes_of_step(step) end
      else
        if not ok or not rok then all_ok, first = false, first or ("step " .. step .. ": " .. tostring(err or rerr)) end
        moved = moved + bytes_of_step(step)
      end
      if eng:get("step") ~= ref:get("step") then
        all_ok, first = false, first or ("step counter " .. eng:get("step") .. " vs " .. ref:get("step"))
      end
    end
    H.check("failures-everywhere-atomic", all_ok, first)
    compare("bitwise-after-failures", ref, eng, locals)
    local cs = eng:comm_stats().data
    H.check("bytes-vs-formula", cs.bytes_sent == moved,
      ("measured sent %d, formula %d"):format(cs.bytes_sent, moved))
  elseif mode == "overlap" then
    local ref, eng, locals = setup({})
    local all_ok, first = true, nil
    for step = 1, 8 do
      CUR = step
      set_grads(ref, locals, step)
      drop_late(eng, locals, step)
      local snap = snapshot(locals)
      local ok, err = pcall(eng.step, eng)
      local rok, rerr = ref_step(ref)
      if step == INJECT.ortho then
        local msg = tostring(err)
        local good = not ok and not rok and E.code(err) == E.code(rerr) and msg:find("boom in post_ortho_fn on same.2", 1, true)
        if not good then all_ok, first = false, first or ("step " .. step .. ": " .. msg .. " / " .. tostring(rerr)) end
        local same, which = unchanged(locals, snap)
        if not same then all_ok, first = false, first or ("step " .. step .. " changed " .. which) end
      elseif not ok or not rok then
        all_ok, first = false, first or ("step " .. step .. ": " .. tostring(err or rerr))
      end
    end
    H.check("overlap-failure-atomic", all_ok, first)
    compare("overlap-bitwise", ref, eng, locals)
    local st = eng.stepper
    local cs = eng:comm_stats().data
    local waves = 0
    for _, b in ipairs(st.plan.batches) do
      if b.moves_in or b.moves_out then waves = waves + 1 end
    end
    -- every data exchange went through the pipeline (non-blocking), and a
    -- plan of many batches posts many of them per step
    H.check("overlap-nonblocking", W == 1 or (cs.nonblocking == st.router.posted and cs.calls == cs.nonblocking
      and cs.nonblocking >= 8 * waves and waves >= 4),
      ("calls %d nonblocking %d posted %d, moving batches %d"):format(cs.calls, cs.nonblocking, st.router.posted, waves))
  elseif mode == "save" or mode == "resume" then
    local ref, eng, locals = setup({})
    local first = mode == "save" and 1 or 6
    if mode == "resume" then
      for step = 1, 5 do
        set_grads(ref, locals, step)
        ref_step(ref)
      end
      for name, l in pairs(locals) do
        if numel(l.box.len) > 0 then l.value:copy(D.box_view(ref:param(name).value, l.box)) end
      end
      eng:load(path)
    end
    for step = first, first + 4 do
      set_grads(ref, locals, step)
      drop_late(eng, locals, step)
      local ok, err = pcall(eng.step, eng)
      if not ok then error(err, 0) end
      if mode == "resume" then ref_step(ref) end
    end
    if mode == "save" then
      eng:save(path, os.getenv("MU_TEST_SHARDED") == "1" and { sharded = true } or nil)
      H.check("saved", true)
    else
      H.check("resumed-step", eng:get("step") == 10, eng:get("step"))
      compare("resume-bitwise", ref, eng, locals)
    end
  elseif mode == "config" then
    local key = path or "lr"
    local _, eng, locals = setup({}, me == W - 1 and key or "same")
    for _, l in pairs(locals) do if l.grad then l.grad:fill(0.5) end end
    local ok, err = pcall(eng.step, eng)
    local msg = tostring(err)
    local ranks = W > 1 and ("ranks that differ from rank 0: " .. (W - 1)) or ""
    H.check("config-mismatch-fails-everywhere", W == 1 and ok or (not ok and E.code(err) == E.EINVAL
      and msg:find("configs differ across ranks at group 1 ('hidden')." .. key, 1, true) ~= nil
      and msg:find(ranks, 1, true) ~= nil), msg)
  elseif mode == "experts" then
    local ref, eng, locals = setup({})
    for step = 1, 3 do
      set_grads(ref, locals, step)
      eng:step()
      ref_step(ref)
    end
    local cs = eng:comm_stats().data
    H.check("experts-zero-bytes", cs.bytes_sent == 0 and cs.bytes_recv == 0 and cs.calls == 0,
      ("sent %d recv %d calls %d"):format(cs.bytes_sent, cs.bytes_recv, cs.calls))
    compare("experts-bitwise", ref, eng, locals)
  elseif mode == "direct" then
    local ref, eng, locals = setup({})
    local in_place = require("muon.router").in_place
    for step = 1, 3 do
      set_grads(ref, locals, step)
      eng:step()
      ref_step(ref)
    end
    local want = 0
    for _, spec in ipairs(PARAMS) do
      local r = eng.stepper:record(eng:param(spec[1]))
      if r.holds and r.items[1] and not in_place(r.items[1]) then want = want + 3 * r.mine_n end
    end
    local router = eng.stepper.router
    H.check("direct-inputs", router.inputs_copied == 0 and router.inputs_placed == want and (W == 1 or want > 0),
      ("placed %d (want %d), copied %d"):format(router.inputs_placed, want, router.inputs_copied))
    compare("direct-bitwise", ref, eng, locals)
  elseif mode == "variants" then
    local ref, eng, locals = setup({})
    for step = 1, 10 do
      set_grads(ref, locals, step)
      for _, e in ipairs({ ref, eng }) do e:set_signal("max_logit.0", { 60 + 9 * step, 150, 99, 300 / step }) end
      eng:step()
      ref_step(ref)
      if step == 5 and path then
        -- the mesh's checkpoint (gathered from the holders) loads into one
        -- process with every state tensor, hook state included, bitwise
        eng:save(path)
        local one = engine.new(H.alone(make_config(false, {})))
        for _, spec in ipairs(PARAMS) do
          one:add_param(spec[1], T.zeros(spec[2], spec.dtype or "float32"), T.zeros(spec[2], spec.dtype or "float32"))
        end
        one:load(path)
        local same, first = true, nil
        for _, spec in ipairs(PARAMS) do
          local a, b = one:state(spec[1]), ref:state(spec[1])
          for k, t in pairs(b or {}) do
            if T.is_tensor(t) and not bits_equal(a[k], t) then same, first = false, first or (spec[1] .. " " .. k) end
          end
        end
        H.check("variants-checkpoint-gathered", same, first)
      end
    end
    compare("variants-bitwise-10-steps", ref, eng, locals)
    local same = true
    for name, l in pairs(locals) do
      local s, rs = eng:state(name), ref:state(name)
      if s and s["hook.v"] then
        local hr = eng.stepper:record(eng:param(name)).hook_records["hook.v"]
        local ok = bits_equal(s["hook.v"], D.box_view(rs["hook.v"], hr.mine))
        same = same and ok
      end
      local _ = l
    end
    H.check("variants-hook-state-bitwise", same)
  elseif mode == "nothing" then
    -- No grad anywhere: every rank returns false, nothing changes, nothing
    -- moves. An empty shard may pass no grad (the C API's NULL) and still
    -- steps with its parameter; a rank holding elements without a grad
    -- while others have one fails on every rank, changing nothing.
    local ref, eng, locals = setup({})
    local function all_grads(step)
      for name, l in pairs(locals) do
        if l.grad_saved then eng:param(name).grad = l.grad_saved end
        if l.ref_grad_saved then ref:param(name).grad = l.ref_grad_saved end
      end
      set_grads(ref, locals, step)
    end
    all_grads(1)
    local _, s1 = eng:step()
    ref_step(ref)
    local l2, s2 = eng:step(function() return 7 end)
    ref_step(ref)
    H.check("steps-with-grads", s1 == true and s2 == true and l2 == 7 and eng:get("step") == 2)
    local snap = snapshot(locals)
    local sent = eng:comm_stats().data.bytes_sent
    for name, l in pairs(locals) do
      l.grad_saved = l.grad_saved or eng:param(name).grad
      l.ref_grad_saved = l.ref_grad_saved or ref:param(name).grad
      eng:param(name).grad, ref:param(name).grad = nil, nil
    end
    local ok, loss, stepped = pcall(eng.step, eng, function() return "loss" end)
    local same = unchanged(locals, snap)
    H.check("no-grad-anywhere-steps-nothing", ok and loss == "loss" and stepped == false and eng:get("step") == 2
      and same and eng:comm_stats().data.bytes_sent == sent,
      ("ok %s loss %s stepped %s step %s same %s"):format(tostring(ok), tostring(loss), tostring(stepped),
        tostring(eng:get("step")), tostring(same)))
    -- empty local shards without a grad buffer
    all_grads(3)
    local dropped = 0
    for name, l in pairs(locals) do
      if numel(l.box.len) == 0 and eng:param(name).grad ~= nil then
        eng:param(name).grad = nil
        dropped = dropped + 1
      end
    end
    local ok3, _, st3 = pcall(eng.step, eng)
    ref_step(ref)
    H.check("empty-shard-without-grad-steps", ok3 and st3 == true and eng:get("step") == 3, ("dropped %d"):format(dropped))
    compare("empty-shard-bitwise", ref, eng, locals)
    -- a rank that holds elements of 'rep' passes no grad while the others do
    all_grads(4)
    if W > 1 and me == W - 1 then eng:param("rep").grad = nil end
    snap = snapshot(locals)
    local ok4, err4 = pcall(eng.step, eng)
    if W > 1 then
      H.check("grad-on-some-ranks-fails-everywhere", not ok4 and E.code(err4) == E.EINVAL
        and tostring(err4):find("'rep'", 1, true) ~= nil and eng:get("step") == 3 and unchanged(locals, snap),
        tostring(err4))
    else
      H.check("grad-on-some-ranks-fails-everywhere", ok4, tostring(err4))
      ref_step(ref)
    end
    -- the same with empty shards passing no grad (the per-parameter agreement)
    all_grads(5)
    for name, l in pairs(locals) do
      if numel(l.box.len) == 0 then eng:param(name).grad = nil end
    end
    if W > 1 and me == W - 1 then eng:param("rep").grad = nil end
    local before = eng:get("step")
    local ok5, err5 = pcall(eng.step, eng)
    H.check("grad-on-some-ranks-with-empty-shards-fails-everywhere", W == 1 and ok5 or (not ok5
      and tostring(err5):find("'rep'", 1, true) ~= nil and eng:get("step") == before), tostring(err5))
  elseif mode == "memory" then
    local ref, eng, locals = setup({})
    set_grads(ref, locals, 1)
    eng:step()
    ref_step(ref)
    local mine, one = eng:memory().state_bytes, ref:memory().state_bytes
    local ratio = mine / one
    H.check("state-bytes-per-rank", ratio <= 0.55, ("rank %d holds %d of %d bytes (%.3fx)"):format(me, mine, one, ratio))
    compare("memory-bitwise", ref, eng, locals)
  end
end)
