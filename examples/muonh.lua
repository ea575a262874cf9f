-- MuonH (configs/muonh.lua) in a training loop, beside plain Muon without
-- weight decay: a two-layer net y = W2 relu(W1 x) fit to a teacher. MuonH
-- keeps each weight on its sphere (||W||_F = sqrt(rows), where it starts)
-- and only turns it; plain Muon lets the norms grow. Under mpirun every
-- rank holds a shard of each weight (placement "S(1)"): the norm of the
-- whole weight comes from ctx.global_norm, so the run is the same at any
-- world size.
--
--   build/muon run examples/muonh.lua [steps]
--   mpirun -np 2 build/muon run examples/muonh.lua
local muon = require("muon")
local T = muon.tensor
local engine = require("muon.engine")
local comm = require("muon.comm")
local D = require("muon.dist")

local steps = tonumber(arg and arg[1]) or 60
local world = comm.world_size()
local X = T.randn({ 24, 256 }, 1)
local Y = T.randn({ 8, 32 }, 3):mm(T.randn({ 32, 24 }, 2):mm(X):clamp(0, math.huge)):mul(0.2)

local function on_sphere(w) return w:mul_(math.sqrt(w:size(1)) / w:norm()) end

local function train(name, cfg)
  local config = dofile(muon.config_path(name))
  if cfg then cfg(config) end
  if world > 1 then config.dist = { mesh = { { "shard", world } } } end
  local eng = engine.new(config)
  local full = { on_sphere(T.randn({ 32, 24 }, 10)), on_sphere(T.randn({ 8, 32 }, 11)) }
  local mesh, me = D.mesh({ { "shard", world } }, world), world > 1 and comm.world():rank() or 0
  local mine, grads = {}, {}
  for i, w in ipairs(full) do
    local box = D.local_box(w:size(), D.placement({ "S(1)" }, mesh, 2), mesh, me)
    mine[i] = { w = w:narrow(1, box.start[1] + 1, box.len[1]):clone(), box = box }
    grads[i] = T.zeros(box.len)
    eng:add_param("layers." .. i .. ".w", mine[i].w, grads[i], world > 1 and { "S(1)", shape = w:size() } or nil)
  end
  local loss
  for _ = 1, steps do
    -- every rank computes the whole forward and backward (small), then keeps its rows
    local H1 = full[1]:mm(X)
    local A = H1:clamp(0, math.huge)
    local R = full[2]:mm(A):sub(Y)
    loss = 0.5 * R:norm() ^ 2 / 256
    local G2 = R:mm(A:transpose(1, 2)):div(256)
    local dA = full[2]:transpose(1, 2):mm(R):mul(H1:gt(0))
    local G1 = dA:mm(X:transpose(1, 2)):div(256)
    for i, g in ipairs({ G1, G2 }) do
      local b = mine[i].box
      if b.len[1] > 0 then grads[i]:copy(g:narrow(1, b.start[1] + 1, b.len[1])) end
    end
    eng:step()
    -- gather the new weights (every rank: the same full tensors)
    for i, w in ipairs(full) do
      local b = mine[i].box
      local piece = T.zeros(w:size())
      if b.len[1] > 0 then piece:narrow(1, b.start[1] + 1, b.len[1]):copy(mine[i].w) end
      if world > 1 then
        local counts, recv = {}, T.zeros({ w:numel() * world })
        for q = 1, world do counts[q] = w:numel() end
        comm.world():allgatherv(piece:view({ w:numel() }), recv, counts)
        w:zero()
        for q = 1, world do w:add_(recv:narrow(1, (q - 1) * w:numel() + 1, w:numel()):view(w:size())) end
      else
        w:copy(piece)
      end
    end
  end
  return loss, full[1]:norm(), full[2]:norm()
end

local lm, m1, m2 = train("muon", function(c) c.groups[1].weight_decay = 0 end)
local lh, h1, h2 = train("muonh")
print(("after %d steps:  loss    ||W1||   ||W2||   (start: %.3f %.3f)"):format(steps, math.sqrt(32), math.sqrt(8)))
print(("  Muon   %12.4f %8.4f %8.4f"):format(lm, m1, m2))
print(("  MuonH  %12.4f %8.4f %8.4f"):format(lh, h1, h2))
print(("check: MuonH norms %.6f %.6f (sphere %.6f %.6f), Muon's %.4f %.4f, loss MuonH %.4f Muon %.4f"):format(
  h1, h2, math.sqrt(32), math.sqrt(8), m1, m2, lh, lm))
