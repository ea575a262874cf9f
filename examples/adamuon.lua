-- AdaMuon (configs/adamuon.lua) beside plain Muon (configs/muon.lua): the
-- update of each weight after its element-wise second moment is rescaled
-- to an RMS of exactly 0.2 x lr (AdaMuon's RMS alignment with Adam), for
-- every shape, where Muon's sqrt(max(rows, cols)) x 0.2 scale gives about
-- that (Newton-Schulz leaves the singular values near, not at, 1). Then
-- both fit a linear teacher from noisy gradients (printed for comparison:
-- on this small problem plain Muon ends closer).
--
--   build/muon run examples/adamuon.lua [steps]
local muon = require("muon")
local T = muon.tensor
local engine = require("muon.engine")

local steps = tonumber(arg and arg[1]) or 80
local shapes = { { 64, 32 }, { 32, 64 }, { 16, 128 }, { 4, 6, 10 } }

-- The update RMS / lr of one step from zero weights (decay does nothing at 0).
local function update_rms(name)
  local eng = engine.new(muon.config_path(name))
  local out = {}
  for i, s in ipairs(shapes) do
    local w, g = T.zeros(s), T.randn(s, 100 + i)
    eng:add_param("w" .. i, w, g)
    out[i] = w
  end
  eng:step()
  local lr = eng:get("lr:hidden")
  for i, w in ipairs(out) do out[i] = w:norm() / math.sqrt(w:numel()) / lr end
  return out
end

local function fit(name)
  local eng = engine.new(muon.config_path(name))
  local N = 256
  local X = T.randn({ 32, N }, 1)
  local Wt = T.randn({ 16, 32 }, 2):mul(0.3)
  local W, G = T.zeros({ 16, 32 }), T.zeros({ 16, 32 })
  eng:add_param("layers.0.w", W, G)
  for step = 1, steps do
    local R = W:mm(X):sub(Wt:mm(X))
    G:copy(R:mm(X:transpose(1, 2)):div(N):add(T.randn({ 16, 32 }, 1000 + step):mul(0.5)))
    eng:step()
  end
  return W:sub(Wt):norm()
end

local a, m = update_rms("adamuon"), update_rms("muon")
print("update RMS / lr of one step, per shape:")
local worst_a, worst_m = 0, 0
for i, s in ipairs(shapes) do
  print(("  %-10s  AdaMuon %.6f   Muon %.6f"):format(table.concat(s, "x"), a[i], m[i]))
  worst_a = math.max(worst_a, math.abs(a[i] - 0.2))
  worst_m = math.max(worst_m, math.abs(m[i] - 0.2))
end
local ea, em = fit("adamuon"), fit("muon")
print(("fit with noisy gradients, %d steps: ||W - teacher|| AdaMuon %.4f, Muon %.4f"):format(steps, ea, em))
print(("check: AdaMuon RMS off 0.2 by %.2e, Muon by %.2e; distance AdaMuon %.4f Muon %.4f"):format(
  worst_a, worst_m, ea, em))
