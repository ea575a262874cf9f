-- Baseline: AdamW for every parameter, same schedule shape as configs/muon.lua.
local schedules = require("muon.schedules")

return {
  groups = {
    { name = "all", optimizer = "adamw", match = ".*", lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0 },
  },
  schedule = schedules.warmup_cosine(20, 1000, 0.1),
}
