-- AdamW as torch.optim.AdamW (bias-corrected, decoupled weight decay), for
-- 1-D parameters, embeddings and heads. The math runs in C
-- (foreach.adamw_update, then the same fused apply as Muon).
--
-- This module is the AdamW *kind* for the step protocol (muon.step), and
-- muon.optim.AdamW(params, opts), a one-process optimizer over it.
local foreach = require("muon.foreach")
local O = require("muon.optim.options")

local kind = { name = "adamw", ns = false, state_keys = { "exp_avg", "exp_avg_sq" }, counts_steps = true,
  -- state whose overflow the update does not show (exp_avg_sq = Inf makes
  -- the update 0); checked for NaN/Inf each step (muon.step)
  hidden_state_keys = { "exp_avg_sq" } }

-- torch.optim.AdamW's defaults.
local DEFAULTS = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, nonfinite = "error" }
local ALLOWED = { lr = true, betas = true, eps = true, weight_decay = true, nonfinite = true }
kind.DEFAULTS, kind.OPTIONS, kind.HOOKS = DEFAULTS, ALLOWED, {}

local function check_betas(b, level)
  if type(b) ~= "table" or #b ~= 2 then
    error("betas must be a pair {beta1, beta2}, got " .. tostring(b), level + 1)
  end
  for i = 1, 2 do
    O.number("betas[" .. i .. "]", b[i], 0, level + 1)
    if b[i] >= 1 then
      error(("betas[%d] must be in [0, 1), got %s"):format(i, tostring(b[i])), level + 1)
    end
  end
end

kind.SCHEDULABLE = {
  lr = function(v, level) O.number("lr", v, 0, level + 1) end,
  weight_decay = function(v, level) O.number("weight_decay", v, 0, level + 1) end,
  eps = function(v, level) O.number("eps", v, 0, level + 1) end,
  betas = check_betas,
}

function kind.resolve(g, level)
  O.number("lr", g.lr, 0, level + 1)
  O.number("eps", g.eps, 0, level + 1)
  O.number("weight_decay", g.weight_decay, 0, level + 1)
  check_betas(g.betas, level + 1)
  O.oneof("nonfinite", g.nonfinite, { "error", "skip" }, level + 1)
end

function kind.check_param() end
function kind.whole() return false end

-- Moments and update direction on the entries this rank keeps state for:
-- entry = { p, grad, old = { exp_avg, exp_avg_sq }, new = {...}, u,
-- count = the parameter's step number after this step (torch counts steps
-- per parameter) }.
function kind.direction(_, _, hp, entries)
  -- One fused call per (step count, dtype); usually all share one.
  local by, order = {}, {}
  for _, e in ipairs(entries) do
    local byc = by[e.count]
    if not byc then
      byc = {}
      by[e.count] = byc
    end
    local b = byc[e.u.scalar]
    if not b then
      b = { count = e.count, g = {}, m = {}, v = {}, nm = {}, nv = {}, u = {} }
      byc[e.u.scalar] = b
      order[#order + 1] = b
    end
    local n = #b.g + 1
    b.g[n], b.m[n], b.v[n] = e.grad:is_contiguous() and e.grad or e.grad:contiguous(), e.old.exp_avg, e.old.exp_avg_sq
    b.nm[n], b.nv[n], b.u[n] = e.new.exp_avg, e.new.exp_avg_sq, e.u
  end
  local b1, b2 = hp.betas[1], hp.betas[2]
  for _, b in ipairs(order) do
    foreach.adamw_update(b.g, b.m, b.v, b.nm, b.nv, b.u,
      { lr = hp.lr, beta1 = b1, beta2 = b2, eps = hp.eps, step = b.count })
  end
end

-- p = p * (1 - lr wd) + update (torch: p.mul_(1 - lr*wd); p.addcdiv_(...)).
function kind.apply_coeffs(_, hp)
  return 1.0 - hp.lr * hp.weight_decay, 1.0
end

function kind.post_update() end

local make = require("muon.optim.util").optimizer_class(kind, "AdamW")

return setmetatable({ new = make.new, AdamW = make.class, kind = kind, DEFAULTS = DEFAULTS, OPTIONS = ALLOWED }, {
  __call = function(_, params, opts) return make.new(params, opts, 3) end,
})
