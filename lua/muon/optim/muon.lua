-- Muon for one process, as the seed's Muon.step(): momentum -> group by core
-- shape -> memory-safe batches -> batched Newton-Schulz -> per-slice scale
-- -> decay + apply -> post_update_fn. The decisions are made here; every
-- bulk operation runs in C (foreach, ns).
--
-- A step is atomic: every update (momentum buffers included) is computed
-- into scratch buffers first; parameters, buffers and step counters change
-- only after nothing can fail any more. Only post_update_fn runs after.
local T = require("muon.tensor")
local ns = require("muon.ns")
local foreach = require("muon.foreach")
local O = require("muon.optim.options")
local P = require("muon.param")
local per_dtype = require("muon.optim.util").per_dtype
local stepping_params = require("muon.optim.util").stepping_params

local Muon = {}
Muon.__index = Muon

-- The seed's defaults (its Muon.__init__ and _MUON_ADVANCED_DEFAULTS), plus
-- three extensions: ns_path, scale_mode, nonfinite.
local DEFAULTS = {
  lr = 2e-2,
  weight_decay = 0.1,
  matched_adamw_rms = 0.2,
  momentum = 0.95,
  nesterov = true,
  ns_steps = 5,
  ns_variant = "asym5",
  ns_epsilon = 1e-10,
  zero_rms_scale_mode = "zero",
  apply_lr_in_update = false,
  ns_path = "symmetric", -- "symmetric" (syrk/symm) or "plain" (gemm)
  scale_mode = "matched_adamw_rms", -- or "keller": sqrt(max(1, A/B))
  nonfinite = "error", -- NaN/Inf gradient: "error" (atomic failure) or "skip" (skip the group's step)
}
-- Options whose default is nil.
local NIL_DEFAULTS = {
  ns_coefficients = true,
  zeropower_fn = true,
  momentum_update_fn = true,
  reshape_fn = true,
  ns_transform_fn = true,
  post_update_fn = true,
}
local HOOKS = { "zeropower_fn", "momentum_update_fn", "reshape_fn", "ns_transform_fn", "post_update_fn" }

local ALLOWED = {}
for k in pairs(DEFAULTS) do ALLOWED[k] = true end
for k in pairs(NIL_DEFAULTS) do ALLOWED[k] = true end
Muon.OPTIONS = ALLOWED
Muon.DEFAULTS = DEFAULTS

-- The seed splits NS batches at 512M elements (scaled down by the shard count).
local MAX_NUMEL_PER_BATCH = 512 * 1024 * 1024

local function momentum_pair(m, level)
  if type(m) == "number" then
    O.number("momentum", m, 0, level + 1)
    return m, m
  end
  if type(m) ~= "table" or (#m ~= 1 and #m ~= 2) then
    error("momentum must be a number or a list of one or two numbers, got " .. tostring(m), level + 1)
  end
  O.number("momentum[1]", m[1], 0, level + 1)
  O.number("momentum[" .. #m .. "]", m[#m], 0, level + 1)
  return m[1], m[#m]
end

-- Validate one group's options (already merged with the defaults) as the seed
-- does, and attach the resolved Newton-Schulz schedule.
local function resolve_group(g, level)
  -- The seed's order: variant, epsilon, zero-rms mode, then coefficients.
  local known = false
  for _, v in ipairs(ns.VARIANTS) do known = known or v == g.ns_variant end
  if not known then
    local quoted = {}
    for i, v in ipairs(ns.VARIANTS) do quoted[i] = "'" .. v .. "'" end
    error(("ns_variant must be %s, or %s, got %s"):format(table.concat(quoted, ", ", 1, #quoted - 1),
      quoted[#quoted], type(g.ns_variant) == "string" and ("'" .. g.ns_variant .. "'") or tostring(g.ns_variant)), level + 1)
  end
  if not O.is_finite(g.ns_epsilon) or g.ns_epsilon < 0 then
    error(("ns_epsilon must be a finite non-negative value, got %s"):format(tostring(g.ns_epsilon)), level + 1)
  end
  O.oneof("zero_rms_scale_mode", g.zero_rms_scale_mode, { "zero", "use_lr" }, level + 1)
  O.oneof("ns_path", g.ns_path, { "symmetric", "plain" }, level + 1)
  O.oneof("scale_mode", g.scale_mode, { "matched_adamw_rms", "keller" }, level + 1)
  O.oneof("nonfinite", g.nonfinite, { "error", "skip" }, level + 1)
  O.number("lr", g.lr, 0, level + 1)
  O.number("weight_decay", g.weight_decay, 0, level + 1)
  O.number("matched_adamw_rms", g.matched_adamw_rms, 0, level + 1)
  O.boolean("nesterov", g.nesterov, level + 1)
  O.boolean("apply_lr_in_update", g.apply_lr_in_update, level + 1)
  O.integer("ns_steps", g.ns_steps, 1, level + 1)
  if g.ns_variant ~= "custom" and g.ns_coefficients ~= nil then
    error("ns_coefficients can only be provided when ns_variant='custom'", level + 1)
  end
  momentum_pair(g.momentum, level + 1)
  for _, h in ipairs(HOOKS) do O.fn(h, g[h], level + 1) end
  local ok2, resolved = pcall(ns.resolve, {
    steps = g.ns_steps, variant = g.ns_variant, eps = g.ns_epsilon,
    coefficients = g.ns_coefficients, path = g.ns_path,
  })
  if not ok2 then error(tostring(resolved):gsub("^[^:]*:%d+: ", ""), level + 1) end
  g._ns = resolved
end

-- level nil: raise without position (inside a step).
local function check_param(p, level)
  if p.value:dim() < 2 then
    error(("parameter '%s' is %d-D: 1D parameters are not supported in Muon (use AdamW)")
      :format(p.name, p.value:dim()), level and level + 1 or 0)
  end
end

-- Muon(params_or_groups, opts): params is a list of muon.param, or a list of
-- groups { params = {...}, <option overrides> }.
local function new(params, opts, level)
  level = level or 2
  local defaults, groups = O.build_groups({ what = "Muon", defaults = DEFAULTS, allowed = ALLOWED,
    resolve = resolve_group, check_param = check_param }, params, opts, level)
  return setmetatable({
    defaults = defaults,
    param_groups = groups,
    state = {},
    stats = { steps = 0, skipped_nonfinite = 0 },
    _scratch = {}, -- per param: { spare = tensor, update = tensor } (never visible state)
    _merged = {}, -- NS batch buffers by shape key
    _ws = nil,
  }, Muon)
end

-- Core shape (A, B) NS runs on: 2-D as is; (A, 1, B) conv-like; else last two.
local function core_shape(shape)
  local n = #shape
  if n == 2 then return shape[1], shape[2] end
  if n == 3 and shape[2] == 1 then return shape[1], shape[3] end
  if n >= 3 then return shape[n - 1], shape[n] end
  error("1D parameters are not supported in Muon", 3)
end
Muon.core_shape = core_shape

-- The tensor as a (slices, A, B) view (or a contiguous copy if it can't be).
local function as_batch3(t)
  local shape = t:size()
  local a, b = core_shape(shape)
  local k = math.floor(t:numel() / math.max(a * b, 1))
  if a * b == 0 then k = 0 end
  if t:is_contiguous() then return t:view({ k, a, b }), k, a, b end
  return t:contiguous():view({ k, a, b }), k, a, b
end

-- Scale of an update slice with logical dims a x b (seed: compute_muon_slice_scale).
local function slice_scale(group, a, b)
  local s
  if group.scale_mode == "keller" then
    s = math.sqrt(math.max(1, a / b))
  elseif group.matched_adamw_rms == 0 then
    s = group.zero_rms_scale_mode == "use_lr" and 1.0 or 0.0
  else
    s = math.sqrt(math.max(a, b)) * group.matched_adamw_rms
  end
  if group.apply_lr_in_update then s = s * -group.lr end
  return s
end
Muon.slice_scale = slice_scale

-- A reusable (n, a, b) buffer for NS batches: one per (dtype, core shape,
-- slot), grown when a batch needs more slices, so memory stays bounded.
function Muon:_buffer(dtype, n, a, b, slot)
  local key = ("%s:%dx%d#%d"):format(dtype, a, b, slot)
  local buf = self._merged[key]
  if buf == nil or buf:size(1) < n then
    buf = T.zeros({ n, a, b }, dtype)
    self._merged[key] = buf
  end
  if buf:size(1) == n then return buf end
  return buf:narrow(1, 1, n)
end

function Muon:_workspace(dtype, a, b)
  local ws = self._ws
  if ws == nil or ws.dtype ~= dtype or ws.rows < math.max(a, b) or ws.cols < math.min(a, b) then
    local rows = math.max(a, b, ws and ws.dtype == dtype and ws.rows or 0)
    local cols = math.max(math.min(a, b), ws and ws.dtype == dtype and ws.cols or 0)
    ws = { dtype = dtype, rows = rows, cols = cols, handle = ns.workspace(dtype, rows, cols) }
    self._ws = ws
  end
  return ws.handle
end

-- Batched NS over tensors that share one core shape: returns their scaled
-- updates as views into a merged (n, A, B) buffer. slot keeps buffers of
-- groups that are alive at the same time apart.
function Muon:_ns_merged(group, tensors, slot)
  local a, b = core_shape(tensors[1]:size())
  local dtype = tensors[1]:dtype()
  local counts, n = {}, 0
  for i, t in ipairs(tensors) do
    local _, k = as_batch3(t)
    counts[i] = k
    n = n + k
  end
  local merged = self:_buffer(dtype, n, a, b, slot)
  local off = 0
  for i, t in ipairs(tensors) do
    local k = counts[i]
    if k > 0 then merged:narrow(1, off + 1, k):copy((as_batch3(t))) end
    off = off + k
  end
  if n > 0 then
    if group.zeropower_fn then
      local x = n == 1 and merged:select(1, 1) or merged
      local y = group.zeropower_fn(x, group.ns_steps)
      if not T.is_tensor(y) or not P.same_shape(y, x) then
        error(("zeropower_fn must return a tensor of shape %s"):format(P.shape_string(x)), 0)
      end
      if y ~= x then x:copy(y) end
    else
      ns.zeropower_into(merged, merged, group._ns, self:_workspace(dtype, a, b))
    end
    foreach.scale({ merged }, slice_scale(group, a, b))
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
    error(("parameter '%s': ns_transform_fn must return a table {tensors=..., restore=...} or nil, got %s")
      :format(name, type(tr)), 0)
  end
  if type(tr.tensors) ~= "table" or #tr.tensors == 0 then
    error(("parameter '%s': NSInputTransform.tensors must not be empty"):format(name), 0)
  end
  for i, t in ipairs(tr.tensors) do
    if not T.is_tensor(t) then
      error(("parameter '%s': NSInputTransform.tensors[%d] must be a tensor"):format(name, i), 0)
    end
    if t:dtype() ~= working:dtype() then
      error(("parameter '%s': NSInputTransform tensors must have the same dtype as the NS input"):format(name), 0)
    end
    if t:dim() < 2 then
      error(("parameter '%s': NSInputTransform tensors must have at least two dimensions"):format(name), 0)
    end
  end
  O.fn("NSInputTransform.restore", tr.restore, 1)
  if tr.restore == nil then
    error(("parameter '%s': NSInputTransform.restore must be callable"):format(name), 0)
  end
end

-- The tensors NS runs on for one working input, and how to write their
-- updates back (seed: _prepare_ns_transform / _reshape_ns_input).
function Muon:_prepare(group, name, working)
  if group.ns_transform_fn and name then
    local tr = group.ns_transform_fn(name, working)
    if tr ~= nil then
      validate_transform(name, tr, working)
      return tr.tensors, tr.restore
    end
  end
  local views = { working }
  if group.reshape_fn and name then
    local r = group.reshape_fn(name, working)
    if r ~= nil and #r > 0 then
      for i, v in ipairs(r) do
        if not T.is_tensor(v) or not v:shares_storage(working) then
          error(("parameter '%s': reshape_fn must return views that share storage with the working NS input tensor (result %d does not)")
            :format(name, i), 0)
        end
      end
      views = r
    end
  end
  return views, function(updates, output)
    for i, v in ipairs(views) do
      if updates[i] ~= v then v:copy(updates[i]) end
    end
    if output ~= working then output:copy(working) end
  end
end

-- Orthogonalize and scale the NS inputs of one group, in place: items is a
-- list of { name = fqn, input = contiguous tensor of the parameter's
-- (logical) shape }. Used by the single-process step and, on full matrices,
-- by the distributed step. Results do not depend on how items are batched.
function Muon:orthogonalize(group, items, shard_size)
  local order, by_shape = {}, {}
  for _, it in ipairs(items) do
    if it.input:numel() > 0 then
      local a, b = core_shape(it.input:size())
      local key = it.input:dtype() .. ":" .. a .. "x" .. b
      if not by_shape[key] then
        by_shape[key] = {}
        order[#order + 1] = key
      end
      local list = by_shape[key]
      list[#list + 1] = it
    end
  end
  local limit = math.floor(MAX_NUMEL_PER_BATCH / (shard_size or 1))
  for _, key in ipairs(order) do
    local batch, count = {}, 0
    local function flush()
      if #batch > 0 then self:_ns_batch(group, batch) end
      batch, count = {}, 0
    end
    for _, it in ipairs(by_shape[key]) do
      local n = it.input:numel()
      if #batch >= 1 and count + n > limit then flush() end
      batch[#batch + 1] = it
      count = count + n
    end
    flush()
  end
end

function Muon:_ns_batch(group, batch)
  local prepared, order, records = {}, {}, {}
  for i, it in ipairs(batch) do
    local tensors, restore = self:_prepare(group, it.name, it.input)
    prepared[i] = { tensors = tensors, restore = restore, updates = {} }
    for j, t in ipairs(tensors) do
      local a, b = core_shape(t:size())
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
    local updates = self:_ns_merged(group, tensors, slot)
    for i, r in ipairs(recs) do prepared[r.item].updates[r.index] = updates[i] end
  end
  for i, it in ipairs(batch) do
    local pr = prepared[i]
    pr.restore(pr.updates, it.input)
  end
end

local function scratch_for(self, p)
  local s = self._scratch[p]
  if s == nil or not P.same_shape(s.update, p.value) or s.update:dtype() ~= p.value:dtype() then
    s = { update = T.zeros(p.value:size(), p.value:dtype()) }
    self._scratch[p] = s
  end
  if s.spare == nil or not P.same_shape(s.spare, p.value) then
    s.spare = T.zeros(p.value:size(), p.value:dtype())
  end
  return s
end

-- Momentum for the given params into scratch: returns new buffers and NS
-- inputs without touching state (seed: _update_muon_momentum).
function Muon:momentum(group, params)
  local grads, bufs, new_bufs, updates = {}, {}, {}, {}
  for i, p in ipairs(params) do
    local st = self.state[p]
    local s = scratch_for(self, p)
    grads[i] = p.grad:is_contiguous() and p.grad or p.grad:contiguous()
    bufs[i] = st and st.momentum_buffer or s.spare:zero()
    new_bufs[i] = st and s.spare or T.zeros(p.value:size(), p.value:dtype())
    updates[i] = s.update
  end
  local m1, m2 = momentum_pair(group.momentum, 2)
  if group.momentum_update_fn then
    -- The hook may update buffers in place: give it copies, commit them later.
    for i = 1, #params do new_bufs[i]:copy(bufs[i]) end
    local result = group.momentum_update_fn(grads, new_bufs, m1, m2, group.nesterov)
    if type(result) ~= "table" or #result ~= #params then
      error(("momentum_update_fn must return one update tensor per input gradient, got %s updates for %d gradients")
        :format(type(result) == "table" and tostring(#result) or type(result), #params), 0)
    end
    for i, p in ipairs(params) do
      local u = result[i]
      if not T.is_tensor(u) or u:numel() ~= p.value:numel() then
        error(("parameter '%s': momentum_update_fn returned an update of the wrong size"):format(p.name), 0)
      end
      if u ~= updates[i] then updates[i]:copy(u:is_contiguous() and u:view(p.value:size()) or u:reshape(p.value:size())) end
    end
  else
    per_dtype(function(g, b, nb, u) foreach.momentum(g, b, nb, u, m1, m2, group.nesterov) end,
      { grads, bufs, new_bufs, updates })
  end
  return new_bufs, updates
end

-- Everything a group's step computes, before any visible change.
function Muon:_plan_group(gi, group)
  local params, skipped = stepping_params(gi, group, check_param)
  local plan = { group = group, params = params, step = group.step + 1, skipped = skipped or nil }
  if skipped or #params == 0 then return plan end
  plan.new_bufs, plan.updates = self:momentum(group, params)
  local items = {}
  for i, p in ipairs(params) do items[i] = { name = p.name, input = plan.updates[i], param = p } end
  self:orthogonalize(group, items, 1)
  for i, p in ipairs(params) do
    if not plan.updates[i]:all_finite() then
      error(("parameter '%s': update holds NaN or Inf"):format(p.name), 0)
    end
  end
  return plan
end

-- Commit a planned group step: swap momentum buffers, decay + apply.
function Muon:_commit(plan)
  local group = plan.group
  group.step = plan.step
  if plan.skipped then
    self.stats.skipped_nonfinite = self.stats.skipped_nonfinite + 1
    return
  end
  if #plan.params == 0 then return end
  local values = {}
  for i, p in ipairs(plan.params) do
    local st = self.state[p]
    if st == nil then
      st = {}
      self.state[p] = st
    else
      self._scratch[p].spare = st.momentum_buffer
    end
    st.momentum_buffer = plan.new_bufs[i]
    if self._scratch[p].spare == plan.new_bufs[i] then self._scratch[p].spare = nil end
    values[i] = p.value
  end
  local alpha = group.apply_lr_in_update and 1.0 or -group.lr
  local decay = 1.0 - group.lr * group.weight_decay
  per_dtype(function(v, u) foreach.apply(v, u, nil, decay, alpha) end, { values, plan.updates })
end

function Muon:_post_update(plan)
  local group = plan.group
  if not group.post_update_fn or plan.skipped then return end
  for _, p in ipairs(plan.params) do
    group.post_update_fn(p, p.value, {
      param_fqn = p.name,
      logical_shape = p.logical_shape or p.value:size(),
      lr = group.lr,
      weight_decay = group.weight_decay,
      step = group.step,
    })
  end
end

-- The three phases of a step, separate so that a host driving several
-- optimizers (the engine) can make their steps atomic together:
-- prepare() computes everything and may raise; commit() cannot fail;
-- finish() runs post_update_fn.
function Muon:prepare()
  local plans = {}
  for gi, group in ipairs(self.param_groups) do
    local ok, plan = pcall(self._plan_group, self, gi, group)
    if not ok then error(plan, 0) end
    plans[gi] = plan
  end
  return plans
end

function Muon:commit(plans)
  for _, plan in ipairs(plans) do self:_commit(plan) end
  self.stats.steps = self.stats.steps + 1
end

function Muon:finish(plans)
  for _, plan in ipairs(plans) do self:_post_update(plan) end
end

require("muon.optim.util").install_common(Muon)

return setmetatable({ new = new, Muon = Muon, DEFAULTS = DEFAULTS, OPTIONS = ALLOWED, core_shape = core_shape }, {
  __call = function(_, params, opts) return new(params, opts, 3) end,
})
