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
-- extents are kept sorted by start address and never overlap, so a new one
-- is checked against its two neighbours found by binary search: O(log n)
-- per check, whatever the number of registered parameters.
--
--   local B = require("muon.buffers")
--   local set = B.new()
--   set:claim({ p1, p2 })      -- checks p1, p2 (value and grad) against the
--                              -- set and each other, then adds them all; on
--                              -- an overlap raises EINVAL and adds nothing
--   set:check({ p })           -- the same checks, adding nothing
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
  return setmetatable({ lo = {}, hi = {}, who = {} }, Set)
end

-- The index of the first registered extent whose start is >= lo (#+1 if none).
local function lower_bound(self, lo)
  local a, b = 1, #self.lo + 1
  while a < b do
    local m = math.floor((a + b) / 2)
    if self.lo[m] < lo then a = m + 1 else b = m end
  end
  return a
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
    local k = lower_bound(self, e.lo)
    -- (the extent before e.lo, then the one starting at or after it)
    if k > 1 and self.hi[k - 1] > e.lo then refuse(e, self.who[k - 1].p, self.who[k - 1].what) end
    if k <= #self.lo and self.lo[k] < e.hi then refuse(e, self.who[k].p, self.who[k].what) end
  end
  return list
end

-- Check params (see check), then register them all.
function Set:claim(params)
  for _, e in ipairs(self:check(params)) do
    local k = lower_bound(self, e.lo)
    table.insert(self.lo, k, e.lo)
    table.insert(self.hi, k, e.hi)
    table.insert(self.who, k, { p = e.p, what = e.what })
  end
end

return B
