-- MuonH, Muon on the hyperball (NVIDIA Emerging-Optimizers,
-- orthogonalized_optimizers/muon_hyperball.py, MuonHyperball): every
-- hidden weight W stays on the sphere of radius R (Frobenius norm) and the
-- step is a step along it:
--   W <- R * normalize(W - lr * R * normalize(O)),  normalize(X) = X / max(||X||_F, eps)
-- O: the Newton-Schulz output of the momentum; ||.||_F over the whole weight,
-- however it is sharded (ctx.global_norm). R: MuonHyperball's
-- hyperball_radius, here sqrt(rows) for every weight (rows: the product of
-- every dim but the last; the norm of a weight
-- whose rows have unit norm); initialize the weights on it, as
-- MuonHyperball rescales them at construction (else the first step moves
-- them there). No weight decay (the sphere bounds the norm).
--   post_ortho_fn:  O <- R * O / max(||O||_F, eps)     (on the whole weight)
--   the apply:      W <- W - lr * O                    (scale 1: matched_adamw_rms = 0,
--                                                       zero_rms_scale_mode = "use_lr")
--   post_update_fn: W <- R * W / max(||W||_F, eps)     (each rank its piece, the norm
--                                                       of the whole weight)
local schedules = require("muon.schedules")

local hyperball = { eps = 1e-8 }
-- (rows: every dim but the last)
local function radius(shape)
  local rows = 1
  for d = 1, #shape - 1 do rows = rows * shape[d] end
  return math.sqrt(rows)
end

local function normalize_update(O, _, ctx)
  local R = radius(ctx.logical_shape)
  O:mul_(R / math.max(ctx.global_norm(O), hyperball.eps))
end

local function retract(_, w, ctx)
  local R = radius(ctx.logical_shape)
  w:mul_(R / math.max(ctx.global_norm(w), hyperball.eps))
end

return {
  groups = {
    {
      name = "hidden",
      optimizer = "muon",
      min_dim = 2,
      match = ".*",
      exclude = { "embed", "head", "bias" },
      lr = 2e-2, weight_decay = 0,
      matched_adamw_rms = 0, zero_rms_scale_mode = "use_lr", -- the hook scales
      momentum = 0.95, nesterov = true, ns_steps = 5, ns_variant = "asym5",
      post_ortho_fn = normalize_update,
      post_update_fn = retract,
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
