-- AdamW as torch.optim.AdamW (bias-corrected, decoupled weight decay), for
-- 1-D parameters, embeddings and heads. The math runs in C (foreach.adamw).
-- A step is atomic: gradients are checked before anything changes.
local T = require("muon.tensor")
local foreach = require("muon.foreach")
local O = require("muon.optim.options")
local P = require("muon.param")
local first_nonfinite = require("muon.optim.util").first_nonfinite

local AdamW = {}
AdamW.__index = AdamW

-- torch.optim.AdamW's defaults.
local DEFAULTS = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, nonfinite = "error" }
local ALLOWED = { lr = true, betas = true, eps = true, weight_decay = true, nonfinite = true }
AdamW.DEFAULTS, AdamW.OPTIONS = DEFAULTS, ALLOWED

local function resolve_group(g, level)
  O.number("lr", g.lr, 0, level + 1)
  O.number("eps", g.eps, 0, level + 1)
  O.number("weight_decay", g.weight_decay, 0, level + 1)
  if type(g.betas) ~= "table" or #g.betas ~= 2 then
    error("betas must be a pair {beta1, beta2}, got " .. tostring(g.betas), level + 1)
  end
  for i = 1, 2 do
    O.number("betas[" .. i .. "]", g.betas[i], 0, level + 1)
    if g.betas[i] >= 1 then
      error(("betas[%d] must be in [0, 1), got %s"):format(i, tostring(g.betas[i])), level + 1)
    end
  end
  O.oneof("nonfinite", g.nonfinite, { "error", "skip" }, level + 1)
end

local function new(params, opts, level)
  level = level or 2
  opts = opts or {}
  if type(opts) ~= "table" then error("AdamW: options must be a table", level) end
  local unknown = O.unknown_keys(opts, ALLOWED)
  if #unknown > 0 then error("AdamW got unexpected options: " .. table.concat(unknown, ", "), level) end
  if type(params) ~= "table" then error("AdamW: params must be a table", level) end
  local defaults = O.merge(DEFAULTS, opts)
  resolve_group(defaults, level)
  local self = setmetatable({ defaults = defaults, param_groups = {}, state = {},
    stats = { steps = 0, skipped_nonfinite = 0 } }, AdamW)
  local groups = params
  if #params == 0 or P.is_param(params[1]) then groups = { { params = params } } end
  for gi, g in ipairs(groups) do
    if type(g) ~= "table" or type(g.params) ~= "table" then
      error(("AdamW: param group %d must be a table with a params list"):format(gi), level)
    end
    local bad = {}
    for k in pairs(g) do
      if k ~= "params" and k ~= "name" and k ~= "step" and not ALLOWED[k] then bad[#bad + 1] = tostring(k) end
    end
    table.sort(bad)
    if #bad > 0 then
      error(("AdamW param group %d got unexpected keys: %s"):format(gi, table.concat(bad, ", ")), level)
    end
    for i, p in ipairs(g.params) do
      if not P.is_param(p) then
        error(("AdamW param group %d: params[%d] is not a muon.param"):format(gi, i), level)
      end
    end
    local group = O.merge(defaults, {})
    for k, v in pairs(g) do group[k] = v end
    resolve_group(group, level)
    group.step = g.step or 0
    self.param_groups[gi] = group
  end
  return self
end

-- Validate a group's gradients; returns the params that take a step, or
-- nil when the group is skipped for NaN/Inf.
local function plan_group(gi, group)
  local params, grads = {}, {}
  for _, p in ipairs(group.params) do
    if p.grad ~= nil then
      if not P.same_shape(p.grad, p.value) then
        error(("parameter '%s': grad shape %s does not match value shape %s")
          :format(p.name, P.shape_string(p.grad), P.shape_string(p.value)), 0)
      end
      params[#params + 1] = p
      grads[#grads + 1] = p.grad
    end
  end
  local bad = first_nonfinite(grads)
  if bad then
    if group.nonfinite == "skip" then return nil end
    error(("parameter '%s': gradient holds NaN or Inf (param group %d)"):format(params[bad].name, gi), 0)
  end
  return params
end

function AdamW:_commit(group, params)
  -- torch keeps a step count per parameter; params with equal counts share
  -- one fused call.
  local by_step, order = {}, {}
  for _, p in ipairs(params) do
    local st = self.state[p]
    if st == nil then
      st = { step = 0, exp_avg = T.zeros(p.value:size(), p.value:dtype()),
        exp_avg_sq = T.zeros(p.value:size(), p.value:dtype()) }
      self.state[p] = st
    end
    st.step = st.step + 1
    local key = st.step .. ":" .. p.value:dtype()
    local b = by_step[key]
    if not b then
      b = { step = st.step, params = {}, grads = {}, m = {}, v = {} }
      by_step[key] = b
      order[#order + 1] = key
    end
    local n = #b.params + 1
    b.params[n], b.grads[n], b.m[n], b.v[n] = p.value, p.grad, st.exp_avg, st.exp_avg_sq
  end
  for _, key in ipairs(order) do
    local b = by_step[key]
    local step = b.step
    foreach.adamw(b.params, b.grads, b.m, b.v, {
      lr = group.lr, beta1 = group.betas[1], beta2 = group.betas[2], eps = group.eps,
      weight_decay = group.weight_decay, step = step,
    })
  end
end

-- prepare (may raise) / commit (cannot fail) / finish, as Muon.
function AdamW:prepare()
  local plans = {}
  for gi, group in ipairs(self.param_groups) do
    local ok, params = pcall(plan_group, gi, group)
    if not ok then error(params, 0) end
    plans[gi] = params or false
  end
  return plans
end

function AdamW:commit(plans)
  for gi, group in ipairs(self.param_groups) do
    group.step = group.step + 1
    if plans[gi] then
      self:_commit(group, plans[gi])
    else
      self.stats.skipped_nonfinite = self.stats.skipped_nonfinite + 1
    end
  end
  self.stats.steps = self.stats.steps + 1
end

function AdamW:finish() end

function AdamW:step()
  local ok, plans = pcall(self.prepare, self)
  if not ok then error(plans, 2) end
  self:commit(plans)
end

function AdamW:params()
  local list = {}
  for _, g in ipairs(self.param_groups) do
    for _, p in ipairs(g.params) do list[#list + 1] = p end
  end
  return list
end

require("muon.optim.state").install(AdamW)

return setmetatable({ new = new, AdamW = AdamW, DEFAULTS = DEFAULTS, OPTIONS = ALLOWED }, {
  __call = function(_, params, opts) return new(params, opts, 3) end,
})
