-- Split Newton-Schulz machines (src/ns_split.c, mu__split_* through the
-- FFI) for the tests: a rank's machine and piece, and g virtual ranks in
-- one process whose exchanges are copies in memory.
--
--   local SV = require("split_virtual")
--   local m = SV.machine(x, r, g, rank)   -- r: ns.resolve(opts); m.info, m.dim (1-based tensor dim)
--   local piece = SV.piece(x, m)         -- this rank's piece of x (a contiguous copy)
--   local y, exchanges = SV.run(x, r, g) -- every rank's output assembled
--   SV.exchange(xs, g)                   -- one exchange of g ranks' mu__split_xfer (xs[0..g-1])
local ffi = require("ffi")
local core = require("muon.core")
local T = require("muon.tensor")
local C, check = core.C, core.check

local SV = {}

local ES = { [tonumber(C.MU_F32)] = 4, [tonumber(C.MU_F64)] = 8, [tonumber(C.MU_BF16)] = 2 }

-- Rank `rank`'s machine of a group of g for x's matrices (2-D or 3-D).
function SV.machine(x, r, g, rank)
  local nd = x:dim()
  local box = ffi.new("mu__split *[1]")
  check(C.mu__split_new(T.dtype_code(x:dtype()), x:size(nd - 1), x:size(nd), r.copts, g, rank, box),
    "split_new")
  local m = { ptr = ffi.gc(box[0], C.mu__split_free), info = ffi.new("mu__split_info") }
  check(C.mu__split_get_info(m.ptr, m.info), "split_get_info")
  m.dim = nd - 1 + m.info.dim
  m.start, m.length = tonumber(m.info.start), tonumber(m.info.length)
  return m
end

-- This rank's piece of x (a copy: its own storage).
function SV.piece(x, m)
  return x:narrow(m.dim, m.start + 1, m.length):clone()
end

-- One exchange of every rank's xfer, copied in memory (xs[q]: rank q's).
function SV.exchange(xs, g)
  local op, dtype = xs[0].op, xs[0].dtype
  for q = 1, g - 1 do
    assert(xs[q].op == op and xs[q].dtype == dtype, "ranks ask for different exchanges")
  end
  local es = ES[tonumber(dtype)]
  for q = 0, g - 1 do
    local sx = xs[q]
    for p = 0, g - 1 do
      local rx = xs[p]
      local n, src
      if op == C.MU__SPLIT_ALLTOALLV then
        n, src = tonumber(sx.sendcounts[p]), ffi.cast("const char *", sx.send) + sx.sdispls[p] * es
      else
        n, src = tonumber(sx.sendcount), ffi.cast("const char *", sx.send)
      end
      assert(n == tonumber(rx.recvcounts[q]), "counts of the sender and the receiver differ")
      if n > 0 then ffi.copy(ffi.cast("char *", rx.recv) + rx.rdispls[q] * es, src, n * es) end
    end
  end
end

-- Run g virtual ranks on x with resolved options r, each in place on its
-- own piece (ins[q], or copies of x's): the assembled output, the number
-- of exchanges, and the machines. Every rank must return the same status.
function SV.run(x, r, g, ins)
  local ms, pieces, xs = {}, {}, {}
  for q = 0, g - 1 do
    ms[q] = SV.machine(x, r, g, q)
    pieces[q] = ins and ins[q] or SV.piece(x, ms[q])
    C.mu__split_begin(ms[q].ptr, pieces[q], pieces[q])
    xs[q] = ffi.new("mu__split_xfer")
  end
  local exchanges = 0
  while true do
    local rc
    for q = 0, g - 1 do
      local rq = C.mu__split_next(ms[q].ptr, xs[q])
      assert(rc == nil or rq == rc, "ranks disagree: " .. tostring(rc) .. " and " .. rq)
      rc = rq
    end
    if rc < 0 then check(rc, "split_next") end
    if rc == 0 then break end
    exchanges = exchanges + 1
    SV.exchange(xs, g)
  end
  local out = T.zeros(x:size(), x:dtype())
  for q = 0, g - 1 do
    if ms[q].length > 0 then out:narrow(ms[q].dim, ms[q].start + 1, ms[q].length):copy(pieces[q]) end
  end
  return out, exchanges, ms
end

return SV
