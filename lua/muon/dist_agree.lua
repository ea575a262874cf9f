-- The cross-rank agreement of muon.dist (lua/muon/dist.lua): do all ranks hold
-- the same registrations and settings? Collectives over a communicator,
-- two all-reduces when they agree, one message naming the first difference
-- on every rank when they do not.
--[[ reference muon.dist
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
local G = require("muon.dist_mesh")
local T = require("muon.tensor")

local A = {}

-- FNV-1a over a string, 31 bits (exact in a double and an int64).
function A.hash(s)
  local h = 2166136261
  for i = 1, #s do
    h = bit.bxor(h, s:byte(i)) % 4294967296
    -- h * 16777619 mod 2^32, exact in doubles: 16777619 = 2^24 + 403
    h = ((h % 256) * 16777216 + h * 403) % 4294967296
  end
  return bit.band(h, 0x7fffffff)
end

function A.describe_record(r)
  return ("'%s' shape %s placement %s group %s%s%s"):format(r.name, T.shape_string(r.shape),
    G.placement_string(r.placement), tostring(r.group or 1), r.ns and " muon" or " elementwise",
    r.dtype and (" " .. r.dtype) or "")
end

-- Collective over comm: do all ranks hold the same list of entries? Each
-- entry is { key, value } (strings). Returns nil if they agree, else the
-- same message on every rank naming the first key that differs, what rank 0
-- and the first differing rank have there, and every rank that differs
-- from rank 0. Two all-reduces when they agree (one with known_count, the
-- number of entries every rank is known to have).
function A.agree_entries(comm, entries, what, known_count)
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
    local h = e and A.hash(e[1] .. "=" .. e[2]) or -1
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
function A.agree(comm, records, extra)
  local entries = {}
  for i, r in ipairs(records) do entries[i] = { ("parameter #%d"):format(i), A.describe_record(r) } end
  if extra then entries[#entries + 1] = { "settings", extra } end
  local msg = A.agree_entries(comm, entries, "dist: registered parameters")
  return msg
end

return A
