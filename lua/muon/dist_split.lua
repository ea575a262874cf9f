-- Split Newton-Schulz in the plan of a distributed step (part of muon.dist,
-- lua/muon/dist.lua; the plan, lua/muon/dist_plan.lua, calls it): which
-- matrices split, over how many ranks, and where their pieces go. Pure
-- Lua, the same rules on every rank. (Names starting with "_" are the
-- plan's, not muon.dist's.)
--[[ reference muon.dist
## Split Newton-Schulz
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
]]
local ns = require("muon.ns")
local E = require("muon.errors")
local G = require("muon.dist_mesh")

local S = {}

-- Rounds of grow_splits the plan tries at most.
local SPLIT_ROUNDS = 4
-- The least relative gain in imbalance a round of larger groups must bring.
local SPLIT_GAIN = 1.01
local SPLIT_IMBALANCE = 1.05

-- dist.split_ns ("auto" (nil), "off", or { max_group = n, imbalance = x })
-- normalized: nil for "off", else { max_group (nil: no cap), imbalance }.
function S.split_options(v)
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
local function split_shares(r, g, balance)
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
S._shares = split_shares

-- The largest load over the mean of W ranks (1 without load).
local function load_imbalance(load, W)
  local mx, sum = 0, 0
  for _, l in pairs(load) do mx, sum = math.max(mx, l), sum + l end
  return sum > 0 and mx / (sum / W) or 1
end
S._imbalance = load_imbalance

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

-- The group sizes of a plan's single jobs (its assign: jobs largest
-- first, load the NS load of the other records), given place(sizes) ->
-- the ranks' loads with those groups: split_sizes' first sizes, then
-- groups grow (grow_splits) while the imbalance stays above the bound and
-- each round gains at least SPLIT_GAIN (larger groups move more bytes:
-- every member receives the small side's stripes). The best sizes seen.
function S._groups(jobs, load, mesh, split, balance, place)
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
  return best
end

-- The pieces of a split record's group: pieces[gq + 1] = group rank gq's
-- piece of the matrix as a global box (columns of a wide matrix, rows of a
-- tall one: ns.split_cost's).
function S.split_pieces(r) return r.ns_group.shares.pieces end

-- The intersection of two global boxes, or nil when empty.
function S.meet(a, b)
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
function S.split_moves(r, mesh, me, out, fn)
  local pieces = S.split_pieces(r)
  local mine = (out and r.mine_n > 0 or not out and r.holds) and r.mine or nil
  if mine then
    for q, rank in ipairs(r.ns_group.ranks) do
      local m = S.meet(mine, pieces[q])
      if m then fn(rank, m, not out, mine) end
    end
  end
  local gq
  for i, q in ipairs(r.ns_group.ranks) do
    if q == me then gq = i - 1 end
  end
  if not gq then return end
  local piece = pieces[gq + 1]
  for _, b in ipairs(G.boxes_of(r, mesh)) do
    local coords = mesh:coords(b.holder)
    for c = 0, (out and r.nrep or 1) - 1 do
      if out then G.set_class(r, mesh, c, coords) end
      local m = S.meet(b.box, piece)
      if m then fn(mesh:rank_of(coords), m, out, piece) end
    end
  end
end

return S
