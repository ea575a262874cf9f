-- Gradients averaged (or summed) over replicas, in place, before a step
-- (muon.step's Stepper:reduce_grads; eng:reduce_grads): every gradient
-- becomes the mean or sum of that gradient over the ranks that hold the
-- same box (the replicate axes of its placement). Every replica gets the
-- same bits: each box is cut into as many flat pieces as it has replicas;
-- the replica of class k adds piece k of every replica in rank order
-- (g_0 + g_1 + ... left to right, then / n for "mean") and sends the
-- result back to the others (a reduce-scatter and an all-gather: two
-- all-to-all-v per dtype on the data communicator, whose counters show
-- them). A parameter whose grad is missing on some ranks that hold
-- elements of it fails on every rank, naming it and those ranks, before
-- any grad changes.
--
--   local GR = require("muon.grad_reduce")
--   local gr = GR.new(mesh, ctrl, router)  -- muon.dist mesh; control communicator; muon.router on the data one
--   gr:run(records, op)                    -- records: the plan's, registration order; op "mean" | "sum"
--                                          --> the number of gradients reduced on this rank (collective)
local T = require("muon.tensor")
local D = require("muon.dist")
local E = require("muon.errors")

local GR = {}
local Reducer = {}
Reducer.__index = Reducer

function GR.new(mesh, ctrl, router)
  return setmetatable({ mesh = mesh, ctrl = ctrl, router = router, W = ctrl:size(), me = ctrl:rank(),
    bufs = setmetatable({}, { __mode = "k" }) }, Reducer)
end

-- Which gradients every holder has (one all-reduce): a parameter some
-- holder has a grad for and another has none fails on every rank naming
-- it and the ranks without. Returns the reduced flags (red[i] == 1: some
-- rank has a grad for records[i]).
function Reducer:_agree_present(records)
  local n = #records
  local vec = {}
  for i, r in ipairs(records) do
    local has = r.param.grad ~= nil and 1 or 0
    local empty = r.mine_n == 0 -- (ranks with an empty box count as both)
    vec[i], vec[n + i] = empty and 0 or has, empty and -1 or -has
  end
  local red = self.ctrl:allreduce(vec, "max")
  local bad
  for i = 1, n do
    if red[i] == 1 and -red[n + i] == 0 then bad = i break end
  end
  if bad then
    local flags = {}
    for q = 1, self.W do flags[q] = 0 end
    if records[bad].mine_n > 0 and records[bad].param.grad == nil then flags[self.me + 1] = 1 end
    flags = self.ctrl:allreduce(flags, "max")
    local ranks = {}
    for q = 1, self.W do if flags[q] == 1 then ranks[#ranks + 1] = q - 1 end end
    E.raise(E.EINVAL, "reduce_grads: parameter '%s' has no grad on rank%s %s and a grad on others holding the same box",
      records[bad].name, #ranks == 1 and "" or "s", table.concat(ranks, ", "))
  end
  return red
end

-- What this rank reduces: per gradient its flat view, its class k among
-- the replicas, the replicas' ranks, its piece and a buffer for the
-- others' pieces; and the dtypes, sorted (the same on every rank).
function Reducer:_todo(records, red)
  local mesh = self.mesh
  local mc = mesh:coords(self.me)
  local todo, dtypes, seen = {}, {}, {}
  for i, r in ipairs(records) do
    if red[i] == 1 and r.nrep > 1 and r.mine_n > 0 then
      local g = r.param.grad
      local flat = g:is_contiguous() and g:view({ r.mine_n }) or g:contiguous():view({ r.mine_n })
      local k = D.class_of(r, mesh, mc)
      local peers, cc = {}, {}
      for a = 1, #mc do cc[a] = mc[a] end
      for c = 0, r.nrep - 1 do
        D.set_class(r, mesh, c, cc)
        peers[c] = mesh:rank_of(cc)
      end
      local rs, rl = D.chunk(r.mine_n, r.nrep, k)
      local buf = self.bufs[r]
      if buf == nil or buf:size(1) ~= r.nrep or buf:size(2) ~= math.max(rl, 1) or buf:dtype() ~= g:dtype() then
        buf = T.zeros({ r.nrep, math.max(rl, 1) }, g:dtype())
        self.bufs[r] = buf
      end
      todo[#todo + 1] = { r = r, g = g, flat = flat, k = k, peers = peers, rs = rs, rl = rl, buf = buf }
      local dt = g:dtype()
      if not seen[dt] then
        seen[dt] = true
        dtypes[#dtypes + 1] = dt
      end
    end
  end
  table.sort(dtypes)
  return todo, dtypes
end

function Reducer:_lists()
  local s, r = {}, {}
  for q = 1, self.W do s[q], r[q] = {}, {} end
  return s, r
end

-- Reduce-scatter, sum in rank order, all-gather: the gradients of one dtype.
function Reducer:_reduce_dtype(todo, dt, op)
  -- Reduce-scatter: piece c of this box to the replica of class c.
  local sends, recvs = self:_lists()
  for _, t in ipairs(todo) do
    if t.g:dtype() == dt then
      for c = 0, t.r.nrep - 1 do
        local s, l = D.chunk(t.r.mine_n, t.r.nrep, c)
        if c ~= t.k and l > 0 then
          table.insert(sends[t.peers[c] + 1], { n = l, src = t.flat:narrow(1, s + 1, l) })
        end
        if c ~= t.k and t.rl > 0 then
          table.insert(recvs[t.peers[c] + 1], { n = t.rl, dst = t.buf:select(1, c + 1):narrow(1, 1, t.rl) })
        end
      end
    end
  end
  self.router:exchange(dt, sends, recvs)
  -- Sum in rank order (classes are in rank order), then the all-gather.
  sends, recvs = self:_lists()
  for _, t in ipairs(todo) do
    if t.g:dtype() == dt then
      if t.rl > 0 then
        local mine = t.flat:narrow(1, t.rs + 1, t.rl)
        local function piece(c) return c == t.k and mine or t.buf:select(1, c + 1):narrow(1, 1, t.rl) end
        local sum = t.buf:select(1, t.k + 1):narrow(1, 1, t.rl) -- (row k receives nothing)
        sum:copy(piece(0))
        for c = 1, t.r.nrep - 1 do sum:add_(piece(c)) end
        if op == "mean" then sum:div_(t.r.nrep) end
        mine:copy(sum)
      end
      for c = 0, t.r.nrep - 1 do
        local s, l = D.chunk(t.r.mine_n, t.r.nrep, c)
        if c ~= t.k and t.rl > 0 then
          table.insert(sends[t.peers[c] + 1], { n = t.rl, src = t.flat:narrow(1, t.rs + 1, t.rl) })
        end
        if c ~= t.k and l > 0 then
          table.insert(recvs[t.peers[c] + 1], { n = l, dst = t.flat:narrow(1, s + 1, l) })
        end
      end
    end
  end
  self.router:exchange(dt, sends, recvs)
  for _, t in ipairs(todo) do
    if t.g:dtype() == dt and not t.g:is_contiguous() then t.g:copy(t.flat:view(t.g:size())) end
  end
end

-- Reduce every gradient of records (collective); returns how many this
-- rank reduced.
function Reducer:run(records, op)
  local red = self:_agree_present(records)
  local todo, dtypes = self:_todo(records, red)
  for _, dt in ipairs(dtypes) do self:_reduce_dtype(todo, dt, op) end
  return #todo
end

return GR
