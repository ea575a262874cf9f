-- NorMuon (Li et al., "NorMuon: Making Muon more efficient and scalable",
-- 2025): configs/muon.lua with, on the hidden group, a per-row second
-- moment of the orthogonalized update. After Newton-Schulz, for each 2-D
-- core matrix O (rows x cols):
--   v  = beta2 * v + (1 - beta2) * mean(O^2 along cols)     (rows x 1, from 0)
--   O' = O / (sqrt(v) + eps)
--   O' = O' * ||O||_F / (||O'||_F + eps)
-- then the seed's scaling, weight decay and apply, unchanged.
local schedules = require("muon.schedules")

local beta2, eps = 0.95, 1e-10

-- O: the NS output of one parameter's core matrices (k x rows x cols);
-- state.v: its hook state (k x rows x 1), kept across steps.
local function normuon(O, state)
  local v = state.v
  v:mul_(beta2):add_(O:mul(O):mean(3, true), 1 - beta2)
  local On = O:div(v:sqrt():add(eps))
  local norm = function(x) return x:norm(2, 3, true):norm(2, 2, true) end -- per core matrix
  O:copy(On:mul(norm(O):div(norm(On):add(eps))))
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
      hook_state = { v = "rows" },
      post_ortho_fn = normuon,
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
