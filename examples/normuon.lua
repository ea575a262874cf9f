-- NorMuon (configs/normuon.lua) in a training loop, beside plain Muon
-- (configs/muon.lua): a linear layer W (64 x 32) fit to a teacher whose
-- output rows have very different scales, on 256 samples. NorMuon keeps a
-- second moment per row of the orthogonalized update and normalizes the
-- rows by it, so the rows of W move by more even amounts; with plain Muon
-- the rows' step sizes spread out (printed: std / mean of the rows' RMS).
--
--   build/muon run examples/normuon.lua [steps]
local muon = require("muon")
local T = muon.tensor
local engine = require("muon.engine")

local steps = tonumber(arg and arg[1]) or 60
local X = T.randn({ 32, 256 }, 1) -- inputs, one sample per column
local Y = T.randn({ 64, 32 }, 2):mul(0.02):mm(X) -- the teacher's outputs
-- rows of the teacher's output with very different scales
local row_scale = T.zeros({ 64, 1 })
for i = 1, 64 do row_scale:set(i <= 8 and 4 or 0.25, i, 1) end
Y:mul_(row_scale)

-- Spread of the rows' step sizes: the coefficient of variation (std / mean)
-- of the per-row RMS of the update, averaged over the last 10 steps.
local function train(config)
  local eng = engine.new(config)
  local W, G = T.zeros({ 64, 32 }), T.zeros({ 64, 32 })
  eng:add_param("layers.0.mlp.w", W, G)
  local loss, spread = 0, 0
  for step = 1, steps do
    local R = W:mm(X):sub(Y) -- residual, 64 x 256
    loss = 0.5 * R:norm() ^ 2 / 256
    G:copy(R:mm(X:transpose(1, 2)):div(256))
    local before = W:clone()
    eng:step()
    if step > steps - 10 then
      -- the update itself (the config also decays by lr * 0.1): -lr * u
      local lr = eng:get("lr:hidden")
      local u = W:sub(before):add(before, lr * 0.1)
      local rms = u:mul(u):mean(2, true):sqrt() -- per row, 64 x 1
      local mean = rms:mean()
      local dev = rms:sub(mean)
      spread = spread + math.sqrt(dev:mul(dev):mean()) / mean / 10
    end
  end
  return loss, spread
end

local l_muon, s_muon = train(muon.config_path("muon"))
local l_nor, s_nor = train(muon.config_path("normuon"))
print(("loss at the start %.4f; after %d steps:  loss   spread of the update's row RMS"):format(0.5 * Y:norm() ^ 2 / 256, steps))
print(("  Muon      %33.4f  %6.2f"):format(l_muon, s_muon))
print(("  NorMuon   %33.4f  %6.2f"):format(l_nor, s_nor))
print(("check: row spread NorMuon %.2f, Muon %.2f"):format(s_nor, s_muon))
