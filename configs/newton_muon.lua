-- Newton-Muon (Du, Su, "The Newton-Muon Optimizer", arXiv:2604.01472,
-- 2026; code: github.com/zhehangdu/Newton-Muon): Muon whose Newton-Schulz
-- input is right-preconditioned by the inverse second moment of the
-- layer's inputs Z, msgn(G (Z Z^T)^-1): the curvature along the input
-- directions that plain Muon leaves out. The trainer passes each weight's
-- input second moment S = Z Z^T / N of the step (cols x cols, row-major;
-- one per weight, shared by the core matrices of a 3-D one) as the signal
-- "zz.<name>" (eng:set_signal, mu_engine_set_signal). For each 2-D core
-- matrix G of the Newton-Schulz input:
--   K  = beta2 * K + (1 - beta2) * S          (hook_state K = "cols_cols", from 0)
--   A  = K + gamma * I,  gamma = damping * trace(K) / cols + tiny
--   G' = G A^-1                               (pre_ortho_fn)
-- then Newton-Schulz, the seed's scale, decay and apply, unchanged.
-- A^-1 is Newton's iteration for the inverse, X = X (2 I - A X) from
-- X = I / ||A||_F, iterations times (A is symmetric positive definite, its
-- condition number at most 1 + cols / damping, so it converges: quadratically
-- once ||I - A X|| < 1; 30 iterations reach float64 precision for cols up
-- to a few hundred). As this engine's hook sees it, the preconditioner
-- multiplies the momentum (the paper multiplies the raw gradient before
-- momentum) and is refreshed every step (the paper: every few steps).
local schedules = require("muon.schedules")
local T = require("muon.tensor")

local newton = { beta2 = 0.95, damping = 0.1, tiny = 1e-12, iterations = 30, signal = "zz.%s" }

-- The identity like a (k, n, n) tensor.
local function eye_like(a)
  local n = a:size(3)
  local e = T.zeros_like(a)
  for j = 1, a:size(1) do
    for i = 1, n do e:set(1, j, i, i) end
  end
  return e
end

-- G: the Newton-Schulz input (k x rows x cols); state.K: (k x cols x cols).
local function precondition(G, state, ctx)
  local name = ctx.param_fqn
  local s = ctx.signals[newton.signal:format(name)]
  local k, cols = G:size(1), G:size(3)
  if s == nil or (#s ~= cols * cols and #s ~= k * cols * cols) then
    error(("Newton-Muon: parameter '%s' needs the signal '%s' with its input second moment (%d x %d values), got %s")
      :format(name, newton.signal:format(name), cols, cols, s and (#s .. " values") or "none"))
  end
  local S = T.from(s, { #s == cols * cols and 1 or k, cols, cols }, G:dtype())
  local K = state.K
  K:mul_(newton.beta2):add_(S, 1 - newton.beta2)
  local I = eye_like(K)
  local trace = K:mul(I):sum(3, true):sum(2, true) -- (k, 1, 1)
  local A = K:add(I:mul(trace:mul(newton.damping / cols):add(newton.tiny)))
  local X = I:div(A:norm(2, 3, true):norm(2, 2, true))
  for _ = 1, newton.iterations do X = X:bmm(I:mul(2):sub(A:bmm(X))) end
  G:copy(G:bmm(X))
end

return {
  groups = {
    {
      name = "hidden",
      optimizer = "muon",
      min_dim = 2,
      match = ".*",
      exclude = { "embed", "head", "bias" },
      lr = 2e-2, weight_decay = 0.1, matched_adamw_rms = 0.2,
      momentum = 0.95, nesterov = true, ns_steps = 5, ns_variant = "asym5",
      hook_state = { K = "cols_cols" },
      pre_ortho_fn = precondition,
    },
    {
      name = "rest",
      optimizer = "adamw",
      match = ".*",
      lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0,
    },
  },
  schedule = schedules.warmup_cosine(20, 1000, 0.1),
}
