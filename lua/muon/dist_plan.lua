-- The plan of a distributed step (part of muon.dist, lua/muon/dist.lua): where
-- each parameter's optimizer state lives, which rank orthogonalizes each
-- matrix (Newton-Schulz owners, balanced by flops), the batch schedule and
-- the communication volumes. Pure Lua, computed once at setup, the same
-- rules on every rank, over the mesh and boxes of lua/muon/dist_mesh.lua.
--[[ reference muon.dist
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
    nd_mode, ns_opts, state_count, hooks, split_ok (false: never split)
    }; opts.rank, opts.balance = "flops" |
    "numel", opts.max_batch_numel = 512M, opts.split_ns (split_options).
    Sets mine, mine_n, holds, c, owner, ns_group, items, hook_records on
    each record; returns { mesh, rank, records, batches, ns_load, balance,
    split_ns } (ns_load[q]: rank q's Newton-Schulz cost, 0 for most; only
    ranks with some are stored). Time and memory O(P log P) over P
    records, none per rank: also for `muon check --world 2147483647`;
    plus this rank's own items, one entry per item of records whose
    Newton-Schulz splits along batch axes, and O(g log W) per split
    matrix of a group of g (a few rounds).
    Split Newton-Schulz: a 2-D float32 or float64 matrix whose shape has
    more than one block (the blocked iteration, ns.split_blocks: a long
    side of 8192 or more) and whose record allows it splits when its cost alone exceeds split_ns.imbalance (1.05) times the
    mean rank's NS cost (so whenever there are more ranks than matrices
    of like cost), over the fewest ranks whose largest share
    (ns.split_cost) is within that bound; every piece (a whole matrix, or
    one rank's share of a group) goes, largest first, to the least loaded
    candidate not yet in its group. While the job's imbalance stays above
    the bound, the groups double (at most max_group, the candidates, and
    the shape's blocks or stripes, whichever is more: ranks beyond the
    blocks take stripes of the small side only), as long as a round
    gains 1%. A split record's ns_group = { size, ranks (world ranks in
    group-rank order), shares (each one's cost), blocks }; its owner is
    ranks[1]. muon.split_phase runs it over the group (the blocked
    iteration's bits, one process's).
muon.dist.split_pieces(r)
    A split record's pieces: [gq + 1] = group rank gq's piece of the
    matrix as a global box (its blocks: columns of a wide matrix, rows of
    a tall one).
muon.dist.meet(a, b)
    The intersection of two global boxes (nil when empty).
muon.dist.split_moves(r, mesh, me, out, fn)
    The pieces rank me sends and receives for split record r, in (the
    state holders' boxes of the NS input to the members' pieces) or out
    (the members' pieces of the update to every rank holding a box):
    fn(peer, box, send, within) each, within the box the piece is a view
    of (me's box or me's piece), in an order both sides share.
muon.dist.split_options(v)
    dist.split_ns checked and normalized: "auto" (or nil) -> {
    imbalance = 1.05 }; "off" (or max_group = 1) -> nil; { max_group = n
    (ranks per matrix, at most), imbalance = x (>= 1: the largest rank's
    NS over the mean above which matrices split) } -> the same. Errors
    name the key.
muon.dist.dests(it)
    The dests of a plan item: { {rank, box} }, the ranks receiving their
    slice of its update (the owner's: every replica of every source's box,
    made on first use).
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
]]
local ns = require("muon.ns")
local E = require("muon.errors")
local G = require("muon.dist_mesh")

local P = {}

local box_within = G.box_within
local split_shares, take_least -- (split Newton-Schulz, below)

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
P.is_source = is_source

------------------------------------------------------------- ownership

-- The seed's build_owner_by_size: records (list of { size = cost }) taken
-- largest first (ties: registration order), each to the coordinate with the
-- least load so far (ties: the smallest coordinate). Returns owners[i]
-- (0-based coordinates) and the final loads.
function P.build_owner_by_size(costs, ncoords)
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

P.DEFAULT_MAX_BATCH_NUMEL = 512 * 1024 * 1024

local ESIZE = require("muon.tensor").DTYPE_SIZES -- bytes per element, from C's dtype table

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

-- What the plan's rules need of a record, from its shape and placement
-- alone (the same on every rank, O(dims x axes)): its replicate axes (its
-- replica class is a rank's coordinates there), shard axes split into
-- core axes (sharding a dim Newton-Schulz needs whole: an item gathers
-- them) and batch axes (the others: an item per coordinate), whether
-- items span several boxes, whether there are several items.
function P.analyse(r, mesh)
  r.numel = G.numel(r.shape)
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
  local box0 = G.local_box(r.shape, r.placement, mesh, 0)
  r.spanning, r.split = false, false
  for d = 1, #r.shape do
    if box0.len[d] < r.shape[d] then
      if core[d] then r.spanning = true else r.split = true end
    end
  end
  r.box0 = box0
  -- The owner candidates of a single record: every rank when its item spans
  -- boxes, else the ranks at coordinate 0 of its sharded axes.
  r.pool_zero = {}
  if not r.spanning then
    for _, a in ipairs(r.core_axes) do if mesh.sizes[a] > 1 then r.pool_zero[#r.pool_zero + 1] = a end end
    for _, a in ipairs(r.batch_axes) do if mesh.sizes[a] > 1 then r.pool_zero[#r.pool_zero + 1] = a end end
    table.sort(r.pool_zero)
  end
  r.pool_key = table.concat(r.pool_zero, ",")
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
P.class_of = class_of

-- Coordinates `coords` with replicate axes set from class c.
local function set_class(r, mesh, c, coords)
  for i = #r.raxes, 1, -1 do
    local a = r.raxes[i]
    coords[a] = c % mesh.sizes[a]
    c = math.floor(c / mesh.sizes[a])
  end
end

P.set_class = set_class

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

-- The least loaded id of a pool (ties: the smaller id), loads kept sparse
-- (a missing id has load 0, and a load only grows): pool = { size, nth =
-- function(k) -> its k-th id (0-based, increasing), next = 0, heap = {} }.
-- Ids with load 0 come from a cursor over the pool in increasing order,
-- the loaded ones from a min-heap of { load, id } (stale entries dropped
-- when they surface): memory O(loaded ids), not O(size).
local function least_loaded(pool, load)
  while pool.next < pool.size and (load[pool.nth(pool.next)] or 0) > 0 do pool.next = pool.next + 1 end
  if pool.next < pool.size then return pool.nth(pool.next) end
  local h = pool.heap
  while load[h[1][2]] ~= h[1][1] do hpop(h) end
  return h[1][2]
end

-- Add cost to id's load (in pool, when given: its heap learns it).
local function add_load(load, id, cost, pool)
  if cost <= 0 then return end
  load[id] = (load[id] or 0) + cost
  if pool then hpush(pool.heap, { load[id], id }) end
end

-- The pool of the ranks at coordinate 0 on the mesh axes `zero` (every
-- rank when empty), in rank order (row-major: the last free axis fastest);
-- its heap starts with the ranks already loaded.
local function rank_pool(mesh, zero, load)
  local isz, free = {}, {}
  for _, a in ipairs(zero) do isz[a] = true end
  for a = 1, #mesh.sizes do if not isz[a] then free[#free + 1] = a end end
  local size = 1
  for _, a in ipairs(free) do size = size * mesh.sizes[a] end
  local pool = { size = size, next = 0, heap = {}, zero = zero }
  function pool.nth(k)
    local q = 0
    for i = #free, 1, -1 do
      local a = free[i]
      q = q + (k % mesh.sizes[a]) * mesh.strides[a]
      k = math.floor(k / mesh.sizes[a])
    end
    return q
  end
  function pool.has(qc)
    for _, a in ipairs(zero) do if qc[a] ~= 0 then return false end end
    return true
  end
  for q, l in pairs(load) do
    if pool.has(mesh:coords(q)) then hpush(pool.heap, { l, q }) end
  end
  return pool
end

------------------------------------------------------ split Newton-Schulz

-- Rounds of grow_splits the plan tries at most.
local SPLIT_ROUNDS = 4
-- The least relative gain in imbalance a round of larger groups must bring.
local SPLIT_GAIN = 1.01
local SPLIT_IMBALANCE = 1.05

-- dist.split_ns ("auto" (nil), "off", or { max_group = n, imbalance = x })
-- normalized: nil for "off", else { max_group (nil: no cap), imbalance }.
function P.split_options(v)
  if v == nil or v == "auto" then return { imbalance = SPLIT_IMBALANCE } end
  if v == "off" then return nil end
  if type(v) ~= "table" then
    E.raise(E.EINVAL, "dist.split_ns must be 'auto', 'off' or a table { max_group = n, imbalance = x }, got %s",
      E.value(v))
  end
  for k in pairs(v) do
    if k ~= "max_group" and k ~= "imbalance" then
      E.raise(E.EINVAL, "dist.split_ns: %s", E.unknown("key", tostring(k), { "max_group", "imbalance" }))
    end
  end
  local g, imb = v.max_group, v.imbalance
  if g ~= nil and (type(g) ~= "number" or g < 1 or g ~= math.floor(g) or g == math.huge) then
    E.raise(E.EINVAL, "dist.split_ns.max_group must be an integer >= 1 (ranks per matrix; 1: never split), got %s",
      E.value(g))
  end
  if imb ~= nil and (type(imb) ~= "number" or imb ~= imb or imb < 1 or imb == math.huge) then
    E.raise(E.EINVAL, "dist.split_ns.imbalance must be a finite number >= 1 (largest rank / mean), got %s", E.value(imb))
  end
  if g == 1 then return nil end
  return { max_group = g, imbalance = imb or SPLIT_IMBALANCE }
end

-- Every rank's share of a record split over g ranks (ns.split_cost, per
-- matrix times the batch; balance "numel": its fraction of the numel), in
-- group-rank order, with .blocks and .pieces (each one's piece of a 2-D
-- matrix as a global box); cached per shape, options and g.
local share_cache = setmetatable({}, { __mode = "k" })
function split_shares(r, g, balance)
  local rows, cols, batch = ns.core(r.shape, r.nd_mode)
  local opts = r.ns_opts or {}
  local per = share_cache[opts]
  if not per then
    per = {}
    share_cache[opts] = per
  end
  local key = table.concat({ rows, cols, batch, g, balance, r.dtype }, ":")
  if per[key] then return per[key] end
  local shares, total = { pieces = {} }, 0
  for q = 0, g - 1 do
    local c = ns.split_cost(rows, cols, opts, g, q, r.dtype == "float64" and "float64" or "float32")
    shares[q + 1] = c.flops * batch
    shares.blocks = c.blocks
    total = total + shares[q + 1]
    local box = { start = { 0, 0 }, len = { rows, cols } } -- (2-D: only those split)
    box.start[c.dim], box.len[c.dim] = c.start, c.length
    shares.pieces[q + 1] = box
  end
  if balance ~= "flops" then
    for i = 1, g do shares[i] = total > 0 and shares[i] / total * r.numel or 0 end
  end
  per[key] = shares
  return shares
end

-- The least loaded rank of pool (ties: the smaller rank) that is not one
-- of `taken` (the ranks of the piece's group so far); its load grows by
-- cost (every pool of plist learns it).
function take_least(pool, load, taken, cost, plist, mesh)
  local skipped, saved, q = {}, {}
  while true do
    q = least_loaded(pool, load)
    local clash = false
    for _, t in pairs(taken) do clash = clash or t == q end
    if not clash then break end
    skipped[#skipped + 1], saved[#skipped + 1] = q, load[q]
    load[q] = math.huge -- (out of the pool until the piece is placed)
  end
  local function learn(x)
    local xc = mesh:coords(x)
    for _, pl in ipairs(plist) do
      if pl.has(xc) then hpush(pl.heap, { load[x], x }) end
    end
  end
  for i, x in ipairs(skipped) do
    load[x] = saved[i] or 0
    learn(x)
  end
  load[q] = (load[q] or 0) + cost
  learn(q)
  return q
end

-- The largest load over the mean of W ranks (1 without load).
local function load_imbalance(load, W)
  local mx, sum = 0, 0
  for _, l in pairs(load) do mx, sum = math.max(mx, l), sum + l end
  return sum > 0 and mx / (sum / W) or 1
end

-- The group sizes a split may take for a job: at most max_group, the
-- candidate ranks, and max(blocks, stripes) (beyond, ranks have nothing);
-- 1 (no split) but for 2-D float32 or float64 matrices of more than one
-- block whose record allows it (split_ok: no hook of its group needs the
-- matrix whole or replaces Newton-Schulz).
local function split_cap(j, mesh, split)
  local r = j.r
  if j.cap == nil then
    local rows, cols = ns.core(r.shape, r.nd_mode)
    local k = rows and ns.split_blocks(rows, cols, r.ns_opts or {}) or 1
    j.k = k
    -- (2-D float matrices whose group has no hook around Newton-Schulz)
    if k < 2 or #r.shape ~= 2 or r.split_ok == false or (r.dtype ~= "float32" and r.dtype ~= "float64") then
      j.cap = 1
    else
      local c = ns.split_cost(rows, cols, r.ns_opts or {}, 2, 0)
      local ranks = 1
      for a = 1, #mesh.sizes do
        local z = false
        for _, b in ipairs(r.pool_zero) do z = z or a == b end
        if not z then ranks = ranks * mesh.sizes[a] end
      end
      j.cap = math.min(split.max_group or math.huge, ranks, math.max(k, c.stripes))
    end
  end
  return j.cap
end

-- The first group sizes (jobs in placement order; sizes[i] = g, 1 not
-- split): a matrix splits when its cost alone exceeds split.imbalance
-- times the mean rank's NS cost (so also whenever there are more ranks
-- than matrices of like cost), over the fewest ranks whose largest share
-- is within that bound (at most split_cap and the blocks; the rounds of
-- grow_splits go beyond). Only shapes of more than one
-- block (the blocked iteration: a long side of 8192 or more) can split.
local function split_sizes(jobs, load, mesh, split, balance)
  local sizes = {}
  if not split then return sizes end
  local total = 0
  for _, l in pairs(load) do total = total + l end
  for _, j in ipairs(jobs) do total = total + j.cost end
  local bound = split.imbalance * total / mesh.size
  for i, j in ipairs(jobs) do
    local cap = split_cap(j, mesh, split)
    sizes[i] = 1
    if cap > 1 and j.cost > bound then
      local g = math.max(2, math.min(cap, math.ceil(j.cost / bound)))
      while g < math.min(cap, j.k) do -- (beyond k blocks, grow_splits' rounds)
        local sh, mx = split_shares(j.r, g, balance), 0
        for q = 1, g do mx = math.max(mx, sh[q]) end
        if mx <= bound then break end
        g = g + 1
      end
      sizes[i] = g
    end
  end
  return sizes
end

-- Larger groups when the placed loads stay above the bound: every split
-- job's group doubles (at most its cap: finer shares, stripes alone on
-- the extra ranks, fill the ranks' gaps). nil when none can grow.
local function grow_splits(jobs, sizes)
  local out, grown = {}, false
  for i, j in ipairs(jobs) do
    out[i] = sizes[i] or 1
    if out[i] > 1 and out[i] < j.cap then
      out[i] = math.min(j.cap, 2 * out[i])
      grown = true
    end
  end
  return grown and out or nil
end

-- The pieces of a split record's group: pieces[gq + 1] = group rank gq's
-- piece of the matrix as a global box (columns of a wide matrix, rows of a
-- tall one: ns.split_cost's).
function P.split_pieces(r) return r.ns_group.shares.pieces end

-- The intersection of two global boxes, or nil when empty.
function P.meet(a, b)
  local box = { start = {}, len = {} }
  for d = 1, #a.len do
    local s = math.max(a.start[d], b.start[d])
    local e = math.min(a.start[d] + a.len[d], b.start[d] + b.len[d])
    if e <= s then return nil end
    box.start[d], box.len[d] = s, e - s
  end
  return box
end

-- Who sends a split record's pieces to whom, as rank `me` sees it: in
-- (out = false), the state holders' boxes of the Newton-Schulz input to
-- the members' pieces; out, the members' pieces of the update to every
-- rank holding a box (each holder's box on every replica). Calls
-- fn(peer, box, send) for each piece this rank sends (send true) or
-- receives, in an order both sides share (as a holder, the members in
-- group order; as a member, the boxes in shard-coordinate then replica
-- order: one piece per pair of ranks and record). O(boxes) for a member.
function P.split_moves(r, mesh, me, out, fn)
  local pieces = P.split_pieces(r)
  local mine = (out and r.mine_n > 0 or not out and r.holds) and r.mine or nil
  if mine then
    for q, rank in ipairs(r.ns_group.ranks) do
      local m = P.meet(mine, pieces[q])
      if m then fn(rank, m, not out, mine) end
    end
  end
  local gq
  for i, q in ipairs(r.ns_group.ranks) do
    if q == me then gq = i - 1 end
  end
  if not gq then return end
  local piece = pieces[gq + 1]
  for _, b in ipairs(P.boxes_of(r, mesh)) do
    local coords = mesh:coords(b.holder)
    for c = 0, (out and r.nrep or 1) - 1 do
      if out then set_class(r, mesh, c, coords) end
      local m = P.meet(b.box, piece)
      if m then fn(mesh:rank_of(coords), m, out, piece) end
    end
  end
end

-- plan.ns_load: a rank without Newton-Schulz work reads 0.
local NO_LOAD = { __index = function() return 0 end }

-- The rules every rank evaluates identically (no scan over the ranks or
-- the replica classes: O(P log P) time and memory over P records, plus the
-- items of split records):
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
-- returns the NS load of the ranks that have some (0-based, sparse).
local function assign(records, mesh, balance, split)
  local function cost(r, shape) return balance == "flops" and ns.shape_cost(shape, r.nd_mode, r.ns_opts) or G.numel(shape) end
  local function by_cost(x, y)
    if x.cost ~= y.cost then return x.cost > y.cost end
    return x.r.index < y.r.index
  end
  -- Pass 1: replica classes by state bytes, per set of replicate axes.
  local jobs = {}
  for _, r in ipairs(records) do
    if r.numel > 0 and not r.single then
      jobs[#jobs + 1] = { cost = G.numel(r.box0.len) * (ESIZE[r.dtype] or 4) * (r.state_count or 1), r = r }
    elseif r.numel == 0 then
      r.c = 0
    end
  end
  table.sort(jobs, by_cost)
  local classes = {} -- replicate axes -> { pool, bytes }
  for _, j in ipairs(jobs) do
    local r = j.r
    local key = table.concat(r.raxes, ",")
    local k = classes[key]
    if not k then
      k = { pool = { size = r.nrep, next = 0, heap = {}, nth = function(c) return c end }, bytes = {} }
      classes[key] = k
    end
    r.c = least_loaded(k.pool, k.bytes)
    add_load(k.bytes, r.c, j.cost, k.pool)
  end
  -- NS loads of the items of split records (owner: the holder of the
  -- first box of the item).
  local load = {}
  local coords = {}
  for _, r in ipairs(records) do
    if r.ns and r.split and r.numel > 0 then
      for a = 1, #mesh.sizes do coords[a] = 0 end
      set_class(r, mesh, r.c, coords)
      G.each_box(r.shape, r.placement, mesh, r.batch_axes, coords, function(cc, box)
        local region = region_of(r, box)
        add_load(load, mesh:rank_of(cc), cost(r, region.len))
      end)
    end
  end
  -- Pass 2: single records by NS cost to the least loaded candidates (a
  -- split record's group: its g least loaded), among every rank ("*") or
  -- the ranks at coordinate 0 of some axes (the holders of a non-spanning
  -- record's one box); the group sizes by split_sizes.
  jobs = {}
  for _, r in ipairs(records) do
    if r.single then jobs[#jobs + 1] = { cost = cost(r, r.shape), r = r } end
  end
  table.sort(jobs, by_cost)
  -- Every piece (a job's whole cost, or one share of its group) largest
  -- first (ties: the job's order, then the group rank) onto the least
  -- loaded candidate not yet in its group.
  local function place(sizes)
    local l = {}
    for q, v in pairs(load) do l[q] = v end
    local pools, plist, pieces = {}, {}, {}
    for ji, j in ipairs(jobs) do
      local r, g = j.r, sizes[ji] or 1
      if not pools[r.pool_key] then
        pools[r.pool_key] = rank_pool(mesh, r.pool_zero, l)
        plist[#plist + 1] = pools[r.pool_key]
      end
      local shares = g > 1 and split_shares(r, g, balance) or { j.cost }
      j.ranks, j.shares = {}, shares
      for q = 1, g do pieces[#pieces + 1] = { shares[q], ji, q } end
    end
    table.sort(pieces, function(x, y)
      if x[1] ~= y[1] then return x[1] > y[1] end
      if x[2] ~= y[2] then return x[2] < y[2] end
      return x[3] < y[3]
    end)
    for _, pc in ipairs(pieces) do
      local j = jobs[pc[2]]
      local q = take_least(pools[j.r.pool_key], l, j.ranks, pc[1], plist, mesh)
      j.ranks[pc[3]] = q
    end
    for _, j in ipairs(jobs) do
      local r = j.r
      r.owner = j.ranks[1]
      r.c = class_of(r, mesh, mesh:coords(r.owner))
      r.ns_group = #j.ranks > 1 and { size = #j.ranks, ranks = j.ranks, shares = j.shares, blocks = j.shares.blocks }
        or nil
      j.ranks = nil
    end
    return l
  end
  -- Groups grow (grow_splits) while the imbalance stays above the bound
  -- and each round gains at least SPLIT_GAIN (larger groups move more
  -- bytes: every member receives the small side's stripes).
  local sizes = split_sizes(jobs, load, mesh, split, balance)
  local best, best_imb
  for _ = 0, SPLIT_ROUNDS do
    local imb = load_imbalance(place(sizes), mesh.size)
    if best ~= nil and imb > best_imb / SPLIT_GAIN then break end
    best, best_imb = sizes, imb
    if not split or imb <= split.imbalance then break end
    local grown = grow_splits(jobs, sizes)
    if not grown then break end
    sizes = grown
  end
  return place(best)
end

-- The item of record r that rank `me` (coordinates mc) takes part in, or
-- nil: { record, region (global box), owner, ns, sources = { {rank, box} }
-- (state holders sending their NS input piece to the owner), dests =
-- { {rank, box} } (ranks receiving their slice of the update: P.dests),
-- attached (hook state moved with it) }. The owner's item lists every
-- piece; any other rank's only its own. (The owner's dests, a slice for
-- every replica of every source, are made on first use by P.dests: a plan
-- that is only looked at, muon check --world, never holds them.)
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
    it.dests, it.mesh = nil, mesh
    G.each_box(r.shape, r.placement, mesh, r.core_axes, copy(base), function(x, b)
      local holder = mesh:rank_of(x)
      do
        it.sources[#it.sources + 1] = { rank = holder, box = b, local_ = holder == owner }
        for i, h in ipairs(hooks) do
          local hb = G.hook_box(h.shape, r.shape, r.placement, mesh, holder)
          if G.numel(hb.len) > 0 and box_within(hb, atts[i].region) then
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
        if G.numel(hb.len) > 0 then
          local piece = { rank = me, box = hb }
          atts[i].sources[1], atts[i].dests[1] = piece, piece
        end
      end
    end
    if r.mine_n > 0 then it.dests[1] = { rank = me, box = r.mine } end
  end
  return it
end

-- The dests of an item: the ranks receiving their slice of its update,
-- { {rank, box} }. The owner's are every replica of every source's box
-- (the ranks at its shard coordinates, every replica class), made here on
-- first use and kept.
function P.dests(it)
  if it.dests then return it.dests end
  local r, mesh, dests = it.record, it.mesh, {}
  for _, s in ipairs(it.sources) do
    local dc = mesh:coords(s.rank)
    for c = 0, r.nrep - 1 do
      set_class(r, mesh, c, dc)
      dests[#dests + 1] = { rank = mesh:rank_of(dc), box = s.box }
    end
  end
  it.dests = dests
  return dests
end

-- The number of an item's dests other than its owner (no list made).
local function dests_elsewhere(it)
  if it.dests then
    local n = 0
    for _, d in ipairs(it.dests) do if d.rank ~= it.owner then n = n + G.numel(d.box.len) end end
    return n
  end
  local r, mesh, n = it.record, it.mesh, 0
  local oc = mesh:coords(it.owner)
  for _, s in ipairs(it.sources) do
    local sc, mine = mesh:coords(s.rank), 1
    for a, p in ipairs(r.placement) do
      if p.kind == "S" and sc[a] ~= oc[a] then mine = 0 end
    end
    n = n + G.numel(s.box.len) * (r.nrep - mine) -- (the owner is one of the replicas when it shares the box)
  end
  return n
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
-- Sets on each record (see P.analyse for the rule fields):
--   mine, mine_n   this rank's box (0-based start, len per dim), its numel
--   holds          whether this rank keeps the optimizer state of its box
--   c, owner       the holder replica class; the NS owner of a single record
--   items          the item this rank takes part in (at most one; see item_for)
--   hook_records[key]  { name, key, shape, dtype, parent, mine, holds }
-- and returns { mesh, rank, records, batches, ns_load (rank -> NS cost,
-- stored for the ranks that have some; 0 for the others), balance }. plan.batches: { records, items (this rank's),
-- group, shard, dtypes, moves_in, moves_out } per group and shard count
-- (split at 512M elements / the shard count, whole records), interleaved
-- across groups; the same records and flags on every rank.
-- Time and memory: O(P log P), plus this rank's own items and the items of
-- split records (assign); nothing per rank of the mesh.
function P.plan(records, mesh, opts)
  opts = opts or {}
  local balance = opts.balance or "flops"
  if balance ~= "flops" and balance ~= "numel" then
    E.raise(E.EINVAL, "dist: balance must be 'flops' or 'numel', got " .. tostring(balance))
  end
  local me = opts.rank or 0
  local maxb = opts.max_batch_numel or P.DEFAULT_MAX_BATCH_NUMEL
  local plan = { mesh = mesh, rank = me, records = records, batches = {}, balance = balance }
  for ri, r in ipairs(records) do
    r.index = ri
    P.analyse(r, mesh)
  end
  local split = P.split_options(opts.split_ns)
  plan.split_ns = split
  plan.ns_load = setmetatable(assign(records, mesh, balance, split), NO_LOAD)
  local mc = mesh:coords(me)
  for _, r in ipairs(records) do
    r.mine = G.local_box(r.shape, r.placement, mesh, me)
    r.mine_n = G.numel(r.mine.len)
    r.holds = r.mine_n > 0 and class_of(r, mesh, mc) == r.c
    r.hook_records = {}
    for _, h in ipairs(r.hooks or {}) do
      local hb = G.hook_box(h.shape, r.shape, r.placement, mesh, me)
      r.hook_records[h.key] = { name = r.name .. "/" .. h.key, key = h.key, shape = h.shape, placement = r.placement,
        dtype = r.dtype, parent = r, mine = hb, holds = r.holds and G.numel(hb.len) > 0 }
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
    for i, recs in ipairs(batches) do batches[i] = P.batch(recs, k.group, k.shard) end
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
function P.batch(recs, group, shard)
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
    if not r.ns_group then -- (split records run in muon.split_phase, not routed)
      for _, it in ipairs(r.items) do b.items[#b.items + 1] = it end
    end
  end
  table.sort(b.dtypes)
  return b
end

-- Every distinct non-empty box of a record (or of a hook record) with its
-- state holder: { {box, holder} }, in the order of the shard coordinates.
-- O(non-empty boxes): for the rank that gathers or scatters every box.
-- (A hook box is empty where the parameter's is.)
function P.boxes_of(rec, mesh)
  local r = rec.parent or rec
  local coords = {}
  for a = 1, #mesh.sizes do coords[a] = 0 end
  set_class(r, mesh, r.c, coords)
  local saxes = {}
  for a, p in ipairs(r.placement) do if p.kind == "S" then saxes[#saxes + 1] = a end end
  local out = {}
  G.each_box(r.shape, r.placement, mesh, saxes, coords, function(x, pb)
    local q = mesh:rank_of(x)
    local b = rec.parent and G.hook_box(rec.shape, r.shape, r.placement, mesh, q) or pb
    if G.numel(b.len) > 0 then out[#out + 1] = { box = b, holder = q } end
  end)
  return out
end

-- The job's NS imbalance: the largest rank's NS cost over the mean (1 for
-- no NS work). O(ranks with NS work).
function P.imbalance(plan)
  local W, mx, sum = plan.mesh.size, 0, 0
  for _, l in pairs(plan.ns_load) do mx, sum = math.max(mx, l), sum + l end
  return sum > 0 and mx / (sum / W) or 1
end

-- Elements plan.rank sends and receives for one step of `plan` (records
-- for which stepping(record) is true; all when nil): NS input pieces from
-- state holders to owners, then each update slice from the owner to every
-- other rank that holds it (split records: to and from the pieces of its
-- group, P.split_moves; the group's own exchanges are the machines',
-- ns.split_cost). `rank` must be the plan's rank.
function P.step_elements(plan, rank, stepping)
  local sent, recv = 0, 0
  local function count(it)
    local o = it.owner
    for _, s in ipairs(it.sources) do
      if s.rank ~= o then
        local n = G.numel(s.box.len)
        if s.rank == rank then sent = sent + n end
        if o == rank then recv = recv + n end
      end
    end
    if o == rank then
      sent = sent + dests_elsewhere(it)
    else
      for _, d in ipairs(P.dests(it)) do
        if d.rank == rank then recv = recv + G.numel(d.box.len) end
      end
    end
  end
  local function split(peer, box, send)
    if peer == rank then return end
    if send then sent = sent + G.numel(box.len) else recv = recv + G.numel(box.len) end
  end
  for _, r in ipairs(plan.records) do
    if stepping == nil or stepping(r) then
      if r.ns_group then
        P.split_moves(r, plan.mesh, rank, false, split)
        P.split_moves(r, plan.mesh, rank, true, split)
      else
        for _, it in ipairs(r.items) do
          count(it)
          for _, a in ipairs(it.attached or {}) do count(a) end
        end
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
function P.seed_step_elements(plan, rank)
  local mesh = plan.mesh
  local recv = 0
  for _, r in ipairs(plan.records) do
    if r.ns then
      for _, it in ipairs(r.items) do
        local o = it.owner
        local mine = r.mine_n
        if box_within(r.mine, it.region) and mine > 0 or rank == o then
          local in_group = rank == o or is_source(r.placement, mesh, rank, o)
          local n = G.numel(it.region.len)
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

return P
