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
## Plan
muon.dist.build_owner_by_size(costs, ncoords)
    The seed's build_owner_by_size: costs taken largest first (ties:
    order), each to the least-loaded coordinate (ties: the smallest).
    Returns the owners (0-based) and the loads.
muon.dist.is_source(pl, mesh, rank, owner)
    Whether rank sends owner the Newton-Schulz input piece of its box (the
    holder sharing the owner's coordinates on replicate axes).
muon.dist.plan(records, mesh, opts)
    The step plan of registered records: items (owner, sources, dests,
    attached hook state) and batches per group, split like the seed's
    _split_into_memory_safe_batches.
muon.dist.DEFAULT_MAX_BATCH_NUMEL
    512M elements per Newton-Schulz batch (divided by a parameter's shard
    count).
muon.dist.step_elements(plan, rank, stepping)
    Elements rank sends and receives in one step of plan (records for which
    stepping(record) is true; all when nil).
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

local function box_id(box)
  return table.concat(box.start, ",") .. "+" .. table.concat(box.len, ",")
end

local function box_within(b, region)
  for d = 1, #b.len do
    if b.start[d] < region.start[d] or b.start[d] + b.len[d] > region.start[d] + region.len[d] then return false end
  end
  return true
end

-- The greedy rule of the seed's build_owner_by_size over (cost, index)
-- pairs with per-rank preloads: largest cost first (ties: lower index), to
-- the least loaded candidate (ties: the smaller rank).
local function greedy(jobs, candidates_of, load)
  table.sort(jobs, function(x, y)
    if x.cost ~= y.cost then return x.cost > y.cost end
    return x.order < y.order
  end)
  for _, j in ipairs(jobs) do
    local best
    for _, q in ipairs(candidates_of(j)) do
      if best == nil or load[q] < load[best] or (load[q] == load[best] and q < best) then best = q end
    end
    j.assign(best)
    load[best] = load[best] + j.cost
  end
end

-- The plan of a mesh step: where each optimizer-state buffer lives and
-- where each matrix is orthogonalized. records (registration order, the
-- same on every rank) are
--   { name, shape (global), placement (normalized), group (index), dtype,
--     ns (bool: Newton-Schulz), whole (bool: orthogonalize the parameter
--     whole, for hooks that see it), nd_mode, state_count (state tensors
--     per element: 1 Muon, 2 AdamW) }
-- opts: { balance = "flops" | "numel", max_batch_numel = n }.
-- Sets on each record:
--   boxes[q]   the box rank q holds (0-based start, len per dim)
--   holder     box id -> the one rank (of the replicas holding that box)
--              that keeps the optimizer state for it (greedy by state bytes)
--   items      work items: { record, region (global box), owner, ns,
--              sources = { {rank, box} } (state holders sending their NS
--              input piece to the owner), dests = { {rank, box} } (ranks
--              receiving their slice of the update from the owner),
--              attached = hook state items moved with it (see below) }
-- A record may list hook state tensors (hooks = { {name, key, shape} }:
-- per-parameter state of a post-Newton-Schulz hook, shaped like the
-- parameter with core dims collapsed to 1). Each is placed like the
-- parameter (same placement over its own shape); every box of it is held
-- by one rank, the state holder of the parameter's box there, and it
-- travels with the parameter's item: its pieces go from their holders to
-- the owner and come back to the holders (r.hook_records[key]: its boxes,
-- holders; item.attached: { record, region, owner, sources, dests }).
-- and plan.batches: lists of items of one group each, split like the
-- seed's _split_into_memory_safe_batches (512M elements / the parameter's
-- shard count, at least that many per batch), interleaved across groups.
function D.plan(records, mesh, opts)
  opts = opts or {}
  local balance = opts.balance or "flops"
  if balance ~= "flops" and balance ~= "numel" then
    E.raise(E.EINVAL, "dist: balance must be 'flops' or 'numel', got " .. tostring(balance))
  end
  local maxb = opts.max_batch_numel or D.DEFAULT_MAX_BATCH_NUMEL
  local W = mesh.size
  local plan = { mesh = mesh, records = records, batches = {}, balance = balance }
  -- Boxes, replicas and state holders.
  local holds, state_load = {}, {}
  for q = 0, W - 1 do state_load[q] = 0 end
  for ri, r in ipairs(records) do
    r.index = ri
    r.numel = D.numel(r.shape)
    r.boxes, r.replicas, r.holder, r.box_of, r.id_of = {}, {}, {}, {}, {}
    r.shard_count = 1
    for a, p in ipairs(r.placement) do
      if p.kind == "S" then r.shard_count = r.shard_count * mesh.sizes[a] end
    end
    local order = {}
    for q = 0, W - 1 do
      local b = D.local_box(r.shape, r.placement, mesh, q)
      local id = box_id(b)
      r.boxes[q] = b
      if D.numel(b.len) > 0 then
        if not r.replicas[id] then
          r.replicas[id] = {}
          r.box_of[id] = b
          order[#order + 1] = id
        end
        table.insert(r.replicas[id], q)
        r.id_of[q] = id
      end
    end
    r.box_order = order
    for oi, id in ipairs(order) do
      holds[#holds + 1] = { cost = D.numel(r.box_of[id].len) * (ESIZE[r.dtype] or 4) * (r.state_count or 1),
        order = ri * 1e6 + oi, record = r, id = id,
        assign = function(q) r.holder[id] = q end }
    end
  end
  greedy(holds, function(j) return j.record.replicas[j.id] end, state_load)
  plan.state_load = state_load
  -- Hook state records: boxes over their own shape; the holder of a box is
  -- the parameter's state holder at the lowest rank that holds the box.
  for _, r in ipairs(records) do
    r.hook_records = {}
    for _, h in ipairs(r.hooks or {}) do
      local hr = { name = r.name .. "/" .. h.key, key = h.key, shape = h.shape, placement = r.placement,
        dtype = r.dtype, parent = r, boxes = {}, box_of = {}, holder = {}, id_of = {}, box_order = {} }
      for q = 0, W - 1 do
        local b = D.hook_box(h.shape, r.shape, r.placement, mesh, q)
        hr.boxes[q] = b
        if D.numel(b.len) > 0 then
          local id = box_id(b)
          hr.id_of[q] = id
          if not hr.box_of[id] then
            hr.box_of[id] = b
            hr.box_order[#hr.box_order + 1] = id
            hr.holder[id] = r.holder[r.id_of[q]]
          end
        end
      end
      r.hook_records[h.key] = hr
    end
  end
  -- Work items.
  local ns_load, jobs = {}, {}
  for q = 0, W - 1 do ns_load[q] = 0 end
  local function cost(shape, nd_mode) return balance == "flops" and ns.flops(shape, nd_mode) or D.numel(shape) end
  for ri, r in ipairs(records) do
    r.items = {}
    if r.ns then
      local _, _, _, rows, cols = ns.core(r.shape, r.nd_mode)
      local regions, rorder = {}, {}
      for _, id in ipairs(r.box_order) do
        local b = r.box_of[id]
        local region = { start = {}, len = {} }
        for d = 1, #r.shape do
          if rows[d] or cols[d] or r.whole then region.start[d], region.len[d] = 0, r.shape[d]
          else region.start[d], region.len[d] = b.start[d], b.len[d] end
        end
        local rid = box_id(region)
        if not regions[rid] then
          regions[rid] = { record = r, region = region, ns = true, sources = {}, dests = {} }
          rorder[#rorder + 1] = rid
        end
        local it = regions[rid]
        it.sources[#it.sources + 1] = { rank = r.holder[id], box = b, id = id }
      end
      for ii, rid in ipairs(rorder) do
        local it = regions[rid]
        local s1 = it.sources[1]
        if #it.sources == 1 and box_id(s1.box) == rid then
          it.owner = s1.rank -- the holder has the whole region: nothing moves in
          ns_load[it.owner] = ns_load[it.owner] + cost(it.region.len, r.nd_mode)
        else
          jobs[#jobs + 1] = { cost = cost(it.region.len, r.nd_mode), order = ri * 1e6 + ii,
            assign = function(q) it.owner = q end }
        end
        r.items[#r.items + 1] = it
      end
    else
      for _, id in ipairs(r.box_order) do
        local b = r.box_of[id]
        r.items[#r.items + 1] = { record = r, region = b, ns = false, owner = r.holder[id],
          sources = { { rank = r.holder[id], box = b, id = id } }, dests = {} }
      end
    end
  end
  local all = {}
  for q = 0, W - 1 do all[#all + 1] = q end
  greedy(jobs, function() return all end, ns_load)
  plan.ns_load = ns_load
  -- Destinations: every rank holding a non-empty box inside the region.
  for _, r in ipairs(records) do
    for _, it in ipairs(r.items) do
      for q = 0, W - 1 do
        local b = r.boxes[q]
        if D.numel(b.len) > 0 and box_within(b, it.region) then it.dests[#it.dests + 1] = { rank = q, box = b } end
      end
      -- Sources the owner holds itself need no transfer (marked local).
      for _, s in ipairs(it.sources) do s.local_ = s.rank == it.owner end
      -- Hook state travels with the item: from and back to its holders.
      it.attached = {}
      for _, h in ipairs(r.hooks or {}) do
        local hr = r.hook_records[h.key]
        local region = { start = {}, len = {} }
        for d = 1, #h.shape do
          if h.shape[d] == r.shape[d] then region.start[d], region.len[d] = it.region.start[d], it.region.len[d]
          else region.start[d], region.len[d] = 0, h.shape[d] end
        end
        local a = { record = hr, region = region, owner = it.owner, sources = {}, dests = {} }
        for _, id in ipairs(hr.box_order) do
          local b = hr.box_of[id]
          if box_within(b, region) then
            local piece = { rank = hr.holder[id], box = b }
            a.sources[#a.sources + 1] = piece
            a.dests[#a.dests + 1] = piece
          end
        end
        it.attached[#it.attached + 1] = a
      end
    end
  end
  -- Batches per (group, shard count), in registration order.
  local by_key, korder = {}, {}
  for _, r in ipairs(records) do
    local key = (r.group or 1) .. ":" .. r.shard_count
    if not by_key[key] then
      by_key[key] = { group = r.group or 1, shard = r.shard_count, items = {} }
      korder[#korder + 1] = key
    end
    for _, it in ipairs(r.items) do table.insert(by_key[key].items, it) end
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
    for _, it in ipairs(k.items) do
      local n = D.numel(it.region.len)
      if #cur >= k.shard and count + n > limit then
        batches[#batches + 1] = cur
        cur, count = {}, 0
      end
      cur[#cur + 1] = it
      count = count + n
    end
    if #cur > 0 then batches[#batches + 1] = cur end
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

-- Elements rank `rank` sends and receives for one step of `plan` (records
-- for which stepping(record) is true; all when nil): NS input pieces from
-- state holders to owners, then each update slice from the owner to every
-- other rank that holds it.
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

-- What the seed's scheme receives per rank for the same owners, in
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
        local mine = D.numel(r.boxes[rank].len)
        if box_within(r.boxes[rank], it.region) and mine > 0 or rank == o then
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
