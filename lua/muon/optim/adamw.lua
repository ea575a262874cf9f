-- AdamW in torch 2.x's form of torch.optim.AdamW (bias-corrected, decoupled
-- weight decay; 1 ulp from torch 1.13's), for
-- 1-D parameters, embeddings and heads. The math runs in C
-- (foreach.adamw_update, then the same fused apply as Muon).
--
-- This module is the AdamW *kind* for the step protocol (muon.step, the
-- contract in muon.optim.kind), and muon.optim.AdamW(params, opts), a
-- one-process optimizer over it.
local foreach = require("muon.foreach")
local O = require("muon.optim.options")
local K = require("muon.optim.kind")
local class = require("muon.optim.class")

local kind = { name = "adamw", class = "AdamW", counts_steps = true,
  -- (exp_avg_sq: a running mean of squares, never negative; its overflow
  -- does not show in the update, Inf makes it 0: direction checks it, the
  -- other moment and the apply in its pass, kind.checks)
  state = { { "exp_avg" }, { "exp_avg_sq", min = 0 } }, checks = true }

-- torch.optim.AdamW's defaults, checked in this order.
kind.options = {
  { "lr", 1e-3, O.number(0), schedulable = true, show = 1 },
  { "eps", 1e-8, O.number(0), schedulable = true, show = 4 },
  { "weight_decay", 1e-2, O.number(0), schedulable = true, show = 2 },
  { "betas", { 0.9, 0.999 }, O.betas(), schedulable = true, show = 3 },
}

-- Moments and update direction on the entries this rank keeps state for:
-- entry = { p, grad, old = { exp_avg, exp_avg_sq }, new = {...}, u,
-- count = the parameter's step number after this step (torch counts steps
-- per parameter) }. The same pass checks the new moments (as stored) and
-- the apply's result (p * (1 - lr wd) + u, reading p): returns the first
-- bad entry or nil, and whether the applies were checked (kind.checks).
function kind.direction(_, group, hp, entries)
  -- One fused call per (step count, dtype); usually all share one.
  local by, order = {}, {}
  local applies = true
  for i, e in ipairs(entries) do
    local byc = by[e.count]
    if not byc then
      byc = {}
      by[e.count] = byc
    end
    local b = byc[e.u.scalar]
    if not b then
      b = { count = e.count, g = {}, m = {}, v = {}, nm = {}, nv = {}, u = {}, p = {}, index = {} }
      byc[e.u.scalar] = b
      order[#order + 1] = b
    end
    local n = #b.g + 1
    b.g[n], b.m[n], b.v[n] = e.grad:is_contiguous() and e.grad or e.grad:contiguous(), e.old.exp_avg, e.old.exp_avg_sq
    b.nm[n], b.nv[n], b.u[n], b.p[n], b.index[n] = e.new.exp_avg, e.new.exp_avg_sq, e.u, e.p.value, i
    applies = applies and e.p.value:is_contiguous()
  end
  local b1, b2 = hp.betas[1], hp.betas[2]
  local decay, alpha = kind.apply_coeffs(group, hp)
  local first
  for _, b in ipairs(order) do
    local bad = foreach.adamw_update(b.g, b.m, b.v, b.nm, b.nv, b.u,
      { lr = hp.lr, beta1 = b1, beta2 = b2, eps = hp.eps, step = b.count },
      applies and { params = b.p, decay = decay, alpha = alpha } or nil)
    if bad and (first == nil or b.index[bad] < first) then first = b.index[bad] end
  end
  return first, applies
end

-- p = p * (1 - lr wd) + update (torch: p.mul_(1 - lr*wd); p.addcdiv_(...)).
function kind.apply_coeffs(_, hp)
  return 1.0 - hp.lr * hp.weight_decay, 1.0
end

return class.module(K.register(kind))
