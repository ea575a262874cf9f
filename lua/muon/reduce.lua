-- Reductions inside hooks: ctx.allreduce(x, op) and ctx.global_norm(x) in
-- pre_ortho_fn, post_ortho_fn and post_update_fn (the hooks K.HOOKS marks
-- `reduces`).
--
-- What x is, and what they return:
--   ctx.allreduce(x, "sum")   the sum of the elements of the whole
--                             parameter-shaped tensor whose pieces are the
--                             x of every rank, rounded once to a Lua number
--                             (float64) from the exact sum
--   ctx.allreduce(x, "max")   its largest element (NaN if any is NaN)
--   ctx.allreduce(x, "min")   its smallest element (NaN if any is NaN)
--   ctx.global_norm(x)        sqrt of the exact sum of the squares of its
--                             elements (each float64 square rounded to
--                             float64 first; float32 squares are exact)
-- * post_update_fn(param, local_tensor, ctx) runs on every rank for every
--   parameter, with this rank's piece (its torch.chunk box, ctx.box; empty
--   where the rank holds none): x must have local_tensor's shape and holds
--   this rank's part of a tensor shaped like the parameter (the piece
--   itself, or anything computed from it elementwise). Replicas of a piece
--   count once (the rank that keeps its optimizer state contributes it).
-- * pre_ortho_fn and post_ortho_fn run where the parameter is
--   orthogonalized, on the whole parameter: the reduction is over x's own
--   elements (any tensor), on that rank alone.
-- One process computes the same over the whole parameter, and the results
-- have the same bits as on any mesh: the sum is exact before its one
-- rounding (src/xsum.c), so neither the order of the ranks nor where
-- torch.chunk cuts the pieces matters; max and min are exact anyway. Empty:
-- sum 0, max -inf, min +inf, norm 0.
--
-- On a mesh the calls are collectives over every rank. Every rank must
-- call them for a parameter the same number of times, in the same order,
-- with the same op (an empty piece takes part with nothing to add). Each
-- call gathers every rank's (call number, op, partial result): ranks that
-- differ (one more call, another op, a hook that raised or returned
-- early) fail the step on every rank with one message naming the
-- parameter, the hook and what each side did; no rank waits for a call
-- that never comes, and no further reduction of that step communicates.
-- ctx.allreduce and ctx.global_norm work only during the hook call whose
-- ctx they came with (Rd.during): one kept and called later (from another
-- hook, on the ranks that run that hook only) raises instead of entering
-- a collective the other ranks never join.
--
--   local Rd = require("muon.reduce")
--   local f = Rd.whole("post_ortho_fn")           -- { allreduce, global_norm } on one rank
--   Rd.during(f, hook_fn, ...)                     -- hook_fn(...) with f callable while it runs
--   local sess = Rd.session(comm)                  -- a mesh's post_update_fn calls of one step
--   sess:reset()                                   -- the next step's (buffers kept)
--   local f2 = sess:reducer("post_update_fn", i, name, shape, counts)
--   sess:finish(failed)                            -- the last collective; raises on a mismatch
--   local acc = Rd.squares({ g1, g2 })             -- exact sum of squares of tensors (one C call)
--   Rd.sqrt_value(Rd.merge_all(comm, acc))         -- merged over comm's ranks (collective): a global norm
--[[ reference muon.reduce
    The hooks' ctx.allreduce(x, "sum" | "max" | "min") and
    ctx.global_norm(x); their semantics are in the comment above.
muon.reduce.whole(hook, shape)
    { allreduce = function(x, op), global_norm = function(x) } for a hook
    that holds the whole parameter (pre_ortho_fn, post_ortho_fn; and
    post_update_fn on one process, where x must have shape).
muon.reduce.during(f, fn, ...)
    fn(...) with the reductions f (of whole or Session:reducer) callable
    while it runs, and only then: a call before or after raises EINVAL
    naming the hook. Returns fn's results; fn's error is raised as is.
muon.reduce.squares(xs)
    An exact accumulator (mu_xsum) of the squares of every element of the
    tensors in the list xs (one C call: mu_xsum_add_tensors): this rank's
    part of a global norm.
muon.reduce.merge_all(comm, acc)
    The accumulators of every rank of comm merged (a collective): the same
    exact total on every rank, whatever the order; acc itself on one
    process.
muon.reduce.sqrt_value(acc)
    The square root of the accumulator's sum, rounded once: a global norm.
muon.reduce.session(comm)
    The reductions of one step's post_update_fn calls over comm (a
    collective: every rank makes one session per step and finishes it
    once).
Session:reset()
    The same session for the next step (buffers kept).
Session:reducer(hook, idx, name, shape, counts)
    { allreduce, global_norm } of hook on parameter number idx (the same
    numbering on every rank) named name: x has this rank's piece's shape;
    counts: whether this rank contributes its piece (replicas count once).
Session:finish(failed)
    The session's last collective (failed: a hook of this rank raised);
    raises on every rank, naming the parameter, the hook and what each
    side did, when the ranks' calls differed.
]]
local ffi = require("ffi")
local core = require("muon.core")
local T = require("muon.tensor")
local E = require("muon.errors")

local C, check = core.C, core.check

local Rd = {}

local OPS = { sum = 1, max = 2, min = 3 }
-- The reductions whose hook call is running (Rd.during); weak keys.
local LIVE = setmetatable({}, { __mode = "k" })
local OP_NAME = { "sum", "max", "min", "norm" }
local NORM = 4
local LIMBS = C.MU_XSUM_LIMBS
-- A call's message: kind (1 call, 2 done), parameter index, call number,
-- op; nan, +inf, -inf, max, min; the normalized limbs.
local HEAD = 9
local MSG = HEAD + LIMBS

local function new_acc()
  local s = ffi.new("mu_xsum")
  C.mu_xsum_zero(s)
  return s
end

local function add(s, x, squares)
  check(C.mu_xsum_add_tensor(s, x, squares and 1 or 0), "reduce")
end

-- The op's value of an accumulator (normalized by mu_xsum_value).
local function value(s, op)
  if op == NORM then return math.sqrt(C.mu_xsum_value(s)) end
  if op == OPS.sum then return C.mu_xsum_value(s) end
  if s.nan > 0 then return 0 / 0 end
  if op == OPS.max then return s.max end
  return s.min
end

local shape_str = T.shape_string

-- An accumulator as doubles at sp[0 ..]: nan, +inf, -inf, max, min, then
-- the normalized limbs (each exact as a double); and back.
local PACKED = 5 + LIMBS
local function pack(acc, sp)
  C.mu_xsum_normalize(acc)
  sp[0], sp[1], sp[2], sp[3], sp[4] = tonumber(acc.nan), tonumber(acc.pinf), tonumber(acc.ninf), acc.max, acc.min
  for i = 0, LIMBS - 1 do sp[5 + i] = tonumber(acc.limb[i]) end
end

local function unpack_into(part, rp)
  C.mu_xsum_zero(part)
  part.nan, part.pinf, part.ninf, part.max, part.min = rp[0], rp[1], rp[2], rp[3], rp[4]
  for i = 0, LIMBS - 1 do part.limb[i] = rp[5 + i] end
end

-- The accumulators of every rank of comm merged (a collective; every rank
-- gets the same exact total, whatever the rank order): acc itself on one
-- process.
function Rd.merge_all(comm, acc)
  local W = comm:size()
  if W == 1 then return acc end
  local send, recv = T.zeros({ PACKED }, "float64"), T.zeros({ W * PACKED }, "float64")
  local counts = {}
  for q = 1, W do counts[q] = PACKED end
  pack(acc, ffi.cast("double *", send.data))
  comm:allgatherv(send, recv, counts)
  local rp = ffi.cast("double *", recv.data)
  local total, part = new_acc(), ffi.new("mu_xsum")
  for q = 0, W - 1 do
    unpack_into(part, rp + q * PACKED)
    C.mu_xsum_merge(total, part)
  end
  return total
end

-- fn(...) with the reductions f callable while it runs (see the top).
function Rd.during(f, fn, ...)
  LIVE[f] = true
  local r = { pcall(fn, ...) }
  LIVE[f] = nil
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, table.maxn(r))
end

-- The exact sum of the squares of every element of the tensors xs (a
-- list, any float dtypes; one C call) as an accumulator: this rank's part
-- of a global norm, for merge_all and sqrt_value.
function Rd.squares(xs)
  local s = new_acc()
  local n = #xs
  if n > 0 then
    local arr = ffi.new("mu_tensor *[?]", n)
    for i = 1, n do arr[i - 1] = xs[i] end
    check(C.mu_xsum_add_tensors(s, n, arr, 1), "reduce")
  end
  return s
end

-- The square root of an accumulator's sum (a norm from squares).
function Rd.sqrt_value(acc) return value(acc, NORM) end

-- Check a call's arguments; returns the op code. live: whether the hook
-- call these reductions were given to is running (Rd.during).
local function check_args(fname, hook, x, op, shape, live)
  if not live then
    E.blame(E.EINVAL, "%s: ctx.%s called outside the hook call whose ctx it came with (a ctx kept from an "
      .. "earlier call?): reductions work only while their hook runs", hook, fname)
  end
  if not T.is_tensor(x) then
    E.blame(E.EINVAL, "%s: ctx.%s: x must be a tensor, got %s", hook, fname, type(x))
  end
  if fname == "global_norm" then
    if op ~= nil then E.blame(E.EINVAL, "%s: ctx.global_norm takes one argument (x)", hook) end
  end
  local code = fname == "global_norm" and NORM or OPS[op]
  if not code then
    E.blame(E.EINVAL, "%s: ctx.allreduce: op must be 'sum', 'max' or 'min', got %s", hook,
      type(op) == "string" and ("'" .. op .. "'") or tostring(op))
  end
  if shape then
    local xs = x:size()
    local same = #xs == #shape
    for d = 1, #shape do same = same and xs[d] == shape[d] end
    if not same then
      E.blame(E.ESHAPE, "%s: ctx.%s: x must have the shape of this rank's piece of the parameter, %s "
        .. "(local_tensor's), got %s", hook, fname, shape_str(shape), shape_str(xs))
    end
  end
  return code
end

-- The reductions of a hook that holds the whole parameter (pre_ortho_fn,
-- post_ortho_fn; and post_update_fn on one process, where x must have the
-- parameter's shape: shape).
function Rd.whole(hook, shape)
  local f = {}
  function f.allreduce(x, op)
    local code = check_args("allreduce", hook, x, op, shape, LIVE[f])
    local s = new_acc()
    add(s, x, false)
    return value(s, code)
  end
  function f.global_norm(x, extra)
    check_args("global_norm", hook, x, extra, shape, LIVE[f])
    local s = new_acc()
    add(s, x, true)
    return value(s, NORM)
  end
  return f
end

------------------------------------------------------------ on a mesh

local Session = {}
Session.__index = Session

-- The reductions of one step's post_update_fn calls over comm (collective:
-- every rank makes one session per step and calls finish once).
function Rd.session(comm)
  local W = comm:size()
  return setmetatable({ comm = comm, W = W, me = comm:rank(), broken = nil,
    send = T.zeros({ MSG }, "float64"), recv = T.zeros({ W * MSG }, "float64"),
    counts = (function() local c = {} for q = 1, W do c[q] = MSG end return c end)(),
    names = {}, hooks = {}, calls = 0 }, Session)
end

-- The same session for the next step (its buffers kept).
function Session:reset()
  self.broken, self.names, self.hooks = nil, {}, {}
  return self
end

-- What message m (a gathered row) says a rank did, for errors.
function Session:_describe(row)
  local kind, idx, seq, op = row[1], row[2], row[3], row[4]
  if kind == 2 then return "had returned from its hooks" end
  if kind == 3 then return "had stopped: one of its hooks raised an error" end
  local fname = op == NORM and "ctx.global_norm" or ("ctx.allreduce(x, '" .. OP_NAME[op] .. "')")
  return ("made call %d for parameter '%s' (%s): %s"):format(seq, self.names[idx] or "?", self.hooks[idx] or "?", fname)
end

-- One collective: this rank's message (kind, idx, seq, op, accumulator or
-- nil); returns the merged accumulator when every rank sent the same
-- header, else marks the session broken and raises (the same message on
-- every rank).
function Session:_exchange(kind, idx, seq, op, acc)
  local sp = ffi.cast("double *", self.send.data)
  local head = { kind, idx, seq, op }
  for i = 1, 4 do sp[i - 1] = head[i] end
  if acc then
    pack(acc, sp + 4)
  else
    for i = 4, MSG - 1 do sp[i] = 0 end
    sp[7], sp[8] = -math.huge, math.huge
  end
  self.comm:allgatherv(self.send, self.recv, self.counts)
  local rp = ffi.cast("double *", self.recv.data)
  local first
  local function kind_of(q) return rp[q * MSG] == 3 and 2 or rp[q * MSG] end -- (stopped = done)
  for q = 1, self.W - 1 do
    if kind_of(q) ~= kind_of(0) then first = first or q end
    for i = 1, 3 do
      if rp[q * MSG + i] ~= rp[i] then first = first or q end
    end
  end
  if first then
    local function row(q) return { rp[q * MSG], rp[q * MSG + 1], rp[q * MSG + 2], rp[q * MSG + 3] } end
    self.broken = E.new(E.EINVAL, ("reductions in hooks differ across ranks: rank 0 %s, rank %d %s (every rank "
      .. "runs post_update_fn for every parameter, an empty piece too, and must call ctx.allreduce / "
      .. "ctx.global_norm for it as often as the others, in the same order, with the same op)"):format(
      self:_describe(row(0)), first, self:_describe(row(first))))
    error(self.broken, 0)
  end
  if kind ~= 1 then return nil end
  local total = new_acc()
  local part = ffi.new("mu_xsum")
  for q = 0, self.W - 1 do
    unpack_into(part, rp + q * MSG + 4)
    C.mu_xsum_merge(total, part)
  end
  return total
end

-- The reductions of the hook `hook` on parameter number idx (the same
-- numbering on every rank) named name: x of shape `shape` (this rank's
-- piece); counts: this rank contributes its piece (it keeps the piece's
-- state; replicas count once).
function Session:reducer(hook, idx, name, shape, counts)
  self.names[idx], self.hooks[idx] = name, hook
  local seq, f = 0, nil
  local function call(fname, x, op)
    if self.broken then
      E.raise(E.EINVAL, "%s: ctx.%s after reductions failed across ranks in this step: %s", hook, fname,
        E.message(self.broken))
    end
    local code = check_args(fname, hook, x, op, shape, LIVE[f])
    seq = seq + 1
    local acc = new_acc()
    if counts then add(acc, x, code == NORM) end
    return value(self:_exchange(1, idx, seq, code, acc), code)
  end
  f = {
    allreduce = function(x, op) return call("allreduce", x, op) end,
    global_norm = function(x, extra) return call("global_norm", x, extra) end,
  }
  return f
end

-- The session's last collective (every rank, once, after its hooks;
-- failed: one of them raised); raises when the ranks' calls differed.
function Session:finish(failed)
  if self.broken then error(self.broken, 0) end
  self:_exchange(failed and 3 or 2, 0, 0, 0, nil)
end

return Rd
