-- The router: moves NS inputs to the rank that orthogonalizes them and
-- updates back to every rank that holds a piece, batch by batch, as the
-- plan of muon.dist says (D.plan: items with an owner, sources and dests,
-- and hook state items attached to them). On one process (or for items
-- whose owner holds everything) nothing moves and the owner works in place
-- on its own buffers.
--
--   local router = require("muon.router").new(data_comm)
--   router:run(batch_items, dtypes, moves_in, moves_out, io)
--     io.source(record)    -> what this rank sends for the record (its box):
--                             the NS input, or a hook state's current value
--     io.dest(record)      -> where this rank receives it back (the update,
--                             or the hook state's next value)
--     io.buffer(item)      -> the owner's buffer for an item's region
--     io.compute(owned)    -> the owners' work on { item, input, state = { key -> buffer } }
--   router:exchange(dtype, sends, recvs)   -- one all-to-all-v of pieces
local T = require("muon.tensor")
local D = require("muon.dist")

local R = {}
local Router = {}
Router.__index = Router

function R.new(comm)
  return setmetatable({ comm = comm, W = comm:size(), me = comm:rank(), bufs = {} }, Router)
end

-- Bytes held by the staging buffers.
function Router:scratch_bytes()
  local n = 0
  for _, b in pairs(self.bufs) do
    n = n + b.send:numel() * (b.send:dtype() == "float64" and 8 or 4)
    n = n + b.recv:numel() * (b.recv:dtype() == "float64" and 8 or 4)
  end
  return n
end

-- One all-to-all-v over the data communicator. sends[q+1] = list of
-- { n = elements, src = tensor }; recvs[q+1] = list of { n, dst = tensor }.
function Router:exchange(dtype, sends, recvs)
  local W = self.W
  local scount, rcount, stot, rtot = {}, {}, 0, 0
  for q = 1, W do
    local s, r = 0, 0
    for _, x in ipairs(sends[q]) do s = s + x.n end
    for _, x in ipairs(recvs[q]) do r = r + x.n end
    scount[q], rcount[q] = s, r
    stot, rtot = stot + s, rtot + r
  end
  -- Staging buffers per dtype, kept across steps (grown when needed).
  local b = self.bufs[dtype]
  if not b or b.send:numel() < stot or b.recv:numel() < rtot then
    b = { send = T.zeros({ math.max(stot, b and b.send:numel() or 1, 1) }, dtype),
          recv = T.zeros({ math.max(rtot, b and b.recv:numel() or 1, 1) }, dtype) }
    self.bufs[dtype] = b
  end
  local sbuf, rbuf = b.send, b.recv
  local off = 0
  for q = 1, W do
    for _, x in ipairs(sends[q]) do
      sbuf:narrow(1, off + 1, x.n):view(x.src:size()):copy(x.src)
      off = off + x.n
    end
  end
  self.comm:alltoallv(sbuf, scount, rbuf, rcount)
  off = 0
  for q = 1, W do
    for _, x in ipairs(recvs[q]) do
      x.dst:copy(rbuf:narrow(1, off + 1, x.n):view(x.dst:size()))
      off = off + x.n
    end
  end
end

local function lists(W)
  local s, r = {}, {}
  for q = 1, W do s[q], r[q] = {}, {} end
  return s, r
end

-- Whether an item's owner computes in place in its own buffer: it is the
-- only source and its box is the whole region.
function R.in_place(it)
  if it.inplace == nil then
    local s = it.sources[1]
    local same = #it.sources == 1 and s.rank == it.owner
    if same then
      for d = 1, #s.box.len do
        if s.box.start[d] ~= it.region.start[d] or s.box.len[d] ~= it.region.len[d] then same = false end
      end
    end
    it.inplace = same
  end
  return it.inplace
end

-- The buffer the owner computes an item in: its own destination buffer when
-- in place (filled from its source when they differ), else its region buffer.
local function work_buffer(it, io)
  if R.in_place(it) then
    local dst, src = io.dest(it.record), io.source(it.record)
    if dst ~= src then dst:copy(src) end
    return dst
  end
  return io.buffer(it)
end

-- One item's pieces on their way in (to the owner) or out (back).
local function route(it, me, io, sends, recvs, out)
  local o = it.owner
  local pieces = out and it.dests or it.sources
  if o == me then
    local inplace = R.in_place(it)
    local buf = inplace and io.dest(it.record) or io.buffer(it)
    for _, p in ipairs(pieces) do
      if p.rank ~= me or not inplace then
        local v = D.box_view(buf, p.box, it.region)
        if p.rank == me then
          if out then io.dest(it.record):copy(v) else v:copy(io.source(it.record)) end
        elseif out then
          table.insert(sends[p.rank + 1], { n = D.numel(p.box.len), src = v })
        else
          table.insert(recvs[p.rank + 1], { n = D.numel(p.box.len), dst = v })
        end
      end
    end
  else
    for _, p in ipairs(pieces) do
      if p.rank == me then
        if out then table.insert(recvs[o + 1], { n = D.numel(p.box.len), dst = io.dest(it.record) })
        else table.insert(sends[o + 1], { n = D.numel(p.box.len), src = io.source(it.record) }) end
      end
    end
  end
end

-- Route one batch: NS inputs (and hook state) to owners, one all-to-all-v
-- per dtype when the batch moves anything in; the owners' work
-- (io.compute); every update slice (and hook state piece) back, one
-- all-to-all-v per dtype. items: the batch's items to run this step (the
-- same on every rank); dtypes, moves_in, moves_out: static properties of
-- the batch.
function Router:run(items, dtypes, moves_in, moves_out, io)
  local me = self.me
  self:_move(items, dtypes, moves_in, io, false)
  local owned = {}
  for _, it in ipairs(items) do
    if it.owner == me then
      local state
      for _, a in ipairs(it.attached or {}) do
        state = state or {}
        state[a.record.key] = work_buffer(a, io)
      end
      owned[#owned + 1] = { item = it, input = work_buffer(it, io), state = state }
    end
  end
  io.compute(owned)
  self:_move(items, dtypes, moves_out, io, true)
end

-- The pieces of every item (and its attached hook state) in (out = false)
-- or out, one all-to-all-v per dtype when the batch moves anything.
function Router:_move(items, dtypes, moves, io, out)
  for _, dt in ipairs(dtypes) do
    local sends, recvs = lists(self.W)
    for _, it in ipairs(items) do
      if it.record.dtype == dt then
        route(it, self.me, io, sends, recvs, out)
        for _, a in ipairs(it.attached or {}) do route(a, self.me, io, sends, recvs, out) end
      end
    end
    if moves then self:exchange(dt, sends, recvs) end
  end
end

-- Static properties of a batch: its dtypes (sorted) and whether any of its
-- items moves data in or out. The same on every rank.
function R.describe_batch(batch)
  local seen, dtypes, moves_in, moves_out = {}, {}, false, false
  for _, it in ipairs(batch) do
    local dt = it.record.dtype
    if not seen[dt] then
      seen[dt] = true
      dtypes[#dtypes + 1] = dt
    end
    for _, x in ipairs({ it, unpack(it.attached or {}) }) do
      for _, s in ipairs(x.sources) do if s.rank ~= x.owner then moves_in = true end end
      for _, d in ipairs(x.dests) do if d.rank ~= x.owner then moves_out = true end end
    end
  end
  table.sort(dtypes)
  return dtypes, moves_in, moves_out
end

return R
