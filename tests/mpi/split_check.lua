-- Split Newton-Schulz over MPI (mu__split_run on the world communicator):
-- each rank's piece of the output is bitwise equal to one process's
-- (mu_ns_zeropower, which runs the same blocked iteration), the bytes the
-- communicator counts equal the machines' formula, and a NaN or a bad
-- piece on one rank fails every rank (no rank waits).
local H = require("mpi.harness")
local SV = require("split_virtual")
local T = require("muon.tensor")
local ns = require("muon.ns")
local C = require("muon.core").C
local ffi = require("ffi")

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
pcall(ffi.cdef, "int unsetenv(const char *name);")

local function same_bits(a, b)
  local es = a:dtype() == "float64" and 8 or 4
  return a:numel() == b:numel() and (a:numel() == 0 or ffi.C.memcmp(a.data, b.data, a:numel() * es) == 0)
end
pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

H.main(function()
  local w = H.init()
  -- name, shape, options, dtype, the plan (MU_NS_SPLIT_PLAN; nil: the real one)
  local cases = {
    { "wide-f32", { 24, 8200 }, {} },
    { "tall-gram", { 8200, 24 }, { method = "gram" } },
    { "batched-bf16", { 2, 24, 8200 }, { dtype = "bfloat16" } },
    { "wide-f64", { 16, 8200 }, {}, "float64" },
    { "square-f32", { 96, 96 }, {}, nil, "64,16,16" },
    { "square-gram", { 96, 96 }, { method = "gram" }, nil, "64,16,16" },
    { "square-bf16", { 2, 96, 96 }, { dtype = "bfloat16" }, nil, "64,16,16" },
  }
  for _, c in ipairs(cases) do
    if c[5] then ffi.C.setenv("MU_NS_SPLIT_PLAN", c[5], 1) else ffi.C.unsetenv("MU_NS_SPLIT_PLAN") end
    local x = T.randn(c[2], 7, c[4] or "float32")
    local r = ns.resolve(c[3])
    local one = ns.zeropower(x, c[3])
    local m = SV.machine(x, r, H.size, H.rank)
    local piece = SV.piece(x, m)
    local out = T.zeros(piece:size(), piece:dtype())
    w:reset_stats()
    local rc = C.mu__split_run(m.ptr, w.ptr, piece, out)
    local st = w:stats()
    local want = SV.piece(one, m)
    H.check(c[1] .. "-bits", rc == 0 and same_bits(out, want), "status " .. rc)
    local i, batch = m.info, #c[2] == 3 and c[2][1] or 1
    local sent = tonumber(i.call_bytes_sent + batch * i.bytes_sent)
    local recv = tonumber(i.call_bytes_recv + batch * i.bytes_recv)
    local calls = tonumber(i.call_exchanges + batch * i.exchanges)
    H.check(c[1] .. "-bytes", st.bytes_sent == sent and st.bytes_recv == recv and st.calls == calls,
      ("sent %d (formula %d), received %d (%d), calls %d (%d)"):format(st.bytes_sent, sent, st.bytes_recv,
        recv, st.calls, calls))
    -- in place: the same bits
    rc = C.mu__split_run(m.ptr, w.ptr, piece, piece)
    H.check(c[1] .. "-inplace", rc == 0 and same_bits(piece, want), "status " .. rc)
  end

  -- A NaN in the last rank's piece: MU_ENONFINITE on every rank, out untouched.
  ffi.C.setenv("MU_NS_SPLIT_PLAN", "64,16,16", 1)
  local x = T.randn({ 40, 100 }, 9)
  local r = ns.resolve({})
  local m = SV.machine(x, r, H.size, H.rank)
  local piece = SV.piece(x, m)
  if H.rank == H.size - 1 and piece:numel() > 0 then piece:set(0 / 0, 1, 1) end
  local out = T.zeros(piece:size())
  local rc = C.mu__split_run(m.ptr, w.ptr, piece, out)
  H.check("nan-fails-everywhere", rc == C.MU_ENONFINITE and (out:numel() == 0 or out:abs():amax() == 0), "status " .. rc)
  -- A piece of the wrong shape on rank 0: every rank fails with its status.
  piece = SV.piece(x, m)
  local bad = H.rank == 0 and T.zeros({ 40, 3 }) or piece
  rc = C.mu__split_run(m.ptr, w.ptr, bad, bad)
  H.check("bad-piece-fails-everywhere", rc == C.MU_ESHAPE, "status " .. rc)
  -- and the machine still works afterwards
  rc = C.mu__split_run(m.ptr, w.ptr, piece, piece)
  H.check("after-failure", rc == 0 and same_bits(piece, SV.piece(ns.zeropower(x), m)), "status " .. rc)
  ffi.C.unsetenv("MU_NS_SPLIT_PLAN")
end)
