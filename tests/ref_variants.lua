-- Independent double-precision references for the Muon variants (plain
-- Lua, small matrices), written from their formulas (not from the engine's
-- code) for the variant specs: NorMuon, cautious weight decay, spectral
-- scaling and conv flattening are options of ref_muon's muon_step; here is
-- MuonClip's QK-clip.
-- Parameters are { value = flat row-major array, grad = flat, shape = {...} }.
local R = require("ref_muon")

local V = {}

-- The variants of the Muon step itself (NorMuon, cautious decay, spectral
-- scale, flatten) are options of ref_muon's muon_step.
V.muon_step = R.muon_step

-- MuonClip's QK-clip on a (heads * head_dim, d) query or key weight: each
-- head whose max logit S_h exceeds tau has its rows scaled by sqrt(tau / S_h).
function V.qk_clip(p, heads, max_logits, tau)
  local rows, cols = p.shape[1], p.shape[2]
  local hd = rows / heads
  for h = 1, heads do
    local s = max_logits[h]
    if s > tau then
      local f = math.sqrt(tau / s)
      for i = (h - 1) * hd + 1, h * hd do
        for j = 1, cols do
          local k = (i - 1) * cols + j
          p.value[k] = p.value[k] * f
        end
      end
    end
  end
end

return V
