-- Per-rank result lines for MPI tests: "@@ <rank> ok|fail <name> [detail]".
-- The driving .sh aggregates them into one TAP line per test name (ok only
-- if every rank reported ok). On an unexpected Lua error the job is aborted
-- (comm.abort) so no rank waits forever in a collective.
local comm = require("muon.comm")
local T = require("muon.tensor")
local D = require("muon.dist")
local C = require("muon.core").C

local H = { results = {} }

function H.init()
  H.world = comm.world()
  H.rank, H.size = H.world:rank(), H.world:size()
  return H.world
end

function H.check(name, cond, detail)
  local line = ("@@ %d %s %s%s"):format(H.rank or 0, cond and "ok" or "fail", name,
    detail and (" # " .. tostring(detail):gsub("\n", " | ")) or "")
  io.stdout:write(line, "\n")
  io.stdout:flush()
end

-- Whether tensors a and b hold the same values element by element (NaN
-- matching NaN), for bitwise comparisons with a one-process run; false and
-- the first differing element otherwise.
function H.bits_equal(a, b)
  if a:numel() ~= b:numel() then return false, "numel differs" end
  if a:numel() == 0 then return true end
  local fa, fb = a:contiguous():flat(), b:contiguous():flat()
  for i = 1, #fa do
    if fa[i] ~= fb[i] and not (fa[i] ~= fa[i] and fb[i] ~= fb[i]) then
      return false, ("element %d: %.17g vs %.17g"):format(i, fa[i], fb[i])
    end
  end
  return true
end

-- The mesh axes of a MESH argument "name:size,..." (nil: "shard:1"):
-- { { name, size } }, names replicate, shard and shard2.
function H.axes(mesh_arg)
  local axes = {}
  for name, size in (mesh_arg or "shard:1"):gmatch("(%w+):(%d+)") do axes[#axes + 1] = { name, tonumber(size) } end
  return axes
end

-- The placement on axes of a spec { name, shape, { shard dims } }: "R" on
-- replicate axes, the spec's first / second shard dim on shard / shard2
-- axes (R when it has none).
function H.placement(axes, spec)
  local pl = {}
  for i, ax in ipairs(axes) do
    local d = ax[1] == "shard" and spec[3][1] or ax[1] == "shard2" and spec[3][2] or nil
    pl[i] = d and ("S(" .. d .. ")") or "R"
  end
  return pl
end

-- A config of groups where group i matches the parameters whose spec
-- names it (params: { { name, shape, shard dims, group } }), on the mesh
-- axes when given.
function H.grouped_config(groups, params, axes)
  local group_of = {}
  for _, s in ipairs(params) do group_of[s[1]] = s[4] end
  for i, g in ipairs(groups) do g.match = function(name) return group_of[name] == i end end
  local cfg = { groups = groups }
  if axes then cfg.dist = { mesh = axes } end
  return cfg
end

-- cfg for the one-process reference engine every rank runs beside the
-- mesh engine: without a mesh, its ranks are independent on purpose
-- (dist = { independent = true }; an engine without one refuses to step
-- on a world of several ranks).
function H.alone(cfg)
  if cfg.dist == nil then cfg.dist = { independent = true } end
  return cfg
end

-- A parameter's seed from its name; the element count of a shape.
function H.seed_of(name) return D.hash(name) % 100000 end
function H.numel(s) local n = 1 for _, x in ipairs(s) do n = n * x end return n end

-- The box of rank's part of a parameter of this shape sharded on dim 1
-- over mesh (a {shard, N} mesh).
function H.dim1_box(shape, mesh, rank)
  return D.local_box(shape, D.placement({ { "shard", 1 } }, mesh, #shape), mesh, rank)
end

-- Both engines with parameters sharded on dim 1 over the mesh {shard,
-- H.size}: params = { { name, shape, seed } } in order, the one-process
-- reference ref on the full tensors (T.randn(shape, seed), zero grads) and
-- eng on this rank's boxes of them. Returns the mesh and loc[name] =
-- { value =, grad =, box =, full =, shape = } (this rank's value and grad).
function H.add_dim1_sharded(ref, eng, params)
  local mesh = D.mesh({ { "shard", H.size } }, H.size)
  local loc = {}
  for _, p in ipairs(params) do
    local name, shape = p[1], p[2]
    local pl = { { "shard", 1 } }
    local box = H.dim1_box(shape, mesh, H.rank)
    local full = T.randn(shape, p[3])
    local value = D.box_view(full, box):clone()
    local grad = T.zeros(box.len)
    pl.shape = shape
    eng:add_param(name, value, grad, pl)
    ref:add_param(name, full, T.zeros(shape))
    loc[name] = { value = value, grad = grad, box = box, full = full, shape = shape }
  end
  return mesh, loc
end

-- Both engines with params = { { name, shape, shard dims, group } } placed
-- on the mesh axes (H.placement): the one-process reference ref on the full
-- tensors (T.randn(shape, H.seed_of(name)), then prepare(spec, full) if
-- given) and eng on this rank's boxes, zero grads. Returns locals[name] =
-- { value, grad, box, spec } (this rank's).
function H.add_mesh_params(ref, eng, params, axes, prepare)
  local mesh = D.mesh(axes, H.size)
  local locals = {}
  for _, spec in ipairs(params) do
    local shape = spec[2]
    local full = T.randn(shape, H.seed_of(spec[1]))
    if prepare then prepare(spec, full) end
    local pl = H.placement(axes, spec)
    local box = D.local_box(shape, D.placement(pl, mesh, #shape), mesh, H.rank)
    local value = H.numel(box.len) > 0 and D.box_view(full, box):clone() or T.zeros(box.len)
    local grad = T.zeros(box.len)
    pl.shape = shape
    eng:add_param(spec[1], value, grad, pl)
    ref:add_param(spec[1], full, T.zeros(shape))
    locals[spec[1]] = { value = value, grad = grad, box = box, spec = spec }
  end
  return locals
end

-- The grads of step s for the parameters of H.add_dim1_sharded:
-- T.randn(shape, 100 * s + #name), changed by edit(name, g) if given, in
-- ref's grad and (this rank's box) in eng's.
function H.set_dim1_grads(ref, loc, s, edit)
  for name, l in pairs(loc) do
    local g = T.randn(l.shape, 100 * s + #name)
    if edit then edit(name, g) end
    ref:param(name).grad:copy(g)
    l.grad:copy(D.box_view(g, l.box))
  end
end

-- Step the one-process reference engine ref with 1 BLAS thread (as the
-- mesh's owner ranks run Newton-Schulz), then put back the job's thread
-- count (OPENBLAS_NUM_THREADS, default 2); returns pcall's ok, err.
function H.ref_step(ref)
  local threads = tonumber(os.getenv("OPENBLAS_NUM_THREADS") or "") or 2
  C.mu_blas_set_threads(1)
  local ok, err = pcall(ref.step, ref)
  C.mu_blas_set_threads(threads)
  return ok, err
end

-- Run main() and report; abort the whole job on an unexpected error.
function H.main(fn)
  local ok, err = xpcall(fn, debug.traceback)
  if not ok then
    io.stdout:write(("@@ %d fail uncaught-error # %s\n"):format(H.rank or -1, tostring(err):gsub("\n", " | ")))
    io.stdout:flush()
    comm.abort(3)
    os.exit(3)
  end
  comm.finalize()
end

return H
