-- Cautious weight decay (weight_decay_mode = "cautious") in a training
-- loop, beside the seed's decoupled decay: a linear layer fit to a teacher
-- whose weights are large. Decoupled decay pulls every weight towards zero
-- at every step (p = p (1 - lr wd) - lr u), so the fit settles short of the
-- teacher; cautious decay applies only where the update itself moves the
-- weight towards zero (u * p > 0), so it does not fight the fit.
--
--   build/muon run examples/cautious_decay.lua [steps]
local muon = require("muon")
local T = muon.tensor
local engine = require("muon.engine")

local steps = tonumber(arg and arg[1]) or 150
local X = T.randn({ 24, 256 }, 1)
local teacher = T.randn({ 48, 24 }, 2):mul(0.5)
local Y = teacher:mm(X)

local function train(mode)
  local eng = engine.new({ groups = { { optimizer = "muon", lr = 0.05, weight_decay = 0.2,
    weight_decay_mode = mode } } })
  local W, G = T.zeros({ 48, 24 }), T.zeros({ 48, 24 })
  eng:add_param("w", W, G)
  for _ = 1, steps do
    G:copy(W:mm(X):sub(Y):mm(X:transpose(1, 2)):div(256))
    eng:step()
  end
  local R = W:mm(X):sub(Y)
  return 0.5 * R:norm() ^ 2 / 256, W:norm() / teacher:norm()
end

local ld, nd = train("decoupled")
local lc, nc = train("cautious")
print(("after %d steps:  loss     ||W|| / ||teacher||"):format(steps))
print(("  decoupled   %9.5f  %.3f"):format(ld, nd))
print(("  cautious    %9.5f  %.3f"):format(lc, nc))
print(("check: cautious loss %.5f < decoupled %.5f"):format(lc, ld))
