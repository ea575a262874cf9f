-- The router: moves NS inputs to the rank that orthogonalizes them and
-- updates back to every rank that holds a piece, batch by batch, as the
-- plan of muon.dist says (D.plan: items with an owner, sources and dests,
-- and hook state items attached to them). On one process (or for items
-- whose owner holds everything) nothing moves and the owner works in place
-- on its own buffers.
--
--   local router = require("muon.router").new(data_comm)
--   router:inputs(jobs, io)        -- record -> where its NS input goes out from (before it is computed)
--   router:run_batches(jobs, io)   -- jobs: { records, items, dtypes, moves_in, moves_out, group },
--                                  -- communication overlapped with the owners' work
--     io.source(record)    -> what this rank sends for the record (its box):
--                             the NS input, or a hook state's current value
--     io.direct(record)    -> true when the NS input was written where
--                             inputs() said (nothing to copy), else nil
--     io.dest(record)      -> where this rank receives it back (the update,
--                             or the hook state's next value)
--     io.buffer(item)      -> the owner's buffer for an item's region
--     io.compute(owned, wave) -> the owners' work on { item, input, state = { key -> buffer } }
--   router:exchange(dtype, sends, recvs)   -- one blocking all-to-all-v of pieces
--   router.inputs_placed, router.inputs_copied -- NS input elements that went out (or into this
--                                  -- rank's region buffer) from where the kinds wrote them / by a copy
-- The inputs' send buffers are the waves' own, laid out before the step's
-- kinds compute the inputs, so that they write them there: a rank's NS
-- input leaves with no copy (its box in a peer's send segment, or in its
-- own region buffer when it owns the item).
local T = require("muon.tensor")
local D = require("muon.dist")
local ns = require("muon.ns")

local R = {}
local Router = {}
Router.__index = Router

function R.new(comm)
  return setmetatable({ comm = comm, W = comm:size(), me = comm:rank(), bufs = {}, posted = 0, inputs_placed = 0,
    inputs_copied = 0 }, Router)
end

-- Bytes held by the staging buffers.
function Router:scratch_bytes()
  local n = 0
  for _, b in pairs(self.bufs) do n = n + b:numel() * T.DTYPE_SIZES[b:dtype()] end
  return n
end

-- A staging buffer of at least n elements, kept across steps under key
-- (grown when needed): the blocking exchange uses "<dtype>/send" and
-- "<dtype>/recv", the pipeline's receives four slots (in / out, two
-- each: at most four exchanges per dtype in flight), its input sends one
-- buffer per wave of the step (R.inputs lays them out) and its update
-- sends two slots.
function Router:_staging(key, dtype, n)
  local b = self.bufs[key]
  if not b or b:numel() < n then
    b = T.zeros({ math.max(n, b and b:numel() or 1, 1) }, dtype)
    self.bufs[key] = b
  end
  return b
end

-- Counts per peer of pieces (lists per peer of { n, ... }) and their total.
local function counts(W, lists)
  local c, tot = {}, 0
  for q = 1, W do
    local n = 0
    for _, x in ipairs(lists[q]) do n = n + x.n end
    c[q], tot = n, tot + n
  end
  return c, tot
end

-- Counts per peer and the packed send buffer of an all-to-all-v (staging
-- keys sk, rk). The pieces marked direct are in the send buffer already.
function Router:_pack(dtype, sk, rk, sends, recvs)
  local W = self.W
  local scount, stot = counts(W, sends)
  local rcount, rtot = counts(W, recvs)
  local sbuf, rbuf = self:_staging(sk, dtype, stot), self:_staging(rk, dtype, rtot)
  local off = 0
  for q = 1, W do
    for _, x in ipairs(sends[q]) do
      if not x.direct then sbuf:narrow(1, off + 1, x.n):view(x.src:size()):copy(x.src) end
      off = off + x.n
    end
  end
  return sbuf, scount, rbuf, rcount
end

local function unpack_recv(W, rbuf, recvs)
  local off = 0
  for q = 1, W do
    for _, x in ipairs(recvs[q]) do
      x.dst:copy(rbuf:narrow(1, off + 1, x.n):view(x.dst:size()))
      off = off + x.n
    end
  end
end

-- One all-to-all-v over the data communicator. sends[q+1] = list of
-- { n = elements, src = tensor }; recvs[q+1] = list of { n, dst = tensor }.
function Router:exchange(dtype, sends, recvs)
  local sbuf, scount, rbuf, rcount = self:_pack(dtype, dtype .. "/send", dtype .. "/recv", sends, recvs)
  self.comm:alltoallv(sbuf, scount, rbuf, rcount)
  unpack_recv(self.W, rbuf, recvs)
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

-- Count n elements of a record's NS input in: placed by its kind, or copied.
local function count_input(self, r, n, placed)
  if r.parent then return end
  if placed then self.inputs_placed = self.inputs_placed + n
  else self.inputs_copied = self.inputs_copied + n end
end

-- One item's pieces on their way in (to the owner) or out (back). This
-- rank's own piece of an item it owns is copied at once (in: from the
-- source, unless io.direct says it is there; out: to the dest), or, with
-- locals (a list: inputs' dry run), listed as { v = its view, record }.
local function route(self, it, io, sends, recvs, out, locals)
  local me = self.me
  local o = it.owner
  local pieces = out and D.dests(it) or it.sources
  local r = it.record
  if o == me then
    local inplace = R.in_place(it)
    local buf = inplace and io.dest(r) or io.buffer(it)
    for _, p in ipairs(pieces) do
      if p.rank ~= me or not inplace then
        local v = D.box_view(buf, p.box, it.region)
        if p.rank == me then
          if out then io.dest(r):copy(v)
          elseif locals then locals[#locals + 1] = { v = v, record = r }
          else
            local placed = io.direct(r)
            if not placed then v:copy(io.source(r)) end
            count_input(self, r, D.numel(p.box.len), placed)
          end
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
        local n = D.numel(p.box.len)
        if out then table.insert(recvs[o + 1], { n = n, dst = io.dest(r) })
        else
          local placed = io.direct(r)
          -- (laying out the inputs, hook state has no source yet: it is copied later)
          local src = not (locals and r.parent) and io.source(r) or nil
          table.insert(sends[o + 1], { n = n, src = src, record = r, direct = placed })
          if not locals then count_input(self, r, n, placed) end
        end
      end
    end
  end
end

-- The pieces of a batch's items (and their attached hook state) in
-- (out = false) or out, per dtype (locals: see route).
local function pieces(self, items, dt, io, out, locals)
  local sends, recvs = lists(self.W)
  for _, it in ipairs(items) do
    if it.record.dtype == dt then
      route(self, it, io, sends, recvs, out, locals)
      for _, a in ipairs(it.attached or {}) do route(self, a, io, sends, recvs, out, locals) end
    end
  end
  return sends, recvs
end

-- The owners' work list of a batch (after its inputs arrived).
local function owned_of(items, me, io)
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
  return owned
end

-- The staging key of wave k's input sends of dtype dt (one per wave: the
-- kinds write the inputs there before the exchanges start).
local function input_key(k, dt) return dt .. "/in-send" .. k end

-- Where the NS inputs of this step's batches (jobs, as run_batches gets
-- them) go out from, laid out before they are computed: record -> a
-- tensor of its box's shape, for the records whose whole box goes to one
-- owner as one piece (a segment of the wave's send buffer) or into its
-- own region buffer as a contiguous view; the others go out from
-- io.source as before. Hook state is always copied. Writing there and
-- saying so through io.direct saves the copy.
function Router:inputs(jobs, io)
  local K = self.waves or R.WAVES
  local out, seen = {}, {}
  local function put(r, t)
    if r.parent then return end
    if seen[r] then out[r] = nil else out[r] = t end
    seen[r] = true
  end
  local k = 0
  for _, job in ipairs(jobs) do
    for _, w in ipairs(R.waves(job, K)) do
      k = k + 1
      for _, dt in ipairs(w.dtypes) do
        local locals = {}
        local sends = pieces(self, w.items, dt, io, false, locals)
        if w.moves_in then
          local _, stot = counts(self.W, sends)
          local buf, off = self:_staging(input_key(k, dt), dt, stot), 0
          for q = 1, self.W do
            for _, x in ipairs(sends[q]) do
              if x.record and x.src and x.n == x.src:numel() then put(x.record, buf:narrow(1, off + 1, x.n):view(x.src:size())) end
              off = off + x.n
            end
          end
        end
        for _, l in ipairs(locals) do
          if l.v:is_contiguous() then put(l.record, l.v) end
        end
      end
    end
  end
  return out
end

-- Post a batch's exchanges of one direction (non-blocking; in: wave k's
-- own send buffer, a receive slot; out: send and receive slots `slot`);
-- local pieces are copied now. Returns what _finish completes.
function Router:_post(job, out, slot, io, k)
  local pending = { n = 0, out = out }
  for _, dt in ipairs(job.dtypes) do
    local sends, recvs = pieces(self, job.items, dt, io, out)
    if out and job.moves_out or not out and job.moves_in then
      local sk = out and (dt .. slot .. "/send") or input_key(k, dt)
      local sbuf, scount, rbuf, rcount = self:_pack(dt, sk, dt .. slot .. "/recv", sends, recvs)
      pending.n = pending.n + 1
      pending[pending.n] = { q = self.comm:ialltoallv(sbuf, scount, rbuf, rcount), rbuf = rbuf, recvs = recvs }
      self.posted = self.posted + 1
    end
  end
  return pending
end

-- Wait for posted exchanges and unpack what arrived.
function Router:_finish(pending)
  if not pending then return end
  for i = 1, pending.n do
    local p = pending[i]
    if p.q then
      local q = p.q
      p.q = nil
      q:wait()
      unpack_recv(self.W, p.rbuf, p.recvs)
    end
  end
end

-- Every posted exchange completes, even on an error path (MPI cannot
-- cancel a collective, and the peers take part in it).
local function drain(list)
  for _, pending in pairs(list) do
    for i = 1, pending.n do
      local q = pending[i].q
      if q then
        pending[i].q = nil
        pcall(q.wait, q)
      end
    end
  end
end

-- How many waves a batch is cut into for the pipeline (R.waves).
R.WAVES = 2

-- Cut a batch into up to k waves to pipeline: its records, in order, go
-- to wave 1 + floor(k * (midpoint of their cost) / the batch's total cost)
-- (cost: NS flops, or elements), so every wave holds about 1/k of the
-- batch's work; an item goes with its record. The same waves on every rank
-- (they depend on the records only); Newton-Schulz results do not depend
-- on how items are batched. Cached per records list (the plan's batch when
-- every record steps).
local wave_cache = setmetatable({}, { __mode = "k" })
function R.waves(job, k)
  local recs = job.records
  local c = wave_cache[recs]
  if c and c.k == k and c.items == job.items then return c.waves end
  local cost, total = {}, 0
  for i, r in ipairs(recs) do
    cost[i] = r.ns and ns.shape_cost(r.shape, r.nd_mode, r.ns_opts) or r.numel
    total = total + cost[i]
  end
  local wave_of, before = {}, 0
  for i, r in ipairs(recs) do
    wave_of[r] = total > 0 and math.min(k, 1 + math.floor(k * (before + cost[i] / 2) / total)) or 1
    before = before + cost[i]
  end
  local by = {}
  for w = 1, k do by[w] = { records = {}, items = {} } end
  for _, r in ipairs(recs) do table.insert(by[wave_of[r]].records, r) end
  for _, it in ipairs(job.items) do table.insert(by[wave_of[it.record]].items, it) end
  local waves = {}
  for w = 1, k do
    if #by[w].records > 0 then
      local dtypes, moves_in, moves_out = R.describe_records(by[w].records)
      waves[#waves + 1] = { records = by[w].records, items = by[w].items, dtypes = dtypes, moves_in = moves_in,
        moves_out = moves_out, group = job.group }
    end
  end
  wave_cache[recs] = { k = k, items = job.items, waves = waves }
  return waves
end

-- Route a list of batches (jobs: { records, items (this rank's), dtypes, moves_in, moves_out },
-- the same on every rank), overlapping communication with the owners'
-- work. Each batch is cut into waves (R.waves); the inputs of the next
-- `ahead` waves are posted before a wave computes, and a wave's updates
-- are waited for `lag` waves later, so a rank runs its waves back to back
-- as long as their inputs have arrived (a background thread in muon.comm
-- moves them) and ranks that finish early sleep in the final waits.
-- io.compute(owned, wave) is called once per wave, in order. Every rank
-- posts the same collectives in the same order; staging: ahead + 1 input
-- and lag + 1 output slots per dtype, each about a wave's exchange (with
-- the defaults, about one batch's inputs and one batch's updates).
function Router:run_batches(jobs, io)
  local K = self.waves or R.WAVES
  local A, L = self.ahead or K - 1, self.lag or K - 1
  local list = {}
  for _, job in ipairs(jobs) do
    for _, w in ipairs(R.waves(job, K)) do list[#list + 1] = w end
  end
  local me, n = self.me, #list
  local ins, outs = {}, {}
  local function post_in(k)
    if k <= n then ins[k] = self:_post(list[k], false, "/in" .. (k % (A + 1)), io, k) end
  end
  local ok, err = pcall(function()
    for k = 1, A + 1 do post_in(k) end
    for k = 1, n do
      local wave = list[k]
      self:_finish(ins[k])
      ins[k] = nil
      io.compute(owned_of(wave.items, me, io), wave)
      outs[k] = self:_post(wave, true, "/out" .. (k % (L + 1)), io)
      post_in(k + A + 1)
      if k > L then
        self:_finish(outs[k - L])
        outs[k - L] = nil
      end
    end
    for k = math.max(1, n - L + 1), n do
      self:_finish(outs[k])
      outs[k] = nil
    end
  end)
  if not ok then
    drain(ins)
    drain(outs)
    error(err, 0)
  end
end

-- Static properties of a list of records (muon.dist's plan records): their
-- dtypes (sorted) and whether any of their items moves data in or out. The
-- same on every rank.
function R.describe_records(recs)
  local seen, dtypes, moves_in, moves_out = {}, {}, false, false
  for _, r in ipairs(recs) do
    if not seen[r.dtype] then
      seen[r.dtype] = true
      dtypes[#dtypes + 1] = r.dtype
    end
    moves_in = moves_in or r.moves_in
    moves_out = moves_out or r.moves_out
  end
  table.sort(dtypes)
  return dtypes, moves_in, moves_out
end

return R
