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

local kind = { name = "lion", class = "Lion", state = { { "exp_avg" } } }

-- lion-pytorch's defaults, in its order.
kind.options = {
  { "lr", 1e-4, O.number(0), schedulable = true, show = 1 },
  { "betas", { 0.9, 0.99 }, O.betas(), schedulable = true, show = 3 },
  { "weight_decay", 0, O.number(0), schedulable = true, show = 2 },
}

-- The new moment and the direction sign(c) on the entries this rank keeps
-- state for: entry = { p, grad, old = { exp_avg }, new = { exp_avg }, u };
-- returns whether the new moment is finite as stored.
function kind.direction(_, _, hp, entries)
  local grads, ms, nms, us = {}, {}, {}, {}
  for i, e in ipairs(entries) do
    grads[i] = e.grad:is_contiguous() and e.grad or e.grad:contiguous()
    ms[i], nms[i], us[i] = e.old.exp_avg, e.new.exp_avg, e.u
  end
  local b1, b2 = hp.betas[1], hp.betas[2]
  local finite = true
  foreach.per_dtype(function(g, m, nm, u)
    if foreach.lion_update(g, m, nm, u, b1, b2) then finite = false end
  end, { grads, ms, nms, us })
  return finite -- (the moment as stored; the update is checked by the commit's checks)
end

-- p = p * (1 - lr wd) - lr * sign(c) (lion-pytorch: p.mul_(1 - lr*wd); p.add_(update, alpha=-lr)).
function kind.apply_coeffs(_, hp)
  return 1.0 - hp.lr * hp.weight_decay, -hp.lr
end

return class.module(K.register(kind))
