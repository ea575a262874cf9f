-- Baseline: AdamW for every parameter, same schedule shape as configs/muon.lua.
local warmup, total = 20, 1000
return {
  groups = {
    { name = "all", optimizer = "adamw", match = ".*", lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0 },
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
