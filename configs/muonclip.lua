-- MuonClip (Kimi K2, Moonshot AI 2025): configs/muon.lua plus QK-clip after
-- each update. For the attention query and key weights named below, with
-- the trainer's per-head max attention logit S_h of the step (a signal set
-- with eng:set_signal / mu_engine_set_signal), every head h with S_h > tau
-- has its query rows and its key rows each scaled by sqrt(tau / S_h), so
-- that head's logits shrink by tau / S_h.
local schedules = require("muon.schedules")

local qk_clip = {
  tau = 100,                                 -- the logit cap
  heads = 4,                                 -- heads per q / k weight (head_dim = rows / heads)
  pattern = "^layers%.(%d+)%.attn%.w([qk])$", -- which weights: layer index, then q or k
  signal = "max_logit.%s",                   -- the signal of layer %s: one value per head
}

local function clip(_, w, ctx)
  local layer = ctx.param_fqn:match(qk_clip.pattern)
  local s = layer and ctx.signals[qk_clip.signal:format(layer)]
  if not s then return end
  local rows = ctx.logical_shape[1]
  local hd = rows / qk_clip.heads
  -- This rank's rows of the weight are box.start[1] .. box.start[1] + box.len[1] - 1.
  local first, count = ctx.box.start[1], ctx.box.len[1]
  for h = 1, qk_clip.heads do
    if s[h] > qk_clip.tau then
      local lo = math.max((h - 1) * hd + 1, first)
      local hi = math.min(h * hd, first + count - 1)
      if hi >= lo then w:narrow(1, lo - first + 1, hi - lo + 1):mul_(math.sqrt(qk_clip.tau / s[h])) end
    end
  end
end

return {
  groups = {
    {
      name = "hidden", optimizer = "muon", min_dim = 2, match = ".*", exclude = { "embed", "head", "bias" },
      lr = 2e-2, weight_decay = 0.1, matched_adamw_rms = 0.2, momentum = 0.95, nesterov = true,
      ns_steps = 5, ns_variant = "asym5",
      post_update_fn = clip,
    },
    { name = "rest", optimizer = "adamw", match = ".*", lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0 },
  },
  schedule = schedules.warmup_cosine(20, 1000, 0.1),
}
