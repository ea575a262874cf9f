-- Split Newton-Schulz in the step (muon.ns_phase runs it after the routed
-- batches): a matrix the plan split (record.ns_group, muon.dist.plan) is
-- orthogonalized by the ranks of its group, each on its piece (columns of
-- a wide matrix, rows of a tall one: the blocks of the blocked iteration,
-- src/ns_split.c), by the C machine over a sub-communicator of the group
-- (made once per record, on first use, by every rank of the data
-- communicator in record order, and kept). Per step, for every split
-- record of the step at once: one all-to-all of the Newton-Schulz input
-- boxes from the state holders to the pieces, the groups' machines in
-- record order (a rank in several groups runs them one after the other:
-- the same global order on every rank, so none waits on a cycle), then one
-- all-to-all of the pieces of the update to every rank holding a box.
-- The bits are one process's (it runs the same blocked iteration). A
-- machine's failure (the same on every rank of its group) is the step's:
-- it is recorded (run:attempt) and the step commits nothing, on every rank.
--
--   local SP = require("muon.split_phase")
--   local sp = SP.new(router, mesh)     -- router: the step's (its exchange over the data communicator)
--   sp:run(records, io, run)            -- records: the step's split records, in plan order (the same on every rank)
--   sp:stats()                          -- the groups' communicators' counters, summed
--   sp:ns_stats(reset)                  -- { seconds, matrices } of the machines' runs (muon.step_stats)
--   sp:bytes()                          -- the machines' bytes, the pieces' bytes
local ffi = require("ffi")
local core = require("muon.core")
local D = require("muon.dist")
local T = require("muon.tensor")
local commlib = require("muon.comm")
local ns = require("muon.ns")

local C, check = core.C, core.check

local SP = {}
local Phase = {}
Phase.__index = Phase

function SP.new(router, mesh)
  return setmetatable({ router = router, comm = router.comm, me = router.me, mesh = mesh, groups = {},
    ran = { seconds = 0, matrices = 0 } }, Phase)
end

-- A record's group as this rank sees it (made on first use; collective
-- over the data communicator): { gq (0-based, or nil), sub (the group's
-- communicator, members only), machine, piece (this member's buffer) }.
function Phase:_group(r)
  local g = self.groups[r]
  if g then return g end
  local grp, me = r.ns_group, self.me
  local gq
  for i, q in ipairs(grp.ranks) do
    if q == me then gq = i - 1 end
  end
  local sub = self.comm:split(gq and 0 or 1, gq or me)
  g = { gq = gq }
  if gq then
    g.sub = sub
    local box = ffi.new("mu__split *[1]")
    local opts = ns.resolve(r.ns_opts or {})
    check(C.mu__split_new(T.dtype_code(r.dtype), r.shape[1], r.shape[2], opts.copts, grp.size, gq, box), "split ns")
    g.machine = ffi.gc(box[0], C.mu__split_free)
    g.piece = T.zeros(D.split_pieces(r)[gq + 1].len, r.dtype)
  else
    sub:free()
  end
  self.groups[r] = g
  return g
end

-- The pieces of one direction for the records of one dtype (in: holders'
-- boxes of the input to the members' pieces; out: the members' pieces of
-- the update to every holder of a box; D.split_moves), as
-- Router:exchange lists them.
function Phase:_pieces(recs, io, out)
  local W = self.comm:size()
  local sends, recvs = {}, {}
  for q = 1, W do sends[q], recvs[q] = {}, {} end
  for _, r in ipairs(recs) do
    local g = self:_group(r)
    D.split_moves(r, self.mesh, self.me, out, function(peer, box, send, within)
      -- (a holder's box, or this member's piece)
      local buf = within == r.mine and (out and io.dest(r) or io.source(r)) or g.piece
      local v = D.box_view(buf, box, within)
      if send then table.insert(sends[peer + 1], { n = D.numel(box.len), src = v })
      else table.insert(recvs[peer + 1], { n = D.numel(box.len), dst = v }) end
    end)
  end
  return sends, recvs
end

-- The step's split records (plan order, the same on every rank): inputs
-- in, every group's machine, updates out; per dtype.
function Phase:run(records, io, run)
  local by, order = {}, {}
  for _, r in ipairs(records) do
    if not by[r.dtype] then
      by[r.dtype] = {}
      order[#order + 1] = r.dtype
    end
    table.insert(by[r.dtype], r)
  end
  table.sort(order)
  for _, dt in ipairs(order) do
    local recs = by[dt]
    self.router:exchange(dt, self:_pieces(recs, io, false))
    for _, r in ipairs(recs) do
      local g = self.groups[r]
      if g.gq then
        -- (always run, also after a failure on this rank: the group's
        -- exchanges need every member; a failure is the same on all)
        local t0 = C.mu_clock()
        local rc = C.mu__split_run(g.machine, g.sub.ptr, g.piece, g.piece)
        self.ran.seconds = self.ran.seconds + (C.mu_clock() - t0)
        -- (one matrix, counted by the group's first rank)
        if g.gq == 0 then self.ran.matrices = self.ran.matrices + 1 end
        if rc ~= 0 then run:attempt(check, rc, ("split ns of '%s'"):format(r.name)) end
      end
    end
    self.router:exchange(dt, self:_pieces(recs, io, true))
  end
end

-- The counters of the groups' communicators, summed (muon.comm.stats).
function Phase:stats()
  local s = { calls = 0, bytes_sent = 0, bytes_recv = 0, seconds = 0, nonblocking = 0, done_before_wait = 0 }
  for _, g in pairs(self.groups) do
    if g.sub then
      for k, v in pairs(commlib.stats(g.sub)) do s[k] = s[k] + v end
    end
  end
  return s
end

-- The machines' runs since the last reset: { seconds (this rank's wall
-- time in them, exchanges included), matrices (those this rank's groups
-- orthogonalized, each counted on its group's first rank only) }.
function Phase:ns_stats(reset)
  local r = { seconds = self.ran.seconds, matrices = self.ran.matrices }
  if reset then self.ran.seconds, self.ran.matrices = 0, 0 end
  return r
end

-- Bytes held: the machines' buffers (Newton-Schulz workspace), and the
-- pieces (what the exchanges fill: routing).
local info = ffi.new("mu__split_info")
function Phase:bytes()
  local machines, pieces = 0, 0
  for _, g in pairs(self.groups) do
    if g.machine then
      check(C.mu__split_get_info(g.machine, info), "split ns")
      machines = machines + tonumber(info.workspace_bytes)
      pieces = pieces + g.piece:numel() * T.DTYPE_SIZES[g.piece:dtype()]
    end
  end
  return machines, pieces
end

return SP
