-- The router: moves NS inputs to the rank that orthogonalizes them and
-- updates back to every rank that holds a piece, batch by batch, as the
-- plan of muon.dist says (D.plan: items with an owner, sources and dests).
-- On one process (or for items whose owner holds everything) nothing
-- moves and the owner works in place on its own buffers.
--
--   local router = require("muon.router").new(data_comm)
--   router:run(batch_items, dtypes, moves_in, moves_out, io)
--     io.mine(record)      -> this rank's update buffer (its box) of the record
--     io.buffer(item)      -> the owner's buffer for the item's region (full)
--     io.compute(owned)    -> orthogonalize the owned items (list of { item, input })
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

-- Whether an item's owner computes in place in its own update buffer: it
-- is the only source and its box is the whole region.
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

-- Route one batch: NS input pieces to owners (one all-to-all-v per dtype
-- when the batch moves anything in), the owners' work (io.compute), then
-- every update slice to the ranks holding it (one all-to-all-v per dtype).
-- items: the batch's items to run this step (the same on every rank);
-- dtypes, moves_in, moves_out: static properties of the batch.
function Router:run(items, dtypes, moves_in, moves_out, io)
  local me, W = self.me, self.W
  -- Inputs to owners.
  for _, dt in ipairs(dtypes) do
    local sends, recvs = lists(W)
    for _, it in ipairs(items) do
      if it.record.dtype == dt then
        local o = it.owner
        if o == me and not R.in_place(it) then
          local buf = io.buffer(it)
          for _, s in ipairs(it.sources) do
            local dst = D.box_view(buf, s.box, it.region)
            if s.rank == me then dst:copy(io.mine(it.record))
            else table.insert(recvs[s.rank + 1], { n = D.numel(s.box.len), dst = dst }) end
          end
        elseif o ~= me then
          for _, s in ipairs(it.sources) do
            if s.rank == me then table.insert(sends[o + 1], { n = D.numel(s.box.len), src = io.mine(it.record) }) end
          end
        end
      end
    end
    if moves_in then self:exchange(dt, sends, recvs) end
  end
  -- The owners' work.
  local owned = {}
  for _, it in ipairs(items) do
    if it.owner == me then
      owned[#owned + 1] = { item = it, input = R.in_place(it) and io.mine(it.record) or io.buffer(it) }
    end
  end
  io.compute(owned)
  -- Update slices to every rank holding one.
  for _, dt in ipairs(dtypes) do
    local sends, recvs = lists(W)
    for _, it in ipairs(items) do
      if it.record.dtype == dt then
        local o = it.owner
        if o == me then
          local inplace = R.in_place(it)
          local buf = inplace and io.mine(it.record) or io.buffer(it)
          for _, d in ipairs(it.dests) do
            if d.rank == me then
              if not inplace then io.mine(it.record):copy(D.box_view(buf, d.box, it.region)) end
            else
              table.insert(sends[d.rank + 1], { n = D.numel(d.box.len), src = D.box_view(buf, d.box, it.region) })
            end
          end
        else
          for _, d in ipairs(it.dests) do
            if d.rank == me then table.insert(recvs[o + 1], { n = D.numel(d.box.len), dst = io.mine(it.record) }) end
          end
        end
      end
    end
    if moves_out then self:exchange(dt, sends, recvs) end
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
    for _, s in ipairs(it.sources) do if s.rank ~= it.owner then moves_in = true end end
    for _, d in ipairs(it.dests) do if d.rank ~= it.owner then moves_out = true end end
  end
  table.sort(dtypes)
  return dtypes, moves_in, moves_out
end

return R
