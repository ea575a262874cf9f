-- Communicators (src/comm.c) for distributed steps, through the FFI.
--
--   local comm = require("muon.comm")
--   local w = comm.world()            -- MPI_COMM_WORLD (MPI initialized lazily)
--   w:rank(), w:size()                -- 0-based rank like MPI
--   local sub = w:split(color, key)
--   w:alltoallv(send, sendcounts, recv, recvcounts)   -- tensors or typed buffers, Lua count tables
--   w:allgatherv(send, recv, recvcounts)
--   w:bcast(tensor, root), w:ibcast(tensor, root):wait()
--   w:allreduce({...}, "sum"|"max"|"min", "i64"|"f64") -> table
--   w:barrier()
--   local q = w:ialltoallv(send, sendcounts, recv, recvcounts)  -- posted now
--   q:test() -> done?, q:wait()       -- every request must be waited for
--   comm.stats(w) / w:stats() -> { calls=, bytes_sent=, bytes_recv=, seconds=,
--                                  nonblocking=, done_before_wait= }
--   comm.finalize(), comm.abort(code), comm.have_mpi(), comm.world_size()
--   comm.virtual(4096, 7)             -- rank 7 of 4096 for a dry run: moves no data
--[[ reference muon.comm
    Communicators (src/comm.c). Ranks are 0-based, as in MPI. Without MPI
    (or a library built without it) every communicator has size 1 and the
    collectives are local copies. A buffer argument is a contiguous muon
    tensor or { ptr = cdata, dtype = "float32" | "float64", n = count };
    counts are Lua lists per peer (index rank + 1), displacements packed.
muon.comm.world()
    MPI_COMM_WORLD (initializes MPI on first use).
muon.comm.self()
    This process alone (size 1).
muon.comm.from_handle(ptr)
    Wrap a caller's MPI_Comm (ptr: a pointer to it, cdata or
    lightuserdata); the caller keeps it alive.
muon.comm.have_mpi()
    Whether the library was built with MPI.
muon.comm.world_size()
muon.comm.world_rank()
    The world's size and this process's rank without initializing MPI
    (from MPI once it runs, else the launcher's environment; 1 and 0
    without one).
muon.comm.world_info()
    size, rank: the world a config sees (muon.world()): world_size and
    world_rank, or the virtual world of a dry run while its config loads
    (as_world).
muon.comm.as_world(world, f, ...)
    f(...) with world_info() giving world.size and world.rank (a dry run's
    config load: muon check --world N --rank R); returns what f returns.
muon.comm.virtual(size, rank)
    A communicator that stands for rank `rank` of `size` ranks (at most
    muon.dist.MAX_RANKS) without communicating: a dry run's
    (muon.engine.new opts.dry_run). Every rank is taken to hold what this
    one holds: allreduce returns the values ("sum": times size),
    bcast_string this rank's string, split a virtual communicator of the
    same size; the calls that move data raise ESTATE; stats are zeros.
muon.comm.is_comm(x)
    Whether x is a communicator (a virtual one too).
muon.comm.stats(c)
Comm:stats()
    { calls, bytes_sent, bytes_recv, seconds, nonblocking,
    done_before_wait } of c since it was made or reset.
muon.comm.finalize()
    MPI_Finalize, if muon initialized MPI.
muon.comm.abort(code)
    Abort the whole job (MPI_Abort, code default 1).
Comm:rank()
Comm:size()
    This process's rank; the number of ranks.
Comm:split(color, key)
    A new communicator of the ranks with the same color, ordered by key.
Comm:reset_stats()
    Zero the counters.
Comm:alltoallv(send, sendcounts, recv, recvcounts)
Comm:ialltoallv(send, sendcounts, recv, recvcounts)
    Exchange pieces with every rank (element counts per peer); the i form
    posts it and returns a request.
Comm:allgatherv(send, recv, recvcounts)
    Gather every rank's send into recv (recvcounts per rank).
Comm:bcast(t, root)
Comm:ibcast(t, root)
    Broadcast a buffer from root (default 0); the i form returns a request.
Comm:bcast_string(s, root)
    Broadcast a Lua string from root; every rank returns it.
Comm:allreduce(values, op, kind)
    All-reduce a Lua list of numbers; op "sum" (default), "max" or "min";
    kind "i64" (default) or "f64". Returns the reduced list.
Comm:barrier()
    Wait for every rank.
Comm:free()
    Release now (otherwise the garbage collector does).
Request:wait()
    Wait for a posted collective to complete (every request must be
    waited for).
Request:test()
    Whether it completed (without waiting).
]]
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")
local T = require("muon.tensor")
local C, check = core.C, core.check
local MAX_RANKS = require("muon.dist_mesh").MAX_RANKS

local M = {}

local Comm = {}
Comm.__index = Comm

local function wrap(ptr)
  return setmetatable({ ptr = ffi.gc(ptr, C.mu_comm_free) }, Comm)
end

function M.have_mpi() return C.mu_comm_have_mpi() == 1 end
function M.world_size() return tonumber(C.mu_comm_world_size()) end
function M.world_rank() return tonumber(C.mu_comm_world_rank()) end

-- The world a config sees (its contract: the reference block); `shown`
-- is set only while a dry run's config loads.
local shown
function M.world_info()
  if shown then return shown.size, shown.rank end
  return M.world_size(), M.world_rank()
end

function M.as_world(world, f, ...)
  local saved = shown
  shown = world
  local r = { pcall(f, ...) }
  shown = saved
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, table.maxn(r))
end

function M.world()
  local out = ffi.new("mu_comm *[1]")
  check(C.mu_comm_world(out), "comm.world")
  return wrap(out[0])
end

function M.self()
  local out = ffi.new("mu_comm *[1]")
  check(C.mu_comm_self(out), "comm.self")
  return wrap(out[0])
end

-- Wrap a caller's MPI_Comm (ptr: a pointer to an MPI_Comm, as cdata or lightuserdata).
function M.from_handle(ptr)
  local out = ffi.new("mu_comm *[1]")
  check(C.mu_comm_from_handle(ffi.cast("void *", ptr), out), "comm.from_handle")
  return wrap(out[0])
end

-- A communicator of size ranks, this process rank `rank`, that moves no
-- data (dry runs; the reference block says what each call does).
local Virtual = {}
Virtual.__index = Virtual

function M.virtual(size, rank)
  local max = MAX_RANKS
  if type(size) ~= "number" or size ~= math.floor(size) or size < 1 or size > max then
    E.blame(E.EINVAL, "comm.virtual: size must be an integer in 1..%d, got %s", max, tostring(size))
  end
  if type(rank) ~= "number" or rank ~= math.floor(rank) or rank < 0 or rank >= size then
    E.blame(E.EINVAL, "comm.virtual: rank must be an integer in 0..%d, got %s", size - 1, tostring(rank))
  end
  return setmetatable({ n = size, me = rank }, Virtual)
end

function Virtual:rank() return self.me end
function Virtual:size() return self.n end
function Virtual:split() return M.virtual(self.n, self.me) end
function Virtual:allreduce(values, op)
  local r = {}
  for i = 1, #values do r[i] = (op or "sum") == "sum" and values[i] * self.n or values[i] end
  return r
end
function Virtual.bcast_string(_, s) return s end
function Virtual.stats()
  return { calls = 0, bytes_sent = 0, bytes_recv = 0, seconds = 0, nonblocking = 0, done_before_wait = 0 }
end
function Virtual.reset_stats() end
function Virtual.free() end
for _, name in ipairs({ "alltoallv", "ialltoallv", "allgatherv", "bcast", "ibcast", "barrier" }) do
  Virtual[name] = function(self)
    E.raise(E.ESTATE, "comm:%s: a virtual communicator (rank %d of %d: a dry run) moves no data", name, self.me, self.n)
  end
end

function M.is_comm(x) return getmetatable(x) == Comm or getmetatable(x) == Virtual end

function M.finalize() check(C.mu_comm_finalize(), "comm.finalize") end
function M.abort(code) C.mu_comm_abort(code or 1) end

function Comm:rank() return tonumber(C.mu_comm_rank(self.ptr)) end
function Comm:size() return tonumber(C.mu_comm_size(self.ptr)) end

function Comm:split(color, key)
  if type(color) ~= "number" or color < 0 then E.blame(E.EINVAL, "comm:split: color must be a number >= 0") end
  local out = ffi.new("mu_comm *[1]")
  check(C.mu_comm_split(self.ptr, color, key or self:rank(), out), "comm:split")
  return wrap(out[0])
end

function M.stats(c)
  if getmetatable(c) == Virtual then return c:stats() end
  local s = ffi.new("mu_comm_stats")
  check(C.mu_comm_get_stats(c.ptr, s), "comm.stats")
  return { calls = tonumber(s.calls), bytes_sent = tonumber(s.bytes_sent),
           bytes_recv = tonumber(s.bytes_recv), seconds = tonumber(s.seconds),
           nonblocking = tonumber(s.nonblocking), done_before_wait = tonumber(s.done_before_wait) }
end
Comm.stats = M.stats
function Comm:reset_stats() C.mu_comm_reset_stats(self.ptr) end

-- A buffer argument: a muon tensor (contiguous) or { ptr = cdata, dtype = "float32"|"float64" }.
local function buf(x, what)
  if T.is_tensor(x) then
    if C.mu_tensor_is_contiguous(x) ~= 1 then E.blame(E.EINVAL, what .. " must be contiguous") end
    return x.data, x.scalar
  elseif type(x) == "table" and x.ptr then
    return x.ptr, T.dtype_code(x.dtype)
  end
  E.blame(E.EINVAL, what .. " must be a contiguous tensor or { ptr=, dtype= }")
end

local function counts_displs(counts, n, what)
  if type(counts) ~= "table" or #counts ~= n then
    E.blame(E.EINVAL, ("%s must be a table of %d counts (one per rank)"):format(what, n))
  end
  local c, d = ffi.new("int64_t[?]", n), ffi.new("int64_t[?]", n)
  local off = 0
  for i = 1, n do
    c[i - 1] = counts[i]
    d[i - 1] = off
    off = off + counts[i]
  end
  return c, d, off
end

-- Counts are per peer (1-based table index = rank + 1); displacements are packed.
function Comm:alltoallv(send, sendcounts, recv, recvcounts)
  local n = self:size()
  local sp, sdt = buf(send, "alltoallv: send")
  local rp, rdt = buf(recv, "alltoallv: recv")
  if sdt ~= rdt then E.blame(E.EDTYPE, "alltoallv: send and recv dtypes differ") end
  local sc, sd = counts_displs(sendcounts, n, "alltoallv: sendcounts")
  local rc, rd = counts_displs(recvcounts, n, "alltoallv: recvcounts")
  check(C.mu_comm_alltoallv(self.ptr, sdt, sp, sc, sd, rp, rc, rd), "comm:alltoallv")
end

local Req = {}
Req.__index = Req
function Req:wait()
  if self.q then
    local q = self.q
    self.q, self.keep = nil, nil
    check(C.mu_comm_wait(q), "comm request wait")
  end
end
local done_out = ffi.new("int[1]")
function Req:test()
  if not self.q then return true end
  check(C.mu_comm_test(self.q, done_out), "comm request test")
  return done_out[0] == 1
end

function Comm:ialltoallv(send, sendcounts, recv, recvcounts)
  local n = self:size()
  local sp, sdt = buf(send, "ialltoallv: send")
  local rp, rdt = buf(recv, "ialltoallv: recv")
  if sdt ~= rdt then E.blame(E.EDTYPE, "ialltoallv: send and recv dtypes differ") end
  local sc, sd = counts_displs(sendcounts, n, "ialltoallv: sendcounts")
  local rc, rd = counts_displs(recvcounts, n, "ialltoallv: recvcounts")
  local out = ffi.new("mu_comm_request *[1]")
  check(C.mu_comm_ialltoallv(self.ptr, sdt, sp, sc, sd, rp, rc, rd, out), "comm:ialltoallv")
  return setmetatable({ q = out[0], keep = { send, recv, self } }, Req)
end

function Comm:allgatherv(send, recv, recvcounts)
  local n = self:size()
  local sp, sdt = buf(send, "allgatherv: send")
  local rp, rdt = buf(recv, "allgatherv: recv")
  if sdt ~= rdt then E.blame(E.EDTYPE, "allgatherv: send and recv dtypes differ") end
  local rc, rd = counts_displs(recvcounts, n, "allgatherv: recvcounts")
  check(C.mu_comm_allgatherv(self.ptr, sdt, sp, recvcounts[self:rank() + 1], rp, rc, rd), "comm:allgatherv")
end

function Comm:bcast(t, root)
  local p, dt = buf(t, "bcast: tensor")
  local n = type(t) == "table" and t.n or tonumber(C.mu_tensor_numel(t))
  check(C.mu_comm_bcast(self.ptr, dt, p, n, root or 0), "comm:bcast")
end

function Comm:ibcast(t, root)
  local p, dt = buf(t, "ibcast: tensor")
  local n = type(t) == "table" and t.n or tonumber(C.mu_tensor_numel(t))
  local out = ffi.new("mu_comm_request *[1]")
  check(C.mu_comm_ibcast(self.ptr, dt, p, n, root or 0, out), "comm:ibcast")
  return setmetatable({ q = out[0], keep = { t, self } }, Req)
end

-- Broadcast a Lua string from root; every rank returns it.
function Comm:bcast_string(s, root)
  root = root or 0
  local len = ffi.new("int64_t[1]", self:rank() == root and #s or 0)
  check(C.mu_comm_allreduce_i64(self.ptr, len, 1, C.MU_COMM_MAX), "comm:bcast_string")
  local n = tonumber(len[0])
  local b = ffi.new("char[?]", n + 1)
  if self:rank() == root then ffi.copy(b, s, n) end
  check(C.mu_comm_bcast_bytes(self.ptr, b, n, root), "comm:bcast_string")
  return ffi.string(b, n)
end

local OPS = { sum = 0, max = 1, min = 2 }

-- All-reduce a Lua array of numbers; kind "i64" (default) or "f64".
function Comm:allreduce(values, op, kind)
  local o = OPS[op or "sum"]
  if not o then E.blame(E.EINVAL, "allreduce: op must be 'sum', 'max' or 'min', got " .. tostring(op)) end
  kind = kind or "i64"
  local n = #values
  if kind == "i64" then
    local b = ffi.new("int64_t[?]", math.max(n, 1))
    for i = 1, n do b[i - 1] = values[i] end
    check(C.mu_comm_allreduce_i64(self.ptr, b, n, o), "comm:allreduce")
    local r = {}
    for i = 1, n do r[i] = tonumber(b[i - 1]) end
    return r
  elseif kind == "f64" then
    local b = ffi.new("double[?]", math.max(n, 1))
    for i = 1, n do b[i - 1] = values[i] end
    check(C.mu_comm_allreduce_f64(self.ptr, b, n, o), "comm:allreduce")
    local r = {}
    for i = 1, n do r[i] = b[i - 1] end
    return r
  end
  E.blame(E.EINVAL, "allreduce: kind must be 'i64' or 'f64', got " .. tostring(kind))
end

function Comm:barrier() check(C.mu_comm_barrier(self.ptr), "comm:barrier") end

-- Release now (otherwise the garbage collector does it).
function Comm:free()
  if self.ptr ~= nil then
    C.mu_comm_free(ffi.gc(self.ptr, nil))
    self.ptr = nil
  end
end

return M
