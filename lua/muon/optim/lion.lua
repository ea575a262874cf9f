-- Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms";
-- lion-pytorch's update), a kind of one file on the contract of
-- muon.optim.kind. Per parameter, with m (exp_avg) starting at zero:
--
--   c = beta1*m + (1-beta1)*g;  p = p*(1 - lr*wd) - lr*sign(c);  m = beta2*m + (1-beta2)*g
--
-- sign(0) = 0. The moment and the direction run in C
-- (foreach.lion_update), then the same fused apply as Muon's and AdamW's.
-- muon.optim.Lion(params, opts) is a one-process optimizer over it; in a
-- config, optimizer = "lion".
local foreach = require("muon.foreach")
local O = require("muon.optim.options")
local K = require("muon.optim.kind")
local class = require("muon.optim.class")

local kind = { name = "lion", class = "Lion",
  -- an overflow of m shows in the update only as a sign: direction checks
  -- the new moment and the apply in its pass (kind.checks)
  state = { { "exp_avg" } }, checks = true }

-- lion-pytorch's defaults, in its order.
kind.options = {
  { "lr", 1e-4, O.number(0), schedulable = true, show = 1 },
  { "betas", { 0.9, 0.99 }, O.betas(), schedulable = true, show = 3 },
  { "weight_decay", 0, O.number(0), schedulable = true, show = 2 },
}

-- The new moment and the direction sign(c) on the entries this rank keeps
-- state for: entry = { p, grad, old = { exp_avg }, new = { exp_avg }, u }.
-- The same pass checks the new moment and the apply's result (reading p):
-- returns the first bad entry or nil, and whether the applies were checked
-- (kind.checks).
function kind.direction(_, group, hp, entries)
  local grads, ms, nms, us, ps = {}, {}, {}, {}, {}
  local applies = true
  for i, e in ipairs(entries) do
    grads[i] = e.grad:is_contiguous() and e.grad or e.grad:contiguous()
    ms[i], nms[i], us[i], ps[i] = e.old.exp_avg, e.new.exp_avg, e.u, e.p.value
    applies = applies and ps[i]:is_contiguous()
  end
  local b1, b2 = hp.betas[1], hp.betas[2]
  local decay, alpha = kind.apply_coeffs(group, hp)
  return foreach.per_dtype(function(g, m, nm, u, p)
    return foreach.lion_update(g, m, nm, u, b1, b2, applies and { params = p, decay = decay, alpha = alpha } or nil)
  end, { grads, ms, nms, us, ps }), applies
end

-- p = p * (1 - lr wd) - lr * sign(c) (lion-pytorch: p.mul_(1 - lr*wd); p.add_(update, alpha=-lr)).
function kind.apply_coeffs(_, hp)
  return 1.0 - hp.lr * hp.weight_decay, -hp.lr
end

return class.module(K.register(kind))
