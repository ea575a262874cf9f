-- AdaMuon (Si, Zhang, Shen, "AdaMuon: Adaptive Muon Optimizer",
-- arXiv:2507.11005, v2): configs/muon.lua with, on the hidden group, the
-- sign-stabilized input and an element-wise second moment of the
-- orthogonalized update. For each 2-D core matrix of the momentum M:
--   G  = sign(M)                                  (pre_ortho_fn)
--   O  = NewtonSchulz(G)
--   v  = beta2 * v + (1 - beta2) * O * O          (elementwise, from 0; no bias
--                                                  correction: the rescale removes it)
--   O' = O / (sqrt(v) + eps)
--   O' = O' * 0.2 * sqrt(rows * cols) / ||O'||_F  (RMS-aligned: the update's RMS is
--                                                  0.2, as the seed's matched AdamW rms)
-- then p = p * (1 - lr * wd) - lr * O' (the seed's own scale is off:
-- matched_adamw_rms = 0 with zero_rms_scale_mode = "use_lr" scales by 1).
local schedules = require("muon.schedules")

local beta2, eps, rms = 0.95, 1e-8, 0.2

-- The Frobenius norm of each core matrix of a (k, rows, cols) tensor, as (k, 1, 1).
local function norms(x) return x:norm(2, 3, true):norm(2, 2, true) end

local function sign_input(G)
  G:sign_()
end

-- O: the Newton-Schulz output (k x rows x cols); state.v: (k x rows x cols).
local function adamuon(O, state)
  local v = state.v
  v:mul_(beta2):add_(O:mul(O), 1 - beta2)
  local On = O:div(v:sqrt():add(eps))
  local rows, cols = O:size(2), O:size(3)
  O:copy(On:div(norms(On):add(1e-30)):mul(rms * math.sqrt(rows * cols)))
end

return {
  groups = {
    {
      name = "hidden",
      optimizer = "muon",
      min_dim = 2,
      match = ".*",
      exclude = { "embed", "head", "bias" },
      lr = 2e-2, weight_decay = 0.1,
      matched_adamw_rms = 0, zero_rms_scale_mode = "use_lr", -- the hook scales
      momentum = 0.95, nesterov = true, ns_steps = 5, ns_variant = "asym5",
      hook_state = { v = "matrix" },
      pre_ortho_fn = sign_input,
      post_ortho_fn = adamuon,
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
