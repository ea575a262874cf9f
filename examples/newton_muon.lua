-- Newton-Muon (configs/newton_muon.lua) in a training loop, beside plain
-- Muon (configs/muon.lua): a linear layer W (16 x 32) fit to a teacher on
-- inputs whose 32 features have very different scales (the input second
-- moment Z Z^T / N is far from isotropic). Muon's orthogonalized update
-- ignores the input geometry; Newton-Muon right-multiplies it by the
-- inverse input second moment, which the trainer passes each step as the
-- signal "zz.<name>": after 300 steps its loss and its distance to the
-- teacher's weights are far below Muon's (at first Muon leads: it moves
-- the high-variance features, which dominate the loss, first).
--
--   build/muon run examples/newton_muon.lua [steps]
local muon = require("muon")
local T = muon.tensor
local engine = require("muon.engine")

local steps = tonumber(arg and arg[1]) or 300
local N = 512
local X = T.randn({ 32, N }, 1) -- inputs, one sample per column
local scale = T.zeros({ 32, 1 })
for i = 1, 32 do scale:set(4 ^ ((i - 16.5) / 16), i, 1) end -- feature scales 1/4 .. 4
X:mul_(scale)
local Wt = T.randn({ 16, 32 }, 2):mul(0.5) -- the teacher
local Y = Wt:mm(X)
local zz = X:mm(X:transpose(1, 2)):div(N):flat() -- the input second moment, 32 x 32

local function train(config)
  local eng = engine.new(config)
  local W, G = T.zeros({ 16, 32 }), T.zeros({ 16, 32 })
  eng:add_param("layers.0.mlp.w", W, G)
  local loss
  for _ = 1, steps do
    local R = W:mm(X):sub(Y)
    loss = 0.5 * R:norm() ^ 2 / N
    G:copy(R:mm(X:transpose(1, 2)):div(N))
    eng:set_signal("zz.layers.0.mlp.w", zz)
    eng:step()
  end
  return loss, W:sub(Wt):norm()
end

local start = 0.5 * Y:norm() ^ 2 / N
local l_muon, e_muon = train(muon.config_path("muon"))
local l_newton, e_newton = train(muon.config_path("newton_muon"))
print(("loss at the start %.4f; after %d steps:   loss   ||W - teacher||"):format(start, steps))
print(("  Muon         %25.4f  %8.4f"):format(l_muon, e_muon))
print(("  Newton-Muon  %25.4f  %8.4f"):format(l_newton, e_newton))
print(("check: Newton-Muon loss %.4f, Muon %.4f"):format(l_newton, l_muon))
