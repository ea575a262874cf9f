-- Keller Jordan's original Muon (modded-nanogpt): legacy Newton-Schulz
-- coefficients, update scaled by max(1, A/B)^0.5 instead of matching AdamW's
-- RMS, no weight decay, Nesterov momentum 0.95; Adam for the rest.
return {
  groups = {
    {
      name = "hidden", optimizer = "muon", min_dim = 2, match = ".*", exclude = { "embed", "head" },
      lr = 0.02, weight_decay = 0, momentum = 0.95, nesterov = true,
      ns_steps = 5, ns_variant = "legacy", scale_mode = "keller",
    },
    { name = "adam", optimizer = "adamw", match = ".*", lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-10, weight_decay = 0 },
  },
}
