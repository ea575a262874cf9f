-- Muon, as the seed's Muon.step(): momentum -> group by core shape ->
-- memory-safe batches -> batched Newton-Schulz -> per-slice scale -> decay
-- + apply -> post_update_fn.
--
-- This module is the Muon *kind*: its options, their checks, and the parts
-- of a step that are Muon's own (momentum, orthogonalize, the scale and the
-- apply coefficients, post_update_fn). The step protocol that runs them (checks,
-- routing, agreement across ranks, the atomic commit) is muon.step, the
-- same for one process and for every mesh. muon.optim.Muon(params, opts) is
-- a one-process optimizer over that protocol.
local T = require("muon.tensor")
local ns = require("muon.ns")
local foreach = require("muon.foreach")
local O = require("muon.optim.options")
local P = require("muon.param")
local E = require("muon.errors")
local K = require("muon.optim.kind")
local class = require("muon.optim.class")
local per_dtype = foreach.per_dtype
local Rd = require("muon.reduce")
local RO = require("muon.readonly")

local M = {} -- what other modules use besides the kind (core_shape, call_in_place)

local function fail(fmt, ...) E.raise(E.EINVAL, fmt, ...) end

-- momentum: a number, or a list of one or two numbers (m1, m2).
local function momentum_pair(m)
  local num = O.number(0)
  if type(m) == "number" then
    num(m, "momentum")
    return m, m
  end
  if type(m) ~= "table" or (#m ~= 1 and #m ~= 2) then
    fail("momentum must be a number or a list of one or two numbers, got %s", E.value(m))
  end
  num(m[1], "momentum[1]")
  num(m[#m], "momentum[" .. #m .. "]")
  return m[1], m[#m]
end

-- hsdp_replica_count (nil, an integer >= 1 or a list of them) as one
-- number: the product (1 for nil).
local function replica_count(v)
  if v == nil then return 1 end
  local list = type(v) == "table" and v or { v }
  local n = 0
  for _ in pairs(list) do n = n + 1 end
  if n == 0 or n ~= #list then
    fail("hsdp_replica_count must be an integer >= 1 or a list of them, got %s", E.value(v))
  end
  local prod = 1
  for i = 1, #list do
    local x = list[i]
    if type(x) ~= "number" or x ~= math.floor(x) or x < 1 or x > 2 ^ 31 then
      fail("hsdp_replica_count must be an integer >= 1 or a list of them, got %s", E.value(x))
    end
    prod = prod * x
  end
  return prod
end

local function check_variant(v)
  for _, known in ipairs(ns.VARIANTS) do
    if v == known then return end
  end
  local quoted = {}
  for i, x in ipairs(ns.VARIANTS) do quoted[i] = "'" .. x .. "'" end
  fail("ns_variant must be %s, or %s, got %s", table.concat(quoted, ", ", 1, #quoted - 1), quoted[#quoted],
    type(v) == "string" and ("'" .. v .. "'") or tostring(v))
end

local function check_epsilon(v)
  if not O.is_finite(v) or v < 0 then fail("ns_epsilon must be a finite non-negative value, got %s", tostring(v)) end
end

local function check_coefficients(v, _, g)
  if g.ns_variant ~= "custom" and v ~= nil then fail("ns_coefficients can only be provided when ns_variant='custom'") end
end

local kind = { name = "muon", class = "Muon",
  -- direction checks the NS input and the momentum in its pass (a NaN/Inf
  -- gradient shows in the NS input)
  state = { { "momentum_buffer" } }, checks = true }

-- The seed's options (its Muon.__init__ and _MUON_ADVANCED_DEFAULTS), with
-- its checks and messages, in its order; then the extensions.
kind.options = {
  { "ns_variant", "asym5", check_variant, show = 6 },
  { "ns_epsilon", 1e-10, check_epsilon },
  { "zero_rms_scale_mode", "zero", O.oneof({ "zero", "use_lr" }) },
  -- "symmetric" (syrk/symm) or "plain" (gemm)
  { "ns_path", "symmetric", O.oneof({ "symmetric", "plain" }) },
  -- "standard", "gram" (iterate on X X^T) or "auto" (per shape)
  { "ns_method", "standard", O.oneof(ns.METHODS) },
  -- the iteration's precision: "float32" or "bfloat16" (the seed's bf16 iteration)
  { "ns_dtype", "float32", O.oneof(ns.DTYPES) },
  -- or "keller": sqrt(max(1, A/B)); "spectral": sqrt(A/B)
  { "scale_mode", "matched_adamw_rms", O.oneof({ "matched_adamw_rms", "keller", "spectral" }) },
  -- or "cautious": decay only where the update moves p towards 0
  { "weight_decay_mode", "decoupled", O.oneof({ "decoupled", "cautious" }) },
  -- N-D: a batch of last-two-dim matrices, or "flatten": out x (the rest)
  { "nd_mode", "batch", O.oneof({ "batch", "flatten" }) },
  K.COMMON_OPTIONS,
  { "lr", 2e-2, O.number(0), schedulable = true, show = 1 },
  { "weight_decay", 0.1, O.number(0), schedulable = true, show = 2 },
  { "matched_adamw_rms", 0.2, O.number(0), schedulable = true, show = 7 },
  { "nesterov", true, O.boolean(), show = 4 },
  { "apply_lr_in_update", false, O.boolean() },
  -- 0: normalize only (X / (||X|| + eps)), as the seed
  { "ns_steps", 5, O.integer(0), show = 5 },
  { "ns_coefficients", nil, check_coefficients },
  { "momentum", 0.95, momentum_pair, schedulable = true, show = 3 },
  -- The seed's optimizer-state replica group size (an integer, or a list
  -- whose product is it): here the replicate axes of the mesh (dist.mesh),
  -- checked against them (kind.replica_count).
  { "hsdp_replica_count", nil, replica_count },
  K.HOOK_OPTIONS,
}

kind.replica_count = replica_count

-- Across options, and the resolved Newton-Schulz schedule (g._ns) and hook
-- state names (g._hook_keys).
function kind.resolve(g)
  local names = {}
  for k in pairs(g.hook_state or {}) do names[#names + 1] = k end
  table.sort(names)
  g._hook_keys = names
  for _, h in ipairs({ "pre_ortho_fn", "post_ortho_fn" }) do
    if g[h] ~= nil and (g.reshape_fn ~= nil or g.ns_transform_fn ~= nil) then
      fail("%s cannot be combined with reshape_fn or ns_transform_fn (it sees a parameter's own core matrices)", h)
    end
  end
  local ok2, resolved = pcall(ns.resolve, {
    steps = g.ns_steps, variant = g.ns_variant, eps = g.ns_epsilon,
    coefficients = g.ns_coefficients, path = g.ns_path, method = g.ns_method, dtype = g.ns_dtype,
  })
  -- (under pcall muon.ns blames no line: the group's checks name the option)
  if not ok2 then E.reraise(resolved, E.EINVAL) end
  g._ns = resolved
end

function kind.check_param(p, g)
  local shape = p.logical_shape or p.value:size()
  if #shape < 2 then
    fail("parameter '%s' is %d-D: 1D parameters are not supported in Muon (use AdamW)", p.name, #shape)
  end
  if g and g.ns_dtype == "bfloat16" and p.value:dtype() ~= "float32" then
    fail("parameter '%s' is %s: ns_dtype = 'bfloat16' runs on float32 parameters", p.name, p.value:dtype())
  end
end

-- Core shape (A, B) NS runs on (the one rule: muon.ns.core).
local function core_shape(shape, nd_mode)
  local a, b = ns.core(shape, nd_mode)
  if a == nil then E.raise(E.EINVAL, "1D parameters are not supported in Muon") end
  return a, b
end

-- A core dim of a hook state rule ("rows", "cols" or 1) for a core matrix
-- a x b.
local function rule_dim(x, a, b) return (x == "rows" and a) or (x == "cols" and b) or 1 end

-- The global shape of a parameter's hook state under a rule
-- (K.HOOK_STATE_RULES): the parameter's shape with its rows dims and its
-- cols dims each replaced by what the rule puts there: kept (the same
-- side), all 1 (1), or the other side's size in the first of them and 1 in
-- the others (a square rule: rows_rows has the rows in place of the cols).
-- The hook sees it as (core matrices, rule's first dim, rule's second dim);
-- its memory order is that view's (the batch dims come first, then the
-- rows dims, then the cols dims: muon.ns.core).
local function hook_shape(rule, shape, nd_mode)
  local r = K.hook_state_rule(rule)
  local a, b, _, rows, cols = ns.core(shape, nd_mode)
  local size = { rows = a, cols = b }
  local out = {}
  local function place(dims, own, side)
    local first = true
    for d = 1, #shape do
      if dims[d] then
        if side == own then out[d] = shape[d]
        elseif side == 1 then out[d] = 1
        else out[d] = first and size[side] or 1 end
        first = false
      end
    end
  end
  for d = 1, #shape do
    if not (rows[d] or cols[d]) then out[d] = shape[d] end
  end
  place(rows, "rows", r[2])
  place(cols, "cols", r[3])
  return out
end

-- The hook state tensors of a parameter of this group: a list of
-- { name, key = "hook.<name>", shape = global shape } (see hook_shape).
function kind.hook_shapes(group, shape)
  local list = {}
  for _, name in ipairs(group._hook_keys or {}) do
    list[#list + 1] = { name = name, key = "hook." .. name, shape = hook_shape(group.hook_state[name], shape, group.nd_mode) }
  end
  return list
end

-- The tensor as a (slices, A, B) view (or a contiguous copy if it can't be).
local function as_batch3(t, nd_mode)
  local shape = t:size()
  local a, b = core_shape(shape, nd_mode)
  local k = math.floor(t:numel() / math.max(a * b, 1))
  if a * b == 0 then k = 0 end
  if t:is_contiguous() then return t:view({ k, a, b }), k, a, b end
  return t:contiguous():view({ k, a, b }), k, a, b
end

-- Whether the owner scales the update (orthogonalize) rather than the
-- apply (kind.apply_scale, one pass fewer): when a hook reshapes the
-- Newton-Schulz input or replaces Newton-Schulz (the scale then belongs
-- to the tensors it ran on). The same on every rank (the group's options).
local function owner_scales(group)
  return group.ns_transform_fn ~= nil or group.reshape_fn ~= nil or group.zeropower_fn ~= nil
end

-- Scale of an update slice with logical dims a x b (seed: compute_muon_slice_scale).
local function slice_scale(hp, a, b)
  local s
  if hp.scale_mode == "keller" then
    s = math.sqrt(math.max(1, a / b))
  elseif hp.scale_mode == "spectral" then
    s = math.sqrt(a / b)
  elseif hp.matched_adamw_rms == 0 then
    s = hp.zero_rms_scale_mode == "use_lr" and 1.0 or 0.0
  else
    s = math.sqrt(math.max(a, b)) * hp.matched_adamw_rms
  end
  if hp.apply_lr_in_update then s = s * -hp.lr end
  return s
end

------------------------------------------------------------- the step parts

-- The momentum buffer is written in place at the commit (no second buffer
-- in the step's scratch) unless a hook writes it (momentum_update_fn) or
-- sees the gradient it is computed from (post_update_fn's param.grad).
function kind.in_place_state(group)
  if group.momentum_update_fn or group.post_update_fn then return nil end
  return { "momentum_buffer" }
end

-- The commit's part of the momentum: buf' = m2 buf + g, in place.
function kind.commit_state(_, hp, entries)
  local m1, m2 = momentum_pair(hp.momentum)
  local grads, bufs = {}, {}
  for i, e in ipairs(entries) do
    grads[i] = e.grad:is_contiguous() and e.grad or e.grad:contiguous()
    bufs[i] = e.old.momentum_buffer
  end
  per_dtype(function(g, b) foreach.momentum_buffers(g, b, b, m1, m2) end, { grads, bufs })
end

-- Momentum on the entries this rank keeps state for (seed:
-- _update_muon_momentum): entry = { p, grad, old = { momentum_buffer },
-- new = { momentum_buffer } (none when in place: kind.in_place_state), u }:
-- writes the NS input u (and new.momentum_buffer), reading old (never
-- written). Returns the first entry whose gradient, NS input or new
-- momentum (written, or in place: as the commit will write it) holds NaN
-- or Inf (kind.checks: the momentum pass checks what it writes;
-- momentum_update_fn gets checked gradients, and the momentum it writes is
-- the step's to check, naming the hook), or nil.
function kind.direction(_, group, hp, entries)
  local grads, bufs, new_bufs, updates = {}, {}, {}, {}
  for i, e in ipairs(entries) do
    grads[i] = e.grad:is_contiguous() and e.grad or e.grad:contiguous()
    bufs[i], new_bufs[i], updates[i] = e.old.momentum_buffer, e.new.momentum_buffer, e.u
  end
  local m1, m2 = momentum_pair(hp.momentum)
  if group.momentum_update_fn then
    local bad = foreach.first_nonfinite(grads) -- (the hook never sees a NaN/Inf gradient)
    if bad then return bad end
    -- The hook may update buffers in place: it gets copies in buffers of
    -- its own (e.work), never the state nor what becomes it, so that no
    -- view it keeps can reach the state; copied into new_bufs on success.
    local work = {}
    for i, e in ipairs(entries) do
      local w = e.work.momentum_buffer
      if w == nil or w:dtype() ~= new_bufs[i]:dtype() then
        w = T.zeros(new_bufs[i]:size(), new_bufs[i]:dtype())
        e.work.momentum_buffer = w
      end
      work[i] = w:copy(bufs[i])
    end
    local names = {}
    for i = 1, math.min(#entries, 3) do names[i] = "'" .. entries[i].p.name .. "'" end
    local subject = (#entries == 1 and "parameter " or "parameters ") .. table.concat(names, ", ")
      .. (#entries > 3 and (" and %d more"):format(#entries - 3) or "")
    local result = E.call_hook_on(subject, "momentum_update_fn", group.momentum_update_fn, grads, work, m1, m2,
      hp.nesterov)
    if type(result) ~= "table" or #result ~= #entries then
      E.raise(E.EINVAL, "momentum_update_fn must return one update tensor per input gradient, got %s updates for %d gradients",
        type(result) == "table" and tostring(#result) or type(result), #entries)
    end
    for i, e in ipairs(entries) do
      local u = result[i]
      if not T.is_tensor(u) or u:numel() ~= e.u:numel() then
        E.raise(E.EINVAL, "parameter '%s': momentum_update_fn returned an update of the wrong size", e.p.name)
      end
      if u ~= e.u then e.u:copy(u:is_contiguous() and u:view(e.u:size()) or u:reshape(e.u:size())) end
    end
    for i = 1, #entries do new_bufs[i]:copy(work[i]) end
    return foreach.first_nonfinite(updates)
  end
  if new_bufs[1] == nil then -- (in place: the commit writes the buffers, kind.commit_state)
    return per_dtype(function(g, b, u) return foreach.momentum_updates(g, b, u, m1, m2, hp.nesterov) end,
      { grads, bufs, updates })
  end
  return per_dtype(function(g, b, nb, u)
    local _, bad = foreach.momentum(g, b, nb, u, m1, m2, hp.nesterov)
    return bad
  end, { grads, bufs, new_bufs, updates })
end

-- Newton-Schulz (or the group's zeropower_fn) on a merged (n, A, B) buffer.
local function zeropower(ctx, group, merged, dtype, a, b)
  if group.zeropower_fn then
    local x = merged:size(1) == 1 and merged:select(1, 1) or merged
    local y = E.call_hook_on(("%d matrices of %dx%d"):format(merged:size(1), a, b), "zeropower_fn", group.zeropower_fn,
      x, group.ns_steps)
    if not T.is_tensor(y) or not P.same_shape(y, x) then
      E.raise(E.EINVAL, "zeropower_fn must return a tensor of shape %s", P.shape_string(x))
    end
    if y ~= x then x:copy(y) end
  else
    ns.zeropower_into(merged, merged, group._ns, ctx:ns_workspace(dtype, a, b))
  end
end

-- Batched NS over tensors that share one core shape: returns their scaled
-- updates as views into a merged (n, A, B) buffer. slot keeps buffers of
-- groups that are alive at the same time apart.
local function ns_merged(ctx, group, hp, tensors, slot)
  local a, b = core_shape(tensors[1]:size(), group.nd_mode)
  local dtype = tensors[1]:dtype()
  local counts, n = {}, 0
  for i, t in ipairs(tensors) do
    local _, k = as_batch3(t, group.nd_mode)
    counts[i] = k
    n = n + k
  end
  local merged = ctx:batch_buffer(dtype, n, a, b, slot)
  local off = 0
  for i, t in ipairs(tensors) do
    local k = counts[i]
    if k > 0 then merged:narrow(1, off + 1, k):copy((as_batch3(t, group.nd_mode))) end
    off = off + k
  end
  if n > 0 then
    zeropower(ctx, group, merged, dtype, a, b)
    if owner_scales(group) then foreach.scale({ merged }, slice_scale(hp, a, b)) end
  end
  local updates = {}
  off = 0
  for i, t in ipairs(tensors) do
    local k = counts[i]
    local u = k > 0 and merged:narrow(1, off + 1, k) or T.zeros({ 0, a, b }, dtype)
    updates[i] = u:view(t:size())
    off = off + k
  end
  return updates
end

local function validate_transform(name, tr, working)
  if type(tr) ~= "table" then
    E.raise(E.EINVAL, "parameter '%s': ns_transform_fn must return a table {tensors=..., restore=...} or nil, got %s", name, type(tr))
  end
  if type(tr.tensors) ~= "table" or #tr.tensors == 0 then
    E.raise(E.EINVAL, "parameter '%s': NSInputTransform.tensors must not be empty", name)
  end
  for i, t in ipairs(tr.tensors) do
    if not T.is_tensor(t) then
      E.raise(E.EINVAL, "parameter '%s': NSInputTransform.tensors[%d] must be a tensor", name, i)
    end
    if t:dtype() ~= working:dtype() then
      E.raise(E.EINVAL, "parameter '%s': NSInputTransform tensors must have the same dtype as the NS input", name)
    end
    if t:dim() < 2 then
      E.raise(E.EINVAL, "parameter '%s': NSInputTransform tensors must have at least two dimensions", name)
    end
  end
  local r = tr.restore
  if type(r) ~= "function" and not (type(r) == "table" and getmetatable(r) and getmetatable(r).__call) then
    E.raise(E.EINVAL, "parameter '%s': NSInputTransform.restore must be a function, got %s", name, type(r))
  end
end

-- The tensors NS runs on for one working input, and how to write their
-- updates back (seed: _prepare_ns_transform / _reshape_ns_input).
local function prepare(ctx, group, name, working)
  if group.ns_transform_fn and name then
    local subject = "parameter '" .. name .. "'"
    local tr = E.call_hook_on(subject, "ns_transform_fn", group.ns_transform_fn, name, working)
    if tr ~= nil then
      validate_transform(name, tr, working)
      return tr.tensors, function(updates, output)
        E.call_hook_on(subject, "NSInputTransform.restore", tr.restore, updates, output)
      end
    end
  end
  local views = { working }
  if group.reshape_fn and name then
    local r = E.call_hook_on("parameter '" .. name .. "'", "reshape_fn", group.reshape_fn, name, working)
    if r ~= nil and #r > 0 then
      for i, v in ipairs(r) do
        if not T.is_tensor(v) or not v:shares_storage(working) then
          E.raise(E.EINVAL, "parameter '%s': reshape_fn must return views that share storage with the working NS input tensor (result %d does not)",
            name, i)
        end
      end
      views = r
      if not P.same_shape(r[1], working) then -- (the seed's logger.info_rank0)
        ctx:log("info", "Reshape %s from %s to %s", name, P.shape_string(working), P.shape_string(r[1]))
      end
    end
  end
  return views, function(updates, output)
    for i, v in ipairs(views) do
      if updates[i] ~= v then v:copy(updates[i]) end
    end
    if output ~= working then output:copy(working) end
  end
end

-- Orthogonalize and scale NS inputs of one group in place, on the rank
-- that owns them: items = list of { name = fqn, input = contiguous tensor
-- holding the parameter (or a batch slice of it) }. Results do not depend
-- on how items are batched or on which rank runs this (see src/ns.c).
-- A hook that changes its first argument in place returns nothing (or
-- that argument): anything else would be ignored, so it raises, naming
-- the hook.
-- (subject: what the hook runs on, for the budget's messages: E.call_hook_on)
local function call_in_place_on(subject, hook, fn, what, x, ...)
  local r = E.call_hook_on(subject, hook, fn, x, ...)
  if r ~= nil and r ~= x then
    E.raise(E.EINVAL, "%s returned %s, which would be ignored: it changes %s in place and returns nothing",
      hook, T.is_tensor(r) and "a tensor" or ("a " .. type(r)), what)
  end
end
local function call_in_place(hook, fn, what, x, ...) return call_in_place_on(nil, hook, fn, what, x, ...) end
M.call_in_place = call_in_place

-- A hook's ctx: a read-only view (muon.readonly) of fields; its signals
-- are the step's (one copy per step, which the step checks after its
-- hooks: muon.step), the rest copied for the call.
local CTX_WHY = "a hook's ctx is read-only (change a copy of what you read)"
local SHARED_SIGNALS = { signals = true }
local function hook_ctx(fields) return RO.view(fields, "ctx", CTX_WHY, SHARED_SIGNALS) end

-- pre_ortho_fn(G, state, ctx) / post_ortho_fn(O, state, ctx) on one item:
-- x is its (k, A, B) core matrices (the Newton-Schulz input after momentum,
-- or its output before the scale), state its hook state as (k, d1, d2)
-- views (d1, d2: the rule's dims, K.HOOK_STATE_RULES), the same tensors
-- for both hooks of a step; the hook changes x (and state) in place. ctx
-- (read-only): param_fqn, logical_shape, region, step, lr, weight_decay,
-- signals, and allreduce / global_norm over the whole parameter
-- (muon.reduce).
local function ortho_hook(hook, group, hp, it, x, a, b)
  local k = it.k
  local state = {}
  for name, rule in pairs(group.hook_state or {}) do
    local r = K.hook_state_rule(rule)
    state[name] = it.state[name]:view({ k, rule_dim(r[2], a, b), rule_dim(r[3], a, b) })
  end
  local red = Rd.whole(hook)
  local ctx = hook_ctx({
    param_fqn = it.name, logical_shape = it.shape, region = it.region, step = group.step + 1,
    lr = hp.lr, weight_decay = hp.weight_decay, signals = it.signals,
    allreduce = red.allreduce, global_norm = red.global_norm,
  })
  Rd.during(red, call_in_place_on, "parameter '" .. it.name .. "'", hook, group[hook],
    hook == "pre_ortho_fn" and "G" or "O", x, state, ctx)
  RO.verify(ctx, hook)
end

-- pre_ortho_fn, then the Newton-Schulz input must still be finite.
local function pre_ortho(group, hp, it, x, a, b)
  ortho_hook("pre_ortho_fn", group, hp, it, x, a, b)
  if foreach.first_nonfinite({ x }) then
    E.raise(E.ENONFINITE, "parameter '%s': pre_ortho_fn left NaN or Inf in the Newton-Schulz input", it.name)
  end
end

-- (k, A, B) views of NS inputs, kept while the input lives: the inputs are
-- the step's own buffers, so a step makes no new views.
local views = setmetatable({}, { __mode = "k" })
local function batch_view(t, nd_mode)
  local v = views[t]
  if v == nil or v.nd_mode ~= nd_mode then
    local a, b = core_shape(t:size(), nd_mode)
    local k = t:numel() / (a * b)
    v = { x = t:view({ k, a, b }), k = k, a = a, b = b, nd_mode = nd_mode }
    views[t] = v
  end
  return v
end

-- Orthogonalize in two halves around one Newton-Schulz call for many
-- batches (muon.step runs every local batch's ns_prepare, one scheduler
-- call over all their jobs, then every ns_finish): ns_prepare appends to
-- jobs one { x = (k, A, B) view of an input, r = resolved NS options } per
-- non-empty item (NS runs in place) and returns what ns_finish needs, or
-- nil when the group's hooks around Newton-Schulz (reshape_fn,
-- ns_transform_fn, zeropower_fn) or a non-contiguous input need the
-- general path (kind.orthogonalize). The results have the bits of one
-- call per batch (src/ns.c: each matrix's bits depend on it alone).
function kind.ns_prepare(_, group, hp, items, jobs)
  if owner_scales(group) then return nil end
  for _, it in ipairs(items) do
    if not it.input:is_contiguous() then return nil end
  end
  local done = {}
  for _, it in ipairs(items) do
    local t = it.input
    if t:numel() > 0 then
      local v = batch_view(t, group.nd_mode)
      it.k = v.k
      if group.pre_ortho_fn then pre_ortho(group, hp, it, v.x, v.a, v.b) end
      jobs[#jobs + 1] = { x = v.x, r = group._ns }
      done[#done + 1] = { it = it, v = v }
    end
  end
  return done
end

-- post_ortho_fn (when set) on each item; the scale is the apply's
-- (kind.apply_scale: ns_prepare runs for groups whose owner does not scale).
function kind.ns_finish(_, group, hp, _, done)
  if not group.post_ortho_fn then return end
  for _, d in ipairs(done) do
    local v = d.v
    ortho_hook("post_ortho_fn", group, hp, d.it, v.x, v.a, v.b)
  end
end

-- zeropower_fn without a hook that reshapes: the inputs of one core shape
-- are packed into one (n, A, B) buffer, which the hook orthogonalizes,
-- scaled there, and unpacked back.
local function orthogonalize_packed(ctx, group, hp, items)
  local by, order = {}, {}
  for _, it in ipairs(items) do
    local t = it.input
    if t:numel() > 0 then
      local a, b = core_shape(t:size(), group.nd_mode)
      local byd = by[t.scalar]
      if not byd then byd = {}; by[t.scalar] = byd end
      local bya = byd[a]
      if not bya then bya = {}; byd[a] = bya end
      local list = bya[b]
      if not list then
        list = { a = a, b = b, n = 0, tensors = {} }
        bya[b] = list
        order[#order + 1] = list
      end
      it.k = t:numel() / (a * b)
      list[#list + 1] = it
      list.tensors[#list.tensors + 1] = t
      list.n = list.n + it.k
    end
  end
  for slot, list in ipairs(order) do
    local a, b = list.a, list.b
    local dtype = list.tensors[1]:dtype()
    local merged = ctx:batch_buffer(dtype, list.n, a, b, slot)
    foreach.pack(list.tensors, merged)
    if group.pre_ortho_fn then
      local off = 0
      for _, it in ipairs(list) do
        pre_ortho(group, hp, it, merged:narrow(1, off + 1, it.k), a, b)
        off = off + it.k
      end
    end
    zeropower(ctx, group, merged, dtype, a, b)
    if group.post_ortho_fn then
      local off = 0
      for _, it in ipairs(list) do
        ortho_hook("post_ortho_fn", group, hp, it, merged:narrow(1, off + 1, it.k), a, b)
        off = off + it.k
      end
    end
    if owner_scales(group) then foreach.scale({ merged }, slice_scale(hp, a, b)) end
    foreach.unpack(merged, list.tensors)
  end
end

function kind.orthogonalize(ctx, group, hp, items)
  local jobs = {}
  local done = kind.ns_prepare(ctx, group, hp, items, jobs)
  if done then
    ctx:ns_many(jobs)
    return kind.ns_finish(ctx, group, hp, items, done)
  end
  if not (group.ns_transform_fn or group.reshape_fn) then
    local contiguous = true
    for _, it in ipairs(items) do contiguous = contiguous and it.input:is_contiguous() end
    if contiguous then return orthogonalize_packed(ctx, group, hp, items) end
  end
  local prepared, order, records = {}, {}, {}
  for i, it in ipairs(items) do
    local tensors, restore = prepare(ctx, group, it.name, it.input)
    prepared[i] = { tensors = tensors, restore = restore, updates = {} }
    for j, t in ipairs(tensors) do
      local a, b = core_shape(t:size(), group.nd_mode)
      local key = t:dtype() .. ":" .. a .. "x" .. b
      if not records[key] then
        records[key] = {}
        order[#order + 1] = key
      end
      local r = records[key]
      r[#r + 1] = { t = t, item = i, index = j }
    end
  end
  for slot, key in ipairs(order) do
    local recs = records[key]
    local tensors = {}
    for i, r in ipairs(recs) do tensors[i] = r.t end
    local updates = ns_merged(ctx, group, hp, tensors, slot)
    for i, r in ipairs(recs) do prepared[r.item].updates[r.index] = updates[i] end
  end
  for i, it in ipairs(items) do
    local pr = prepared[i]
    pr.restore(pr.updates, it.input)
  end
end

-- p = p * decay + alpha * update * scale (the seed's foreach mul_ /
-- add_); with weight_decay_mode "cautious" the decay only where the update
-- moves p towards zero.
function kind.apply_coeffs(group, hp)
  return 1.0 - hp.lr * hp.weight_decay, hp.apply_lr_in_update and 1.0 or -hp.lr,
    group.weight_decay_mode == "cautious"
end

-- The scale of the update of a parameter of this global shape: the
-- seed's per-slice scale, applied by the apply (u * s rounds as the seed's
-- update.mul_(s) before its add_), or 1 where the owner scaled.
function kind.apply_scale(group, hp, shape)
  if owner_scales(group) then return 1 end
  return slice_scale(hp, core_shape(shape, group.nd_mode))
end

-- post_update_fn on this rank's part of each stepped parameter, before the
-- commit (params: the step's stand-ins, whose value is a private copy
-- after the apply, which the commit copies into the parameter:
-- muon.scratch).
-- The hook gets param (read-only: name, value, grad, logical_shape) and
-- ctx (read-only). ctx.box: where this rank's tensor lies in the parameter
-- (1-based start and length per dim; all of it on one process);
-- ctx.signals: the values the trainer set for this step (eng:set_signal);
-- ctx.allreduce and ctx.global_norm: reductions over the parameter's
-- pieces on every rank (reducers[i], muon.reduce).
function kind.post_update(group, hp, params, boxes, signals, reducers)
  local fn = group.post_update_fn
  if not fn then return end
  for i, p in ipairs(params) do
    local red = reducers and reducers[i] or Rd.whole("post_update_fn", p.value:size())
    local shape = p.logical_shape or p.value:size()
    local param = RO.view({ name = p.name, value = p.value, grad = p.grad, logical_shape = shape }, "param",
      "post_update_fn's parameter is read-only (change param.value in place)")
    local ctx = hook_ctx({
      param_fqn = p.name,
      logical_shape = shape,
      lr = hp.lr,
      weight_decay = hp.weight_decay,
      step = group.step + 1, -- (the step being taken: the commit counts it)
      box = boxes and boxes[i],
      signals = signals or {},
      allreduce = red.allreduce, global_norm = red.global_norm,
    })
    Rd.during(red, call_in_place_on, "parameter '" .. p.name .. "'", "post_update_fn", fn, "the parameter", param,
      p.value, ctx)
    RO.verify(param, "post_update_fn")
    RO.verify(ctx, "post_update_fn")
  end
end

--------------------------------------------------------- the optimizer

M.core_shape = core_shape
return class.module(K.register(kind), M)
