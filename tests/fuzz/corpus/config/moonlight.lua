-- Moonlight (Liu et al., "Muon is Scalable for LLM Training", 2025):
-- Muon with the legacy quintic Newton-Schulz (3.4445, -4.7750, 2.0315) x 5,
-- update RMS matched to AdamW (0.2 * sqrt(max(A, B))), decoupled weight
-- decay 0.1, Nesterov momentum 0.95; AdamW with the same lr and decay for
-- embeddings, head and 1-D parameters. Warmup then cosine decay.
local warmup, total = 100, 10000
return {
  groups = {
    {
      name = "matrices", optimizer = "muon", min_dim = 2, match = ".*", exclude = { "embed", "head" },
      lr = 2e-2, weight_decay = 0.1, matched_adamw_rms = 0.2, momentum = 0.95, nesterov = true,
      ns_steps = 5, ns_variant = "legacy",
    },
    { name = "adamw", optimizer = "adamw", match = ".*", lr = 2e-2, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 },
  },
  schedule = function(step, group)
    if step <= warmup then return group.base_lr * step / warmup end
    local t = math.min(1, (step - warmup) / (total - warmup))
    return group.base_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
  end,
}
