-- Conv flattening (nd_mode = "flatten") in a training loop: a conv weight
-- (out, in, kh, kw) = (16, 8, 3, 3) fit to a teacher on image patches (the
-- convolution as a product with im2col patches). The seed's default
-- batches the last two dims: it orthogonalizes 128 separate 3x3 kernels.
-- "flatten" orthogonalizes the weight as one out x (in*kh*kw) = 16 x 72
-- matrix (the KellerJordan / dion convention), which follows the layer's
-- geometry: its update is the orthogonalized map from patches to outputs.
--
--   build/muon run examples/conv_flatten.lua [steps]
local muon = require("muon")
local T = muon.tensor
local engine = require("muon.engine")

local steps = tonumber(arg and arg[1]) or 100
local shape = { 16, 8, 3, 3 }
local P = T.randn({ 72, 512 }, 1) -- im2col patches: (in*kh*kw) x positions
local Y = T.randn({ 16, 72 }, 2):mul(0.1):mm(P) -- the teacher conv's outputs

local function train(nd_mode)
  local eng = engine.new({ groups = { { optimizer = "muon", lr = 0.02, weight_decay = 0, nd_mode = nd_mode } } })
  local W, G = T.zeros(shape), T.zeros(shape)
  eng:add_param("conv.weight", W, G)
  local Wm, Gm = W:view({ 16, 72 }), G:view({ 16, 72 }) -- the same memory, as matrices
  for _ = 1, steps do
    Gm:copy(Wm:mm(P):sub(Y):mm(P:transpose(1, 2)):div(512))
    eng:step()
  end
  local R = Wm:mm(P):sub(Y)
  return 0.5 * R:norm() ^ 2 / 512
end

local start = 0.5 * Y:norm() ^ 2 / 512
local lb, lf = train("batch"), train("flatten")
print(("loss at the start %.5f; after %d steps:"):format(start, steps))
print(("  nd_mode = 'batch'   (128 x 3x3 matrices)  %.5f"):format(lb))
print(("  nd_mode = 'flatten' (one 16x72 matrix)    %.5f"):format(lf))
print(("check: flatten loss %.5f < batch loss %.5f"):format(lf, lb))
