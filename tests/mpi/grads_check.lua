-- eng:clip_grad_norm on a mesh against the same engine in one process.
--   build/muon run tests/mpi/grads_check.lua MESH
-- MESH as tests/mpi/dist_check.lua ("shard:4", "replicate:2,shard:2"). The
-- total norm (float32 and float64 grads; sharded, replicated and empty
-- pieces) has the one-process bits on every rank, every rank's grads are
-- its boxes of the one-process clipped grads bitwise, and a step after it
-- gives the one-process values bitwise; zero_grad and set_lr too.
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local engine = require("muon.engine")

local mesh_arg = arg[1]
local AXES = H.axes(mesh_arg)

-- name, global shape, shard dim (nil: replicated), dtype
local PARAMS = {
  { "a.w", { 9, 6 }, 1, "float32" }, { "b.w", { 5, 7 }, 2, "float32" }, { "empty.w", { 2, 9 }, 1, "float32" },
  { "rep.w", { 6, 6 }, nil, "float32" }, { "bias", { 11 }, 1, "float64" },
}

local function config(dist)
  local cfg = { groups = { { name = "hidden", optimizer = "muon", lr = 0.02, match = "%.w$" },
    { name = "rest", optimizer = "adamw", lr = 1e-2 } } }
  if dist then cfg.dist = { mesh = AXES } end
  return cfg
end

local numel = H.numel

local bits_equal = H.bits_equal

H.main(function()
  H.init()
  local ref, eng = engine.new(H.alone(config(false))), engine.new(config(true))
  local mesh = D.mesh(AXES, H.size)
  local locals = {}
  for i, s in ipairs(PARAMS) do
    local shape, dt = s[2], s[4]
    local full, gfull = T.randn(shape, i, dt), T.randn(shape, 50 + i, dt):mul(2)
    local pl = {}
    for a, ax in ipairs(AXES) do pl[a] = (ax[1] == "shard" and s[3]) and ("S(" .. s[3] .. ")") or "R" end
    local box = D.local_box(shape, D.placement(pl, mesh, #shape), mesh, H.rank)
    local has = numel(box.len) > 0
    local value = has and D.box_view(full, box):clone() or T.zeros(box.len, dt)
    local grad = has and D.box_view(gfull, box):clone() or T.zeros(box.len, dt)
    pl.shape = shape
    eng:add_param(s[1], value, grad, pl)
    ref:add_param(s[1], full, gfull)
    locals[s[1]] = { value = value, grad = grad, box = box }
  end
  local function compare(what, field)
    local ok, first = true, nil
    for name, l in pairs(locals) do
      local p = ref:param(name)
      local good, why = bits_equal(l[field], D.box_view(p[field], l.box))
      if not good then ok, first = false, first or (name .. " " .. why) end
    end
    H.check(what, ok, first)
  end
  local n_ref, n_mesh = ref:clip_grad_norm(1.5), eng:clip_grad_norm(1.5)
  H.check("grads-clip-norm-bitwise", n_ref == n_mesh and n_ref > 1.5, ("%.17g vs %.17g"):format(n_mesh, n_ref))
  compare("grads-clipped-bitwise", "grad")
  eng:set_lr("hidden", 0.05)
  ref:set_lr("hidden", 0.05)
  eng:step()
  -- (the reference's Newton-Schulz on one BLAS thread, as the owner ranks')
  assert(H.ref_step(ref))
  compare("grads-step-after-clip-bitwise", "value")
  eng:zero_grad()
  local zero = true
  for _, l in pairs(locals) do zero = zero and (l.grad:numel() == 0 or l.grad:norm() == 0) end
  H.check("grads-zero-grad", zero)
  H.check("grads-norm-of-zero", eng:clip_grad_norm(1.0) == 0)
end)
