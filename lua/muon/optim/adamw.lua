-- AdamW as torch.optim.AdamW (bias-corrected, decoupled weight decay), for
-- 1-D parameters, embeddings and heads. The math runs in C (foreach.adamw).
-- A step is atomic: gradients are checked before anything changes.
local T = require("muon.tensor")
local foreach = require("muon.foreach")
local O = require("muon.optim.options")
local stepping_params = require("muon.optim.util").stepping_params

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
  local defaults, groups = O.build_groups({ what = "AdamW", defaults = DEFAULTS, allowed = ALLOWED,
    resolve = resolve_group }, params, opts, level)
  return setmetatable({ defaults = defaults, param_groups = groups, state = {},
    stats = { steps = 0, skipped_nonfinite = 0 } }, AdamW)
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
    local params, skipped = stepping_params(gi, group)
    plans[gi] = not skipped and params
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

require("muon.optim.util").install_common(AdamW)

return setmetatable({ new = new, AdamW = AdamW, DEFAULTS = DEFAULTS, OPTIONS = ALLOWED }, {
  __call = function(_, params, opts) return new(params, opts, 3) end,
})
