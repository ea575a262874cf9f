-- One registration per buffer: the memory of every registered parameter
-- value and gradient, so that a buffer registered twice (a tied embedding
-- and head given as two parameters, a grad that is another parameter's
-- value or grad, a view into one) is refused, naming both, before anything
-- is registered. Such a buffer would be updated twice per step; tied
-- weights are one parameter, registered once.
--
-- A tensor's bytes are its extent: from its lowest to one past its highest
-- element (strides taken as they are, so two interleaved strided views of
-- one buffer count as overlapping). Empty tensors hold no bytes. The
-- extents never overlap and are kept in a search tree ordered by start
-- address (a treap: a binary search tree, balanced in expectation by
-- random priorities), so a new one is checked against its two neighbours
-- and inserted in O(log n), whatever the number of registered parameters.
--
--   local B = require("muon.buffers")
--   local set = B.new()
--   set:claim({ p1, p2 })      -- checks p1, p2 (value and grad) against the
--                              -- set and each other, then adds them all; on
--                              -- an overlap raises EINVAL and adds nothing
--   set:check({ p })           -- the same checks, adding nothing
--   set:swap({ { p = p, what = "grad", t = g }, ... })  -- re-point buffers
--                              -- (t nil: none), all checked first; on an
--                              -- overlap raises EINVAL and changes nothing
--   set:count(), set:depth()   -- extents registered; the depth of their tree
--   B.extent(t)                -- lo, hi (byte addresses, hi exclusive) or nil
local ffi = require("ffi")
local T = require("muon.tensor")
local E = require("muon.errors")

local B = {}
local Set = {}
Set.__index = Set

-- The bytes tensor t spans: lo, hi (addresses as numbers; user-space
-- addresses are below 2^53), or nil when it has no element.
function B.extent(t)
  local es = T.DTYPE_SIZES[t:dtype()]
  local lo, hi = 0, 0
  for d = 1, t:dim() do
    local n, s = t:size(d), t:stride(d)
    if n == 0 then return nil end
    local span = (n - 1) * s
    if span < 0 then lo = lo + span else hi = hi + span end
  end
  local base = tonumber(ffi.cast("uintptr_t", t:ptr()))
  return base + lo * es, base + (hi + 1) * es
end

function B.new()
  -- (seed: the set's own generator of priorities, deterministic)
  return setmetatable({ root = nil, seed = 12345, n = 0 }, Set)
end

-- The registered extents next to a start address x: the one with the
-- largest start < x and the one with the smallest start >= x (nil: none).
local function neighbours(t, x)
  local before, after
  while t do
    if t.lo < x then before, t = t, t.right else after, t = t, t.left end
  end
  return before, after
end

local function rotate_right(t)
  local l = t.left
  t.left, l.right = l.right, t
  return l
end

local function rotate_left(t)
  local r = t.right
  t.right, r.left = r.left, t
  return r
end

-- Insert node into the treap t (ordered by lo, max-heap by prio); returns
-- the new root.
local function insert(t, node)
  if t == nil then return node end
  if node.lo < t.lo then
    t.left = insert(t.left, node)
    if t.left.prio > t.prio then t = rotate_right(t) end
  else
    t.right = insert(t.right, node)
    if t.right.prio > t.prio then t = rotate_left(t) end
  end
  return t
end

-- Join treaps a and b (every start in a below every start in b).
local function join(a, b)
  if a == nil then return b end
  if b == nil then return a end
  if a.prio > b.prio then
    a.right = join(a.right, b)
    return a
  end
  b.left = join(a, b.left)
  return b
end

-- Remove the node starting at lo from the treap t; returns the new root
-- and the node (nil when there is none).
local function remove(t, lo)
  if t == nil then return nil, nil end
  if lo == t.lo then
    local l, r = t.left, t.right
    t.left, t.right = nil, nil
    return join(l, r), t
  end
  local node
  if lo < t.lo then t.left, node = remove(t.left, lo) else t.right, node = remove(t.right, lo) end
  return t, node
end

-- What a registration names in messages.
local function label(p, what)
  return what == "value" and ("the value of parameter '%s'"):format(p.name)
    or ("the grad of parameter '%s'"):format(p.name)
end

-- The extents of the parameters' values and grads, sorted by start.
local function entries(params)
  local list = {}
  for _, p in ipairs(params) do
    for _, what in ipairs({ "value", "grad" }) do
      local t = p[what]
      local lo, hi
      if t ~= nil then lo, hi = B.extent(t) end
      if lo then list[#list + 1] = { lo = lo, hi = hi, p = p, what = what } end
    end
  end
  table.sort(list, function(x, y) return x.lo < y.lo end)
  return list
end

local function refuse(e, other_p, other_what)
  local hint = (e.what == "value" and other_what == "value")
    and "tied weights are one parameter: register it once, under one name"
    or "a grad needs its own buffer, apart from every registered value and grad"
  E.raise(E.EINVAL, "parameter '%s': its %s overlaps %s: a buffer can be registered only once (%s)", e.p.name, e.what,
    other_p == e.p and ("its " .. other_what) or label(other_p, other_what), hint)
end

-- Check params against the set and against each other; returns their
-- extents (sorted) for claim.
function Set:check(params)
  local list = entries(params)
  for i, e in ipairs(list) do
    local prev = list[i - 1]
    if prev and prev.hi > e.lo then refuse(e, prev.p, prev.what) end
    -- (the extent that starts before e, then the one that starts at or after it)
    local before, after = neighbours(self.root, e.lo)
    if before and before.hi > e.lo then refuse(e, before.p, before.what) end
    if after and after.lo < e.hi then refuse(e, after.p, after.what) end
  end
  return list
end

-- Check params (see check), then register them all.
function Set:claim(params)
  for _, e in ipairs(self:check(params)) do
    self.seed = self.seed * 16807 % 2147483647 -- (Park-Miller: exact in doubles)
    self.root = insert(self.root, { lo = e.lo, hi = e.hi, p = e.p, what = e.what, prio = self.seed })
    self.n = self.n + 1
  end
end

-- Re-point registered buffers: changes is a list of { p = param, what =
-- "value" | "grad", t = tensor or nil (none) }. Every old extent of those
-- is left out, then the new ones are checked against each other and every
-- other registered one, then they replace the old. On an overlap raises
-- EINVAL naming both, and the set and the params are as they were.
function Set:swap(changes)
  local removed, fresh = {}, {}
  for _, c in ipairs(changes) do
    local lo = c.p[c.what] ~= nil and B.extent(c.p[c.what]) or nil
    local node
    if lo then self.root, node = remove(self.root, lo) end
    removed[#removed + 1] = node
    fresh[#fresh + 1] = { name = c.p.name, [c.what] = c.t }
  end
  local ok, err = pcall(self.check, self, fresh)
  if not ok then
    for _, node in ipairs(removed) do self.root = insert(self.root, node) end
    error(err, 0)
  end
  self.n = self.n - #removed
  for _, c in ipairs(changes) do c.p[c.what] = c.t end
  self:claim(fresh)
end

-- The number of registered extents, and the depth of their tree (about
-- 2.5 log2(n) whatever the order of registration).
function Set:count() return self.n end

function Set:depth()
  local function d(t) return t and 1 + math.max(d(t.left), d(t.right)) or 0 end
  return d(self.root)
end

return B
