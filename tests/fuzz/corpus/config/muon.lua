-- The seed's Muon defaults for hidden matrices; AdamW for everything else
-- (embeddings, output head, biases and other 1-D parameters).
-- Learning rates follow a short linear warmup then cosine decay to 10%.
local warmup, total = 20, 1000
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
    },
    {
      name = "rest",
      optimizer = "adamw",
      match = ".*",
      lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0,
    },
  },
  schedule = function(step, group)
    local f
    if step <= warmup then
      f = step / warmup
    else
      local t = math.min(1, (step - warmup) / math.max(1, total - warmup))
      f = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))
    end
    return { lr = group.base_lr * f }
  end,
}
