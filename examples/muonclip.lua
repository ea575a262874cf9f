-- MuonClip's QK-clip (configs/muonclip.lua) in a training loop: one
-- attention layer whose query and key weights are trained to raise the
-- attention logits (the failure QK-clip exists for: logits that grow
-- without bound). Each step the trainer measures every head's max logit
-- S_h = max_ij q_i . k_j / sqrt(head_dim), hands it to the engine as a
-- signal, and after the update the config's post_update_fn scales the
-- query and key rows of every head with S_h > tau by sqrt(tau / S_h).
-- Printed: the largest logit per step, with plain Muon (configs/muon.lua)
-- and with QK-clip (tau = 100).
--
--   build/muon run examples/muonclip.lua [steps]
local muon = require("muon")
local T = muon.tensor
local engine = require("muon.engine")

local steps = tonumber(arg and arg[1]) or 60
local n, d, heads, hd = 128, 16, 4, 8 -- tokens, model width, heads, head dim
local X = T.randn({ n, d }, 1)
local a = X:sum(1, true):transpose(1, 2) -- (d x 1): the sum of the tokens

-- Per-head max logit of X Wq^T (X Wk^T)^T / sqrt(hd).
local function max_logits(wq, wk)
  local Q, K = X:mm(wq:transpose(1, 2)), X:mm(wk:transpose(1, 2))
  local s = {}
  for h = 1, heads do
    local qh, kh = Q:narrow(2, (h - 1) * hd + 1, hd), K:narrow(2, (h - 1) * hd + 1, hd)
    s[h] = qh:mm(kh:transpose(1, 2)):amax() / math.sqrt(hd)
  end
  return s
end

local function train(config)
  local eng = engine.new(config)
  eng:set("lr_scale", 50) -- big steps: the logits blow up within the run
  local wq, wk = T.randn({ heads * hd, d }, 2):mul(0.3), T.randn({ heads * hd, d }, 3):mul(0.3)
  local gq, gk = T.zeros(wq:size()), T.zeros(wk:size())
  eng:add_param("layers.0.attn.wq", wq, gq)
  eng:add_param("layers.0.attn.wk", wk, gk)
  local peak = {}
  for step = 1, steps do
    local s = max_logits(wq, wk)
    eng:set_signal("max_logit.0", s) -- what the forward pass measured
    -- loss = -sum_h (sum_i q_i) . (sum_j k_j): pushes every logit up
    gq:copy(wk:mm(a):mul(-1):mm(a:transpose(1, 2)))
    gk:copy(wq:mm(a):mul(-1):mm(a:transpose(1, 2)))
    eng:step()
    peak[step] = math.max(unpack(max_logits(wq, wk)))
  end
  return peak
end

local plain = train(muon.config_path("muon"))
local clipped = train(muon.config_path("muonclip"))
print("step   max logit (Muon)   max logit (MuonClip, tau = 100)")
for step = 10, steps, 10 do print(("%4d %18.1f %18.1f"):format(step, plain[step], clipped[step])) end
local worst = math.max(unpack(clipped, steps - 9, steps))
print(("check: MuonClip's max logit over the last 10 steps %.1f stays near tau (Muon reached %.1f)")
  :format(worst, plain[steps]))
