-- The geometry of distributed runs, the part of muon.dist (lua/muon/dist.lua,
-- where its conventions are) the plan (lua/muon/dist_plan.lua) builds on:
-- the device mesh, placements, the box of a tensor each rank holds, and a
-- planned record's replica classes and boxes.
--[[ reference muon.dist
## Meshes and placements
muon.dist.mesh(spec, world)
    A mesh from { {name, size}, ... } (e.g. { {"replicate", 2}, {"shard",
    2} }); world (optional): the number of ranks, which the sizes must
    multiply to (EINVAL naming both); at most muon.dist.MAX_RANKS ranks.
muon.dist.MAX_RANKS
    2^31 - 1: MPI numbers ranks with C ints.
Mesh:coords(rank)
    The 0-based coordinates of rank.
Mesh:rank_of(coords)
    The rank at coordinates.
Mesh:describe()
    "(replicate=2, shard=2)".
muon.dist.placement(spec, mesh, ndim)
    A normalized placement: a list with one entry per axis ("R",
    "replicate", "Replicate()"; "S(d)", "S1", "shard(d)", "Shard(d)" or
    {"shard", d}) or a map axis name -> entry (missing axes replicate); nil
    replicates on every axis. ndim bounds the sharded dims.
muon.dist.placement_string(pl)
    A normalized placement as text ("(R,S(1))").
muon.dist.chunk(n, k, i)
    torch.chunk(n, k)'s piece i (0-based): start (0-based) and length; the
    pieces have ceil(n/k) elements, the last ones fewer or none.
muon.dist.local_box(shape, pl, mesh, rank)
    The box of the global tensor rank holds: { start = {0-based}, len = {}
    } per dim; axes sharding the same dim nest in mesh order (DTensor).
muon.dist.local_shape(shape, pl, mesh, rank)
    local_box(...).len.
muon.dist.hook_box(hshape, pshape, pl, mesh, rank)
    The box of a hook state tensor (shape hshape; the parameter's pshape)
    rank holds: placed like the parameter, except a dim of another size is
    held whole by the ranks at coordinate 0 of the axes sharding it.
muon.dist.numel(shape)
    The product of the sizes.
muon.dist.box_view(t, box, region)
    The view of tensor t (holding the global region) at a global box.
muon.dist.box_within(box, region)
    Whether box lies inside region (both { start, len }).
muon.dist.each_coords(mesh, axes, coords, fn)
    Call fn(coords) for every combination of coordinates on axes (the
    other entries of coords kept; last axis fastest).
muon.dist.each_box(shape, pl, mesh, axes, coords, fn)
    Call fn(coords, box) for the combinations of coordinates on axes
    (shard axes of pl, in mesh order) whose box of a tensor of shape is
    not empty, in each_coords' order, without visiting the empty ones:
    O(non-empty boxes), whatever the axes' sizes.
## Records on the mesh (as muon.dist.plan places them)
muon.dist.class_of(r, mesh, coords)
    The replica class of coordinates for a record: their mixed-radix index
    over its replicate axes.
muon.dist.set_class(r, mesh, c, coords)
    Set coords' entries on the record's replicate axes from class c (the
    inverse of class_of; the other entries kept).
muon.dist.boxes_of(rec, mesh)
    Every distinct non-empty box of a record (or hook record) with its
    state holder: { {box, holder} } in shard-coordinate order.
]]
local E = require("muon.errors")

local D = {}

-- torch.chunk(n, k) piece i (0-based): size ceil(n/k), the last pieces
-- smaller or empty. Returns start (0-based) and length.
function D.chunk(n, k, i)
  if k <= 1 then return 0, n end
  local cs = math.ceil(n / k)
  local s = math.min(i * cs, n)
  local l = math.max(0, math.min(cs, n - i * cs))
  return s, l
end

------------------------------------------------------------------ mesh

local Mesh = {}
Mesh.__index = Mesh

-- The most ranks a mesh can have: MPI numbers ranks with C ints.
D.MAX_RANKS = 2 ^ 31 - 1

-- spec: list of {name, size}; world: number of ranks (product must match).
function D.mesh(spec, world)
  if type(spec) ~= "table" or #spec == 0 then
    E.raise(E.EINVAL, "dist.mesh must be a non-empty list of {name, size} axes")
  end
  local axes, sizes, strides, prod, names = {}, {}, {}, 1, {}
  for i, ax in ipairs(spec) do
    if type(ax) ~= "table" or type(ax[1]) ~= "string" or type(ax[2]) ~= "number"
      or ax[2] < 1 or ax[2] ~= math.floor(ax[2]) then
      E.raise(E.EINVAL, ("dist.mesh[%d] must be {name, size} with a string name and an integer size >= 1"):format(i))
    end
    if names[ax[1]] then E.raise(E.EINVAL, ("dist.mesh: axis name '%s' appears twice"):format(ax[1])) end
    names[ax[1]] = i
    axes[i] = { name = ax[1], size = ax[2] }
    sizes[i] = ax[2]
    prod = prod * ax[2]
  end
  local s = 1
  for i = #sizes, 1, -1 do
    strides[i] = s
    s = s * sizes[i]
  end
  local parts = {}
  for i, a in ipairs(axes) do parts[i] = ("%s=%.0f"):format(a.name, a.size) end
  if prod > D.MAX_RANKS then
    E.raise(E.EINVAL, ("dist.mesh: axis sizes (%s) multiply to %.0f ranks, more than the %d MPI can number "
      .. "(its ranks are C ints)"):format(table.concat(parts, ", "), prod, D.MAX_RANKS))
  end
  if world and prod ~= world then
    E.raise(E.EINVAL, ("dist.mesh: axis sizes (%s) multiply to %d but the world has %d ranks"):format(
      table.concat(parts, ", "), prod, world))
  end
  return setmetatable({ axes = axes, sizes = sizes, strides = strides, size = prod, index = names }, Mesh)
end

function Mesh:coords(rank)
  local c = {}
  for i = 1, #self.sizes do c[i] = math.floor(rank / self.strides[i]) % self.sizes[i] end
  return c
end

function Mesh:rank_of(coords)
  local r = 0
  for i = 1, #self.sizes do r = r + coords[i] * self.strides[i] end
  return r
end

function Mesh:describe()
  local parts = {}
  for i, a in ipairs(self.axes) do parts[i] = a.name .. "=" .. a.size end
  return "(" .. table.concat(parts, ", ") .. ")"
end

------------------------------------------------------------- placements

-- One axis' placement: "R" / "replicate" / "Replicate()" -> {kind="R"};
-- "S(d)" / "S1" / "shard(d)" / "Shard(d)" / {"shard", d} -> {kind="S", dim=d}.
local function parse_axis(v, where)
  if type(v) == "table" and (v.kind == "R" or v.kind == "S") then return v end
  if type(v) == "table" and type(v[1]) == "string" and v[1]:lower() == "shard" and type(v[2]) == "number" then
    return { kind = "S", dim = v[2] }
  end
  if type(v) == "string" then
    local l = v:lower()
    if l == "r" or l == "replicate" or l == "replicate()" then return { kind = "R" } end
    local d = l:match("^s%(?(%d+)%)?$") or l:match("^shard%((%d+)%)$")
    if d then return { kind = "S", dim = tonumber(d) } end
  end
  E.raise(E.EINVAL, ("%s must be 'replicate' or {'shard', dim} (also 'R', 'S(dim)'), got %s"):format(
    where, type(v) == "string" and ("'" .. v .. "'") or tostring(v)))
end

-- Normalize a placement for mesh: a list with one entry per axis, or a map
-- axis name -> entry (missing axes replicate); nil: replicated on all axes.
function D.placement(spec, mesh, ndim)
  local n = #mesh.axes
  local out = {}
  if spec == nil then
    for i = 1, n do out[i] = { kind = "R" } end
    return out
  end
  if type(spec) ~= "table" then E.raise(E.EINVAL, "placement must be a table (one entry per mesh axis)") end
  if #spec > 0 then
    if #spec ~= n then
      E.raise(E.EINVAL, ("placement has %d entries but the mesh %s has %d axes"):format(#spec, mesh:describe(), n))
    end
    for i = 1, n do out[i] = parse_axis(spec[i], ("placement[%d]"):format(i)) end
  else
    for k in pairs(spec) do
      if not mesh.index[k] then
        E.raise(E.EINVAL, ("placement names axis '%s', which the mesh %s does not have"):format(tostring(k), mesh:describe()))
      end
    end
    for i, a in ipairs(mesh.axes) do out[i] = parse_axis(spec[a.name] or "R", ("placement." .. a.name)) end
  end
  if ndim then
    for i, p in ipairs(out) do
      if p.kind == "S" and (p.dim < 1 or p.dim > ndim or p.dim ~= math.floor(p.dim)) then
        E.raise(E.EINVAL, ("placement[%d] shards dim %s of a %d-D tensor"):format(i, tostring(p.dim), ndim))
      end
    end
  end
  return out
end

function D.placement_string(pl)
  local parts = {}
  for i, p in ipairs(pl) do parts[i] = p.kind == "R" and "R" or ("S(" .. p.dim .. ")") end
  return "(" .. table.concat(parts, ",") .. ")"
end

-- The box of the global tensor held by rank: start (0-based) and len per
-- tensor dim. Axes sharding the same dim nest in mesh order (DTensor).
function D.local_box(shape, pl, mesh, rank)
  local coords = mesh:coords(rank)
  local start, len = {}, {}
  for d = 1, #shape do start[d], len[d] = 0, shape[d] end
  for a = 1, #pl do
    local p = pl[a]
    if p.kind == "S" then
      local s, l = D.chunk(len[p.dim], mesh.sizes[a], coords[a])
      start[p.dim] = start[p.dim] + s
      len[p.dim] = l
    end
  end
  return { start = start, len = len }
end

-- The box of a parameter's hook state (its own shape hshape, the
-- parameter's pshape) held by rank: placed like the parameter, except that
-- a dim whose size differs from the parameter's (a collapsed core dim, or
-- the other side of a square rule) is not split: the ranks at coordinate 0
-- of every axis sharding it hold it whole, the others nothing. So a rank
-- holding any hook state holds some of the parameter.
function D.hook_box(hshape, pshape, pl, mesh, rank)
  local pb = D.local_box(pshape, pl, mesh, rank)
  local b = D.local_box(hshape, pl, mesh, rank)
  for d = 1, #hshape do
    if hshape[d] ~= pshape[d] then
      local whole = pb.start[d] == 0 and pb.len[d] > 0
      b.start[d], b.len[d] = whole and 0 or hshape[d], whole and hshape[d] or 0
    end
  end
  return b
end

function D.local_shape(shape, pl, mesh, rank)
  return D.local_box(shape, pl, mesh, rank).len
end

function D.numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- Global box -> view of t, where t holds the global region `region`.
function D.box_view(t, box, region)
  local v = t
  for d = 1, #box.len do
    local off = box.start[d] - (region and region.start[d] or 0)
    local full = region and region.len[d] or v:size(d)
    if off ~= 0 or box.len[d] ~= full then v = v:narrow(d, off + 1, box.len[d]) end
  end
  return v
end

local function box_within(b, region)
  for d = 1, #b.len do
    if b.start[d] < region.start[d] or b.start[d] + b.len[d] > region.start[d] + region.len[d] then return false end
  end
  return true
end
D.box_within = box_within

-- Calls fn(coords) for every combination of coordinates on `axes`, the
-- other entries of coords kept (last axis fastest).
local function each_coords(mesh, axes, coords, fn)
  local n = #axes
  for i = 1, n do coords[axes[i]] = 0 end
  while true do
    fn(coords)
    local i = n
    while i >= 1 do
      local a = axes[i]
      coords[a] = coords[a] + 1
      if coords[a] < mesh.sizes[a] then break end
      coords[a] = 0
      i = i - 1
    end
    if i < 1 then return end
  end
end
D.each_coords = each_coords

-- The length of dim pl[a].dim after the axes up to a shard it (mesh order,
-- as local_box nests them), at coords.
local function length_after(shape, pl, mesh, coords, a)
  local d = pl[a].dim
  local len = shape[d]
  for b = 1, a do
    if pl[b].kind == "S" and pl[b].dim == d then
      local _, l = D.chunk(len, mesh.sizes[b], coords[b])
      len = l
    end
  end
  return len
end

-- each_coords over the non-empty boxes only: along an axis torch.chunk's
-- empty pieces come last, so the first empty one ends that axis' loop.
function D.each_box(shape, pl, mesh, axes, coords, fn)
  local function walk(i)
    if i > #axes then
      local box = D.local_box(shape, pl, mesh, mesh:rank_of(coords))
      if D.numel(box.len) > 0 then fn(coords, box) end
      return
    end
    local a = axes[i]
    for v = 0, mesh.sizes[a] - 1 do
      coords[a] = v
      if length_after(shape, pl, mesh, coords, a) == 0 then break end
      walk(i + 1)
    end
    coords[a] = 0
  end
  walk(1)
end

------------------------------------------------- planned records

-- The replica class of coordinates for a record: their mixed-radix index
-- over its replicate axes (mesh order, last fastest).
local function class_of(r, mesh, coords)
  local c = 0
  for _, a in ipairs(r.raxes) do c = c * mesh.sizes[a] + coords[a] end
  return c
end
D.class_of = class_of

-- Coordinates `coords` with replicate axes set from class c.
local function set_class(r, mesh, c, coords)
  for i = #r.raxes, 1, -1 do
    local a = r.raxes[i]
    coords[a] = c % mesh.sizes[a]
    c = math.floor(c / mesh.sizes[a])
  end
end
D.set_class = set_class

-- Every distinct non-empty box of a record (or of a hook record) with its
-- state holder: { {box, holder} }, in the order of the shard coordinates.
-- O(non-empty boxes): for the rank that gathers or scatters every box.
-- (A hook box is empty where the parameter's is.)
function D.boxes_of(rec, mesh)
  local r = rec.parent or rec
  local coords = {}
  for a = 1, #mesh.sizes do coords[a] = 0 end
  set_class(r, mesh, r.c, coords)
  local saxes = {}
  for a, p in ipairs(r.placement) do if p.kind == "S" then saxes[#saxes + 1] = a end end
  local out = {}
  D.each_box(r.shape, r.placement, mesh, saxes, coords, function(x, pb)
    local q = mesh:rank_of(x)
    local b = rec.parent and D.hook_box(rec.shape, r.shape, r.placement, mesh, q) or pb
    if D.numel(b.len) > 0 then out[#out + 1] = { box = b, holder = q } end
  end)
  return out
end

return D
