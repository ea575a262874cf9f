-- Scale modes (scale_mode) on one step from zero, for a wide, a square and
-- a tall matrix: the seed's "matched_adamw_rms" gives every update the same
-- RMS (0.2 x lr, like AdamW's), "keller" is max(1, rows/cols)^0.5, and
-- "spectral" scales each orthogonalized core by sqrt(rows / cols), so its
-- spectral norm -- the largest singular value, measured here by power
-- iteration -- is sqrt(rows / cols) x lr (the "spectral condition" for
-- feature learning: the update's operator norm matches the layer's
-- fan-out / fan-in).
--
--   build/muon run examples/spectral_scale.lua
local muon = require("muon")
local T = muon.tensor
local engine = require("muon.engine")

-- The largest singular value of a (power iteration on A^T A).
local function spectral_norm(a)
  local v = T.randn({ a:size(2), 1 }, 9, a:dtype())
  local s = 0
  for _ = 1, 200 do
    local u = a:mm(v)
    s = u:norm() / v:norm()
    v = a:transpose(1, 2):mm(u)
    v:div_(v:norm())
  end
  return s
end

local lr = 0.01
local shapes = { { 16, 64 }, { 32, 32 }, { 64, 16 } }
print("shape    mode                update RMS / lr   spectral norm / lr   sqrt(rows/cols)")
local worst = 0
for _, mode in ipairs({ "matched_adamw_rms", "keller", "spectral" }) do
  for i, s in ipairs(shapes) do
    local eng = engine.new({ groups = { { optimizer = "muon", lr = lr, weight_decay = 0, scale_mode = mode } } })
    local W = T.zeros(s)
    eng:add_param("w", W, T.randn(s, i))
    eng:step()
    local rms = W:norm() / math.sqrt(W:numel())
    local sn = spectral_norm(W)
    local want = math.sqrt(s[1] / s[2])
    if mode == "spectral" then worst = math.max(worst, math.abs(sn / lr - want) / want) end
    print(("%-8s %-20s %15.4f %20.4f %17.4f"):format(s[1] .. "x" .. s[2], mode, rms / lr, sn / lr, want))
  end
end
-- (within a few percent: Newton-Schulz leaves the singular values near 1, not at 1)
print(("check: spectral norm / lr = sqrt(rows/cols) within %.1f%%"):format(100 * worst))
