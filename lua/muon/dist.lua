-- Distributed planning (HSDP): device mesh, placements, local shards,
-- Newton-Schulz owners, batch schedule, communication volumes, and the
-- cross-rank agreement check. Pure Lua, computed once at setup; the step
-- itself lives in muon.optim.dist_step.
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
local bit = require("bit")

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
    error("dist.mesh must be a non-empty list of {name, size} axes", 2)
  end
  local axes, sizes, strides, prod, names = {}, {}, {}, 1, {}
  for i, ax in ipairs(spec) do
    if type(ax) ~= "table" or type(ax[1]) ~= "string" or type(ax[2]) ~= "number"
      or ax[2] < 1 or ax[2] ~= math.floor(ax[2]) then
      error(("dist.mesh[%d] must be {name, size} with a string name and an integer size >= 1"):format(i), 2)
    end
    if names[ax[1]] then error(("dist.mesh: axis name '%s' appears twice"):format(ax[1]), 2) end
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
    error(("dist.mesh: axis sizes (%s) multiply to %d but the world has %d ranks"):format(
      table.concat(parts, ", "), prod, world), 2)
  end
  return setmetatable({ axes = axes, sizes = sizes, strides = strides, size = prod, index = names }, Mesh)
end

function D.is_mesh(x) return getmetatable(x) == Mesh end

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
  error(("%s must be 'replicate' or {'shard', dim} (also 'R', 'S(dim)'), got %s"):format(
    where, type(v) == "string" and ("'" .. v .. "'") or tostring(v)), 3)
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
  if type(spec) ~= "table" then error("placement must be a table (one entry per mesh axis)", 2) end
  if #spec > 0 then
    if #spec ~= n then
      error(("placement has %d entries but the mesh %s has %d axes"):format(#spec, mesh:describe(), n), 2)
    end
    for i = 1, n do out[i] = parse_axis(spec[i], ("placement[%d]"):format(i)) end
  else
    for k in pairs(spec) do
      if not mesh.index[k] then
        error(("placement names axis '%s', which the mesh %s does not have"):format(tostring(k), mesh:describe()), 2)
      end
    end
    for i, a in ipairs(mesh.axes) do out[i] = parse_axis(spec[a.name] or "R", ("placement." .. a.name)) end
  end
  if ndim then
    for i, p in ipairs(out) do
      if p.kind == "S" and (p.dim < 1 or p.dim > ndim or p.dim ~= math.floor(p.dim)) then
        error(("placement[%d] shards dim %s of a %d-D tensor"):format(i, tostring(p.dim), ndim), 2)
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

function D.is_sharded(pl)
  for _, p in ipairs(pl) do if p.kind == "S" then return true end end
  return false
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

function D.local_shape(shape, pl, mesh, rank)
  return D.local_box(shape, pl, mesh, rank).len
end

function D.numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- Key of the box a rank holds: its coordinates on the axes that shard.
local function box_key(pl, coords)
  local k = {}
  for a = 1, #pl do if pl[a].kind == "S" then k[#k + 1] = coords[a] end end
  return table.concat(k, ",")
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

------------------------------------------------------------ NS cost model

-- Core matrix shape and batch count as the Newton-Schulz code sees it:
-- 2-D (A, B); 3-D (A, 1, B) is a conv-like (A, B); other N-D are batches of
-- their last two dims.
function D.core_shape(shape)
  local nd = #shape
  if nd == 3 and shape[2] == 1 then return shape[1], shape[3], 1 end
  local b = 1
  for i = 1, nd - 2 do b = b * shape[i] end
  return shape[nd - 1], shape[nd], b
end

-- Floating-point operations of one Newton-Schulz step on this parameter
-- (m = the smaller side): X X^T (2 m^2 n) + A A (2 m^3) + B X (2 m^2 n).
function D.ns_flops(shape)
  local a, b, batch = D.core_shape(shape)
  local m, n = math.min(a, b), math.max(a, b)
  return batch * (4 * m * m * n + 2 * m * m * m)
end

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

-- Makespan (max load / mean load) of an owner assignment under a cost.
function D.imbalance(owners, costs, ncoords)
  local load, total = {}, 0
  for c = 0, ncoords - 1 do load[c] = 0 end
  for i, o in pairs(owners) do
    load[o] = load[o] + costs[i]
    total = total + costs[i]
  end
  local mx = 0
  for c = 0, ncoords - 1 do mx = math.max(mx, load[c]) end
  if total == 0 then return 1, mx end
  return mx / (total / ncoords), mx
end

---------------------------------------------------------------- the plan

D.DEFAULT_MAX_BATCH_NUMEL = 512 * 1024 * 1024

-- records: list (registration order) of {
--   name, shape (global), placement (normalized), group (index),
--   muon (bool: NS-based), has_grad (bool) }
-- opts: { balance = "flops" | "numel", max_batch_numel = n }
-- Returns a plan: per record .owner (0-based rank, muon params with grad)
-- and .kind ("local" for elementwise optimizers or world size 1, "owner"
-- otherwise), and plan.batches (list of lists of record indices).
function D.plan(records, mesh, opts)
  opts = opts or {}
  local balance = opts.balance or "flops"
  if balance ~= "flops" and balance ~= "numel" then
    error("dist: balance must be 'flops' or 'numel', got " .. tostring(balance), 2)
  end
  local maxb = opts.max_batch_numel or D.DEFAULT_MAX_BATCH_NUMEL
  local plan = { mesh = mesh, records = records, batches = {}, balance = balance }
  local ns_idx, costs = {}, {}
  for i, r in ipairs(records) do
    r.numel = D.numel(r.shape)
    if r.muon and r.has_grad and r.numel > 0 then
      r.kind = mesh.size == 1 and "local" or "owner"
      ns_idx[#ns_idx + 1] = i
      costs[#costs + 1] = balance == "flops" and D.ns_flops(r.shape) or r.numel
    else
      r.kind = "local"
    end
  end
  local owners = D.build_owner_by_size(costs, mesh.size)
  for j, i in ipairs(ns_idx) do records[i].owner = owners[j] end
  -- Batches: per group in registration order, split like the seed's
  -- _split_into_memory_safe_batches; then interleaved by batch index
  -- (batch 1 of every group, batch 2 of every group, ...).
  local by_group, group_order = {}, {}
  for _, i in ipairs(ns_idx) do
    if records[i].kind ~= "owner" then goto continue end
    local g = records[i].group or 1
    if not by_group[g] then
      by_group[g] = {}
      group_order[#group_order + 1] = g
    end
    table.insert(by_group[g], i)
    ::continue::
  end
  table.sort(group_order)
  local per_group = {}
  for gi, g in ipairs(group_order) do
    local batches, cur, count = {}, {}, 0
    for _, i in ipairs(by_group[g]) do
      local n = records[i].numel
      if #cur >= 1 and count + n > maxb then
        batches[#batches + 1] = cur
        cur, count = { i }, n
      else
        cur[#cur + 1] = i
        count = count + n
      end
    end
    if #cur > 0 then batches[#batches + 1] = cur end
    per_group[gi] = batches
  end
  local k = 1
  while true do
    local any = false
    for gi = 1, #per_group do
      if per_group[gi][k] then
        plan.batches[#plan.batches + 1] = per_group[gi][k]
        any = true
      end
    end
    if not any then break end
    k = k + 1
  end
  return plan
end

-- Elements a rank sends and receives in one step for the NS routing of
-- plan (two all-to-all-v per batch): the NS input pieces it holds for
-- owners that do not hold them, and the update slices of the parameters it
-- owns for every other rank holding a non-empty piece; symmetric receives.
function D.step_elements(plan, rank)
  local mesh = plan.mesh
  local sent, recv = 0, 0
  for _, r in ipairs(plan.records) do
    if r.kind == "owner" then
      local o = r.owner
      if rank == o then
        for q = 0, mesh.size - 1 do
          if q ~= o then
            local n = D.numel(D.local_shape(r.shape, r.placement, mesh, q))
            sent = sent + n -- update slice out
            if is_source(r.placement, mesh, q, o) then recv = recv + n end -- input piece in
          end
        end
      else
        local n = D.numel(D.local_shape(r.shape, r.placement, mesh, rank))
        recv = recv + n
        if is_source(r.placement, mesh, rank, o) then sent = sent + n end
      end
    end
  end
  return sent, recv
end

-- What the seed's scheme (all-gather of the NS input over the owner's shard
-- group, full-update broadcast from the compute rank to the shard group,
-- then the updated shard broadcast to the replicas) receives per rank for
-- the same owners, in elements, without its padding.
function D.seed_step_elements(plan, rank)
  local mesh = plan.mesh
  local recv = 0
  for _, r in ipairs(plan.records) do
    if r.kind == "owner" then
      local o = r.owner
      local mine = D.numel(D.local_shape(r.shape, r.placement, mesh, rank))
      if rank == o or is_source(r.placement, mesh, rank, o) then
        -- in the owner's replica group
        recv = recv + (r.numel - mine)      -- all-gather of the NS input
        if rank ~= o then recv = recv + r.numel end -- full update broadcast
      else
        recv = recv + mine                   -- replica broadcast of the new shard
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
  return ("'%s' shape {%s} placement %s group %s%s%s%s"):format(r.name, table.concat(r.shape, ","),
    D.placement_string(r.placement), tostring(r.group or 1), r.muon and " muon" or " elementwise",
    r.has_grad and "" or " no-grad", r.dtype and (" " .. r.dtype) or "")
end

-- Collective over comm: all ranks check they registered the same records
-- (names, global shapes, placements, groups, grads) in the same order.
-- Returns nil if they agree, else the same message on every rank naming the
-- first difference.
function D.agree(comm, records, extra)
  local desc = {}
  for i, r in ipairs(records) do desc[i] = D.describe_record(r) end
  if extra then desc[#desc + 1] = "settings: " .. extra end
  local n = #desc
  local cnt = comm:allreduce({ n, -n }, "max")
  local maxn, minn = cnt[1], -cnt[2]
  local len = maxn
  local mins, maxs = {}, {}
  for i = 1, len do
    local h = desc[i] and D.hash(desc[i]) or -1
    mins[i], maxs[i] = -h, h
  end
  local lo = comm:allreduce(mins, "max") -- -(min)
  local hi = comm:allreduce(maxs, "max")
  local first
  for i = 1, len do
    if -lo[i] ~= hi[i] then first = i break end
  end
  if not first and maxn == minn then return nil end
  first = first or (minn + 1)
  -- Name the difference: rank 0's entry vs the lowest rank that differs.
  local mine = desc[first] or "(nothing)"
  local r0 = comm:bcast_string(comm:rank() == 0 and mine or "", 0)
  local differs = comm:allreduce({ mine ~= r0 and comm:rank() or comm:size() }, "min")[1]
  if differs >= comm:size() then differs = 0 end
  local other = comm:bcast_string(comm:rank() == differs and mine or "", differs)
  local what = first <= minn and ("parameter #%d"):format(first) or ("entry #%d"):format(first)
  if extra and first == n then what = "settings" end
  return ("dist: ranks registered different parameters (%s): rank 0 has %s, rank %d has %s"):format(
    what, r0, differs, other)
end

return D
