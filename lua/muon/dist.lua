-- Distributed planning (HSDP): device mesh, placements, local shards,
-- Newton-Schulz owners, batch schedule, communication volumes, and the
-- cross-rank agreement check. Pure Lua, computed once at setup; the step
-- itself lives in muon.step (the protocol) and muon.router (the exchanges).
--
--   local dist = require("muon.dist")
--   local mesh = dist.mesh({ {"replicate", 2}, {"shard", 2} }, 4)
--   mesh:coords(3)                      --> {1, 1}  (0-based, last axis fastest)
--   local pl = dist.placement({ "replicate", {"shard", 1} }, mesh)   -- or {"R", "S(1)"}
--   local box = dist.local_box({10, 6}, pl, mesh, rank)   -- { start = {..0-based}, len = {..} }
--   dist.chunk(10, 4, i)                --> start, len of torch.chunk piece i (0-based)
--
-- Conventions: ranks and mesh coordinates are 0-based like MPI; tensor dims
-- are 1-based like the rest of the Lua API. Ranks map to mesh coordinates in
-- row-major order (the last axis varies fastest), as torch's DeviceMesh
-- built from arange(world).view(sizes).
--[[ reference muon.dist
    Distributed planning (HSDP), pure Lua, computed once at setup: the
    device mesh, placements, local shards, Newton-Schulz owners, the batch
    schedule, communication volumes, and the cross-rank agreement. Ranks
    and mesh coordinates are 0-based (MPI); tensor dims 1-based. Ranks map
    to mesh coordinates in row-major order (the last axis fastest), as
    torch's DeviceMesh.
## Meshes and placements
muon.dist.mesh(spec, world)
    A mesh from { {name, size}, ... } (e.g. { {"replicate", 2}, {"shard",
    2} }); world (optional): the number of ranks, which the sizes must
    multiply to (EINVAL naming both).
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
## Plan
muon.dist.build_owner_by_size(costs, ncoords)
    The seed's build_owner_by_size: costs taken largest first (ties:
    order), each to the least-loaded coordinate (ties: the smallest).
    Returns the owners (0-based) and the loads.
muon.dist.is_source(pl, mesh, rank, owner)
    Whether rank sends owner the Newton-Schulz input piece of its box (the
    holder sharing the owner's coordinates on replicate axes).
muon.dist.analyse(r, mesh)
    What the plan's rules need of a record from its shape and placement
    alone (the same on every rank): its replicate axes, its shard axes
    split into core axes (a dim Newton-Schulz needs whole) and batch axes,
    whether items span several boxes, whether there are several items.
muon.dist.class_of(r, mesh, coords)
    The replica class of coordinates for a record: their mixed-radix index
    over its replicate axes.
muon.dist.set_class(r, mesh, c, coords)
    Set coords' entries on the record's replicate axes from class c (the
    inverse of class_of; the other entries kept).
muon.dist.plan(records, mesh, opts)
    The step plan (the same rules on every rank): where each parameter's
    optimizer state lives and where each matrix is orthogonalized, and the
    items this rank takes part in. records: registration order, { name,
    shape (global), placement (normalized), group, dtype, ns, whole,
    nd_mode, ns_opts, state_count, hooks }; opts.rank, opts.balance = "flops" |
    "numel", opts.max_batch_numel = 512M. Sets mine, mine_n, holds, c,
    owner, items, hook_records on each record; returns { mesh, rank,
    records, batches, ns_load, balance }. O(P log W + W) plus this rank's
    own items.
muon.dist.batch(recs, group, shard)
    A batch of records (the same on every rank): this rank's items, the
    dtypes (sorted), whether any item moves data in or out.
muon.dist.boxes_of(rec, mesh)
    Every distinct non-empty box of a record (or hook record) with its
    state holder: { {box, holder} } in shard-coordinate order.
muon.dist.imbalance(plan)
    The job's Newton-Schulz imbalance: the largest rank's cost over the
    mean (1 without Newton-Schulz work).
muon.dist.DEFAULT_MAX_BATCH_NUMEL
    512M elements per Newton-Schulz batch (divided by a parameter's shard
    count).
muon.dist.step_elements(plan, rank, stepping)
    Elements plan.rank sends and receives in one step of plan (records for
    which stepping(record) is true; all when nil); rank must be the plan's.
muon.dist.seed_step_elements(plan, rank)
    What the seed's scheme would receive for the same owners (for
    comparison).
## Agreement
muon.dist.agree(comm, records, extra)
    Collective: do all ranks hold the same records (names, shapes,
    placements, groups, dtypes) and settings? nil, or the same message on
    every rank naming the first difference.
muon.dist.agree_entries(comm, entries, what, known_count)
    Collective over a list of { key, value } strings: nil if every rank
    has the same, else one message naming the first key that differs and
    the ranks that differ from rank 0.
muon.dist.hash(s)
    FNV-1a of a string, 31 bits.
muon.dist.describe_record(r)
    A record as text (messages).
]]
local bit = require("bit")
local E = require("muon.errors")
local ns = require("muon.ns")

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
  if world and prod ~= world then
    local parts = {}
    for i, a in ipairs(axes) do parts[i] = a.name .. "=" .. a.size end
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

-- The rank that sends rank `owner` the NS input piece held by `rank`, or
-- nil if the owner holds it itself: the holder of that box sharing the
-- owner's coordinates on replicate axes. Returns whether `rank` is that
-- source for its own box.
local function is_source(pl, mesh, rank, owner)
  if rank == owner then return false end
  local rc, oc = mesh:coords(rank), mesh:coords(owner)
  for a = 1, #pl do
    if pl[a].kind == "R" and rc[a] ~= oc[a] then return false end
  end
  return true
end
D.is_source = is_source

------------------------------------------------------------- ownership

-- The seed's build_owner_by_size: records (list of { size = cost }) taken
-- largest first (ties: registration order), each to the coordinate with the
-- least load so far (ties: the smallest coordinate). Returns owners[i]
-- (0-based coordinates) and the final loads.
function D.build_owner_by_size(costs, ncoords)
  local order = {}
  for i = 1, #costs do order[i] = i end
  table.sort(order, function(x, y)
    if costs[x] ~= costs[y] then return costs[x] > costs[y] end
    return x < y
  end)
  local load, owners = {}, {}
  for c = 0, ncoords - 1 do load[c] = 0 end
  for _, i in ipairs(order) do
    local best = 0
    for c = 1, ncoords - 1 do
      if load[c] < load[best] then best = c end
    end
    owners[i] = best
    load[best] = load[best] + costs[i]
  end
  return owners, load
end

---------------------------------------------------------------- the plan

D.DEFAULT_MAX_BATCH_NUMEL = 512 * 1024 * 1024

local ESIZE = require("muon.tensor").DTYPE_SIZES -- bytes per element, from C's dtype table

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

-- A binary min-heap of { key, id } entries, least key first (ties: the
-- smaller id).
local function hless(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end
local function hpush(h, e)
  local n = #h + 1
  h[n] = e
  while n > 1 do
    local p = math.floor(n / 2)
    if not hless(h[n], h[p]) then break end
    h[n], h[p] = h[p], h[n]
    n = p
  end
end
local function hpop(h)
  local n, top = #h, h[1]
  h[1] = h[n]
  h[n] = nil
  n = n - 1
  local i = 1
  while true do
    local l, m = 2 * i, i
    if l <= n and hless(h[l], h[m]) then m = l end
    if l + 1 <= n and hless(h[l + 1], h[m]) then m = l + 1 end
    if m == i then break end
    h[i], h[m] = h[m], h[i]
    i = m
  end
  return top
end
D._hpush, D._hpop = hpush, hpop

-- What the plan's rules need of a record, from its shape and placement
-- alone (the same on every rank, O(dims x axes)): its replicate axes (its
-- replica class is a rank's coordinates there), shard axes split into
-- core axes (sharding a dim Newton-Schulz needs whole: an item gathers
-- them) and batch axes (the others: an item per coordinate), whether
-- items span several boxes, whether there are several items.
function D.analyse(r, mesh)
  r.numel = D.numel(r.shape)
  r.raxes, r.core_axes, r.batch_axes = {}, {}, {}
  r.shard_count, r.nrep = 1, 1
  local core = {}
  if r.ns then
    local _, _, _, rows, cols = ns.core(r.shape, r.nd_mode)
    for d = 1, #r.shape do core[d] = r.whole or (rows and rows[d]) or (cols and cols[d]) or false end
  end
  for a, p in ipairs(r.placement) do
    if p.kind == "S" then
      r.shard_count = r.shard_count * mesh.sizes[a]
      table.insert(core[p.dim] and r.core_axes or r.batch_axes, a)
    else
      r.raxes[#r.raxes + 1] = a
      r.nrep = r.nrep * mesh.sizes[a]
    end
  end
  local box0 = D.local_box(r.shape, r.placement, mesh, 0)
  r.spanning, r.split = false, false
  for d = 1, #r.shape do
    if box0.len[d] < r.shape[d] then
      if core[d] then r.spanning = true else r.split = true end
    end
  end
  r.box0 = box0
  -- One item for the whole tensor, its owner chosen by NS cost.
  r.single = r.ns and not r.split and r.numel > 0
  r.moves_in = r.numel > 0 and r.spanning
  r.moves_out = r.numel > 0 and (r.spanning or r.nrep > 1)
  return r
end

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

local function copy(t)
  local c = {}
  for i = 1, #t do c[i] = t[i] end
  return c
end

-- A region: box with the core dims whole.
local function region_of(r, box)
  local region = { start = copy(box.start), len = copy(box.len) }
  for _, a in ipairs(r.core_axes) do
    local d = r.placement[a].dim
    region.start[d], region.len[d] = 0, r.shape[d]
  end
  return region
end

-- The rules every rank evaluates identically (no O(W) scan per record;
-- O(P log W) over P records, plus O(W) heaps):
--   * state holders: every box of a record is held by the rank of the
--     record's replica class `c` at the box's shard coordinates.
--   * single records (Newton-Schulz, one item: the whole tensor), largest
--     NS cost first (ties: registration order), go to the least loaded rank
--     (ties: the smaller rank) among the ranks that hold a non-empty box
--     (all ranks when the item spans boxes); the owner's replica class holds
--     the state, so the owner holds its own piece (the data bytes are the
--     owner-free floor).
--   * the other records (elementwise; Newton-Schulz with batch axes), largest
--     box state bytes first, choose their class `c` among the replica
--     classes of their replicate axes by least state bytes (ties: the
--     smaller class); each item's owner is the holder of its first box
--     (core coordinates 0); their NS cost is counted before the single
--     records are placed.
-- Sets r.c (holder class) on every record, r.owner on single records;
-- returns the NS load of every rank (0-based array).
local function assign(records, mesh, balance)
  local W = mesh.size
  local function cost(r, shape) return balance == "flops" and ns.shape_cost(shape, r.nd_mode, r.ns_opts) or D.numel(shape) end
  -- Pass 1: replica classes by state bytes, per set of replicate axes.
  local jobs = {}
  for _, r in ipairs(records) do
    if r.numel > 0 and not r.single then
      jobs[#jobs + 1] = { cost = D.numel(r.box0.len) * (ESIZE[r.dtype] or 4) * (r.state_count or 1), r = r }
    elseif r.numel == 0 then
      r.c = 0
    end
  end
  table.sort(jobs, function(x, y)
    if x.cost ~= y.cost then return x.cost > y.cost end
    return x.r.index < y.r.index
  end)
  local pheaps = {}
  for _, j in ipairs(jobs) do
    local r = j.r
    local key = table.concat(r.raxes, ",")
    local h = pheaps[key]
    if not h then
      h = {}
      for c = 0, r.nrep - 1 do h[c + 1] = { 0, c } end -- already a heap (keys equal, ids ascending)
      pheaps[key] = h
    end
    local e = hpop(h)
    r.c = e[2]
    hpush(h, { e[1] + j.cost, e[2] })
  end
  -- NS loads of the items of split records (owner: the holder of the
  -- first box of the item).
  local load = {}
  for q = 0, W - 1 do load[q] = 0 end
  local coords = {}
  for _, r in ipairs(records) do
    if r.ns and r.split and r.numel > 0 then
      for a = 1, #mesh.sizes do coords[a] = 0 end
      set_class(r, mesh, r.c, coords)
      each_coords(mesh, r.batch_axes, coords, function(cc)
        local o = mesh:rank_of(cc)
        local region = region_of(r, D.local_box(r.shape, r.placement, mesh, o))
        if D.numel(region.len) > 0 then load[o] = load[o] + cost(r, region.len) end
      end)
    end
  end
  -- Pass 2: single records by NS cost to the least loaded candidate.
  jobs = {}
  for _, r in ipairs(records) do
    if r.single then jobs[#jobs + 1] = { cost = cost(r, r.shape), r = r } end
  end
  table.sort(jobs, function(x, y)
    if x.cost ~= y.cost then return x.cost > y.cost end
    return x.r.index < y.r.index
  end)
  -- Candidate sets: every rank ("*"), or the ranks at coordinate 0 of some
  -- axes (the holders of a non-spanning record's one box). Lazy heaps over
  -- the shared loads (stale entries are dropped when they surface).
  local heaps, hlist = {}, {}
  local function heap_of(zero_axes)
    local key = #zero_axes == 0 and "*" or table.concat(zero_axes, ",")
    local h = heaps[key]
    if h then return h end
    h = { zero = zero_axes }
    local free = {}
    local isz = {}
    for _, a in ipairs(zero_axes) do isz[a] = true end
    for a = 1, #mesh.sizes do if not isz[a] then free[#free + 1] = a end end
    local cc = {}
    for a = 1, #mesh.sizes do cc[a] = 0 end
    each_coords(mesh, free, cc, function(x)
      local q = mesh:rank_of(x)
      hpush(h, { load[q], q })
    end)
    heaps[key] = h
    hlist[#hlist + 1] = h
    return h
  end
  for _, j in ipairs(jobs) do
    local r = j.r
    local zero = {}
    if not r.spanning then
      for _, a in ipairs(r.core_axes) do if mesh.sizes[a] > 1 then zero[#zero + 1] = a end end
      for _, a in ipairs(r.batch_axes) do if mesh.sizes[a] > 1 then zero[#zero + 1] = a end end
      table.sort(zero)
    end
    local h = heap_of(zero)
    while load[h[1][2]] ~= h[1][1] do hpop(h) end
    local q = h[1][2]
    r.owner = q
    r.c = class_of(r, mesh, mesh:coords(q))
    if j.cost > 0 then
      load[q] = load[q] + j.cost
      local qc = mesh:coords(q)
      for _, hh in ipairs(hlist) do
        local inside = true
        for _, a in ipairs(hh.zero) do if qc[a] ~= 0 then inside = false end end
        if inside then hpush(hh, { load[q], q }) end
      end
    end
  end
  return load
end

-- The item of record r that rank `me` (coordinates mc) takes part in, or
-- nil: { record, region (global box), owner, ns, sources = { {rank, box} }
-- (state holders sending their NS input piece to the owner), dests =
-- { {rank, box} } (ranks receiving their slice of the update), attached
-- (hook state moved with it) }. The owner's item lists every piece; any
-- other rank's only its own.
local function item_for(r, mesh, me, mc)
  if r.numel == 0 then return nil end
  local region, owner
  local base = copy(mc)
  if r.single then
    if me ~= r.owner and r.mine_n == 0 then return nil end
    region = { start = {}, len = copy(r.shape) }
    for d = 1, #r.shape do region.start[d] = 0 end
    owner = r.owner
    for _, a in ipairs(r.batch_axes) do base[a] = 0 end
  else
    if r.mine_n == 0 then return nil end
    region = r.ns and region_of(r, r.mine) or r.mine
    set_class(r, mesh, r.c, base)
    for _, a in ipairs(r.core_axes) do base[a] = 0 end
    owner = mesh:rank_of(base)
  end
  local it = { record = r, region = region, ns = r.ns, owner = owner, sources = {}, dests = {}, attached = {} }
  local hooks = r.hooks or {}
  local atts = {}
  for i, h in ipairs(hooks) do
    local hreg = { start = {}, len = {} }
    for d = 1, #h.shape do
      if h.shape[d] == r.shape[d] then hreg.start[d], hreg.len[d] = region.start[d], region.len[d]
      else hreg.start[d], hreg.len[d] = 0, h.shape[d] end
    end
    atts[i] = { record = r.hook_records[h.key], region = hreg, owner = owner, sources = {}, dests = {} }
    it.attached[i] = atts[i]
  end
  if me == owner then
    set_class(r, mesh, r.c, base)
    local cc = copy(base)
    each_coords(mesh, r.core_axes, cc, function(x)
      local holder = mesh:rank_of(x)
      local b = D.local_box(r.shape, r.placement, mesh, holder)
      if D.numel(b.len) > 0 then
        it.sources[#it.sources + 1] = { rank = holder, box = b, local_ = holder == owner }
        local dc = copy(x)
        for c = 0, r.nrep - 1 do
          set_class(r, mesh, c, dc)
          it.dests[#it.dests + 1] = { rank = mesh:rank_of(dc), box = b }
        end
        for i, h in ipairs(hooks) do
          local hb = D.hook_box(h.shape, r.shape, r.placement, mesh, holder)
          if D.numel(hb.len) > 0 and box_within(hb, atts[i].region) then
            local piece = { rank = holder, box = hb }
            atts[i].sources[#atts[i].sources + 1] = piece
            atts[i].dests[#atts[i].dests + 1] = piece
          end
        end
      end
    end)
  else
    if r.holds then
      it.sources[1] = { rank = me, box = r.mine, local_ = false }
      for i in ipairs(hooks) do
        local hb = atts[i].record.mine
        if D.numel(hb.len) > 0 then
          local piece = { rank = me, box = hb }
          atts[i].sources[1], atts[i].dests[1] = piece, piece
        end
      end
    end
    if r.mine_n > 0 then it.dests[1] = { rank = me, box = r.mine } end
  end
  return it
end

-- The plan of a mesh step for rank opts.rank (default 0): where each
-- optimizer-state buffer lives and where each matrix is orthogonalized,
-- by the rules of `assign` (the same on every rank), and the items this
-- rank takes part in. records (registration order, the same on every
-- rank) are
--   { name, shape (global), placement (normalized), group (index), dtype,
--     ns (bool: Newton-Schulz), whole (bool: orthogonalize the parameter
--     whole, for hooks that see it), nd_mode, ns_opts (resolved muon.ns
--     options: the cost model's), state_count (state tensors
--     per element: 1 Muon, 2 AdamW), hooks = { {key, shape} } (hook state,
--     shaped like the parameter with core dims collapsed to 1) }
-- opts: { rank, balance = "flops" | "numel", max_batch_numel = n }.
-- Sets on each record (see D.analyse for the rule fields):
--   mine, mine_n   this rank's box (0-based start, len per dim), its numel
--   holds          whether this rank keeps the optimizer state of its box
--   c, owner       the holder replica class; the NS owner of a single record
--   items          the item this rank takes part in (at most one; see item_for)
--   hook_records[key]  { name, key, shape, dtype, parent, mine, holds }
-- and returns { mesh, rank, records, batches, ns_load (every rank's NS
-- cost), balance }. plan.batches: { records, items (this rank's),
-- group, shard, dtypes, moves_in, moves_out } per group and shard count
-- (split at 512M elements / the shard count, whole records), interleaved
-- across groups; the same records and flags on every rank.
-- Time and memory: O(P log W + W) plus this rank's own items.
function D.plan(records, mesh, opts)
  opts = opts or {}
  local balance = opts.balance or "flops"
  if balance ~= "flops" and balance ~= "numel" then
    E.raise(E.EINVAL, "dist: balance must be 'flops' or 'numel', got " .. tostring(balance))
  end
  local me = opts.rank or 0
  local maxb = opts.max_batch_numel or D.DEFAULT_MAX_BATCH_NUMEL
  local plan = { mesh = mesh, rank = me, records = records, batches = {}, balance = balance }
  for ri, r in ipairs(records) do
    r.index = ri
    D.analyse(r, mesh)
  end
  plan.ns_load = assign(records, mesh, balance)
  local mc = mesh:coords(me)
  for _, r in ipairs(records) do
    r.mine = D.local_box(r.shape, r.placement, mesh, me)
    r.mine_n = D.numel(r.mine.len)
    r.holds = r.mine_n > 0 and class_of(r, mesh, mc) == r.c
    r.hook_records = {}
    for _, h in ipairs(r.hooks or {}) do
      local hb = D.hook_box(h.shape, r.shape, r.placement, mesh, me)
      r.hook_records[h.key] = { name = r.name .. "/" .. h.key, key = h.key, shape = h.shape, placement = r.placement,
        dtype = r.dtype, parent = r, mine = hb, holds = r.holds and D.numel(hb.len) > 0 }
    end
    local it = item_for(r, mesh, me, mc)
    r.items = it and { it } or {}
  end
  -- Batches per (group, shard count), in registration order.
  local by_key, korder = {}, {}
  for _, r in ipairs(records) do
    local key = (r.group or 1) .. ":" .. r.shard_count
    if not by_key[key] then
      by_key[key] = { group = r.group or 1, shard = r.shard_count, records = {} }
      korder[#korder + 1] = key
    end
    table.insert(by_key[key].records, r)
  end
  table.sort(korder, function(x, y)
    local a, b = by_key[x], by_key[y]
    if a.group ~= b.group then return a.group < b.group end
    return a.shard < b.shard
  end)
  local per = {}
  for _, key in ipairs(korder) do
    local k = by_key[key]
    local limit = math.floor(maxb / k.shard)
    local batches, cur, count = {}, {}, 0
    for _, r in ipairs(k.records) do
      if #cur >= k.shard and count + r.numel > limit then
        batches[#batches + 1] = cur
        cur, count = {}, 0
      end
      cur[#cur + 1] = r
      count = count + r.numel
    end
    if #cur > 0 then batches[#batches + 1] = cur end
    for i, recs in ipairs(batches) do batches[i] = D.batch(recs, k.group, k.shard) end
    per[#per + 1] = batches
  end
  local k = 1
  while true do
    local any = false
    for gi = 1, #per do
      if per[gi][k] then
        plan.batches[#plan.batches + 1] = per[gi][k]
        any = true
      end
    end
    if not any then break end
    k = k + 1
  end
  return plan
end

-- A batch of records (the same on every rank): this rank's items, the
-- dtypes (sorted), whether any item moves data in or out.
function D.batch(recs, group, shard)
  local b = { records = recs, items = {}, group = group, shard = shard, dtypes = {}, moves_in = false,
    moves_out = false }
  local seen = {}
  for _, r in ipairs(recs) do
    if not seen[r.dtype] then
      seen[r.dtype] = true
      b.dtypes[#b.dtypes + 1] = r.dtype
    end
    b.moves_in = b.moves_in or r.moves_in
    b.moves_out = b.moves_out or r.moves_out
    for _, it in ipairs(r.items) do b.items[#b.items + 1] = it end
  end
  table.sort(b.dtypes)
  return b
end

-- Every distinct non-empty box of a record (or of a hook record) with its
-- state holder: { {box, holder} }, in the order of the shard coordinates.
-- O(shard count): for the rank that gathers or scatters every box.
function D.boxes_of(rec, mesh)
  local r = rec.parent or rec
  local coords = {}
  for a = 1, #mesh.sizes do coords[a] = 0 end
  set_class(r, mesh, r.c, coords)
  local saxes = {}
  for a, p in ipairs(r.placement) do if p.kind == "S" then saxes[#saxes + 1] = a end end
  local out = {}
  each_coords(mesh, saxes, coords, function(x)
    local q = mesh:rank_of(x)
    local b = rec.parent and D.hook_box(rec.shape, r.shape, r.placement, mesh, q)
      or D.local_box(r.shape, r.placement, mesh, q)
    if D.numel(b.len) > 0 then out[#out + 1] = { box = b, holder = q } end
  end)
  return out
end

-- The job's NS imbalance: the largest rank's NS cost over the mean (1 for
-- no NS work).
function D.imbalance(plan)
  local W, mx, sum = plan.mesh.size, 0, 0
  for q = 0, W - 1 do
    local l = plan.ns_load[q]
    mx, sum = math.max(mx, l), sum + l
  end
  return sum > 0 and mx / (sum / W) or 1
end

-- Elements plan.rank sends and receives for one step of `plan` (records
-- for which stepping(record) is true; all when nil): NS input pieces from
-- state holders to owners, then each update slice from the owner to every
-- other rank that holds it. `rank` must be the plan's rank.
function D.step_elements(plan, rank, stepping)
  local sent, recv = 0, 0
  local function count(it)
    local o = it.owner
    for _, s in ipairs(it.sources) do
      if s.rank ~= o then
        local n = D.numel(s.box.len)
        if s.rank == rank then sent = sent + n end
        if o == rank then recv = recv + n end
      end
    end
    for _, d in ipairs(it.dests) do
      if d.rank ~= o then
        local n = D.numel(d.box.len)
        if o == rank then sent = sent + n end
        if d.rank == rank then recv = recv + n end
      end
    end
  end
  for _, r in ipairs(plan.records) do
    if stepping == nil or stepping(r) then
      for _, it in ipairs(r.items) do
        count(it)
        for _, a in ipairs(it.attached or {}) do count(a) end
      end
    end
  end
  return sent, recv
end

-- What the seed's scheme receives on plan.rank for the same owners, in
-- elements, without its padding: NS records only; all-gather of the NS
-- input over the owner's replica group, full-update broadcast from the
-- owner to that group, then the new shard broadcast to the other replicas
-- (every replica of a box holds the state and computes its momentum).
function D.seed_step_elements(plan, rank)
  local mesh = plan.mesh
  local recv = 0
  for _, r in ipairs(plan.records) do
    if r.ns then
      for _, it in ipairs(r.items) do
        local o = it.owner
        local mine = r.mine_n
        if box_within(r.mine, it.region) and mine > 0 or rank == o then
          local in_group = rank == o or D.is_source(r.placement, mesh, rank, o)
          local n = D.numel(it.region.len)
          if in_group then
            recv = recv + (n - mine)
            if rank ~= o then recv = recv + n end
          else
            recv = recv + mine
          end
        end
      end
    end
  end
  return recv
end

------------------------------------------------------------- agreement

-- FNV-1a over a string, 31 bits (exact in a double and an int64).
function D.hash(s)
  local h = 2166136261
  for i = 1, #s do
    h = bit.bxor(h, s:byte(i)) % 4294967296
    -- h * 16777619 mod 2^32, exact in doubles: 16777619 = 2^24 + 403
    h = ((h % 256) * 16777216 + h * 403) % 4294967296
  end
  return bit.band(h, 0x7fffffff)
end

function D.describe_record(r)
  return ("'%s' shape {%s} placement %s group %s%s%s"):format(r.name, table.concat(r.shape, ","),
    D.placement_string(r.placement), tostring(r.group or 1), r.ns and " muon" or " elementwise",
    r.dtype and (" " .. r.dtype) or "")
end

-- Collective over comm: do all ranks hold the same list of entries? Each
-- entry is { key, value } (strings). Returns nil if they agree, else the
-- same message on every rank naming the first key that differs, what rank 0
-- and the first differing rank have there, and every rank that differs
-- from rank 0. Two all-reduces when they agree (one with known_count, the
-- number of entries every rank is known to have).
function D.agree_entries(comm, entries, what, known_count)
  local W, me = comm:size(), comm:rank()
  if W == 1 then return nil end
  local n = #entries
  local maxn, minn = n, n
  if not known_count then
    local cnt = comm:allreduce({ n, -n }, "max")
    maxn, minn = cnt[1], -cnt[2]
  end
  local vec = {}
  for i = 1, maxn do
    local e = entries[i]
    local h = e and D.hash(e[1] .. "=" .. e[2]) or -1
    vec[2 * i - 1], vec[2 * i] = h, -h
  end
  local r = comm:allreduce(vec, "max")
  local first
  for i = 1, maxn do
    if r[2 * i - 1] ~= -r[2 * i] then first = i break end
  end
  if not first and maxn == minn then return nil end
  first = first or (minn + 1)
  local mine = entries[first]
  local key0 = comm:bcast_string(me == 0 and (mine and mine[1] or "") or "", 0)
  local val0 = comm:bcast_string(me == 0 and (mine and mine[2] or "(nothing)") or "", 0)
  local myval = mine and mine[2] or "(nothing)"
  local mykey = mine and mine[1] or ""
  local flags = {}
  for q = 1, W do flags[q] = 0 end
  if myval ~= val0 or mykey ~= key0 then flags[me + 1] = 1 end
  flags = comm:allreduce(flags, "max")
  local ranks = {}
  for q = 1, W do if flags[q] == 1 then ranks[#ranks + 1] = q - 1 end end
  local other = ranks[1] or 0
  local otherval = comm:bcast_string(me == other and myval or "", other)
  local otherkey = comm:bcast_string(me == other and mykey or "", other)
  local key = key0 ~= "" and key0 or otherkey
  if otherkey ~= key0 and otherkey ~= "" and key0 ~= "" then
    otherval = otherkey .. " = " .. otherval
    val0 = key0 .. " = " .. val0
    key = ("entry #%d"):format(first)
  end
  return ("%s differ across ranks at %s: rank 0 has %s, rank %d has %s (ranks that differ from rank 0: %s)"):format(
    what, key, val0, other, otherval, table.concat(ranks, ", "))
end

-- Collective over comm: all ranks check they registered the same records
-- (names, global shapes, placements, groups, dtypes) in the same order, and
-- the same settings. Returns nil if they agree, else the same message on
-- every rank naming the first difference.
function D.agree(comm, records, extra)
  local entries = {}
  for i, r in ipairs(records) do entries[i] = { ("parameter #%d"):format(i), D.describe_record(r) } end
  if extra then entries[#entries + 1] = { "settings", extra } end
  local msg = D.agree_entries(comm, entries, "dist: registered parameters")
  return msg
end

return D
