-- Helper for choosing MU__NS_BATCH_PAR_MAX (src/ns.c): a batch through one
-- 3-D call (whole matrices spread over the workers, when n*m <= the
-- threshold) vs the same matrices one 2-D call at a time (each matrix's
-- tiles shared by the workers, for shapes that are split).
--   luajit tests/bench/ns_batch_crossover.lua
local T = require("muon.tensor")
local ns = require("muon.ns")
local now = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua").now
local function best(fn)
  fn()
  local b = math.huge
  for _ = 1, 3 do
    local t0 = now(); fn(); b = math.min(b, now() - t0)
  end
  return b
end
local r = ns.resolve({})
print(("%-14s %12s %12s %7s"):format("batch", "per-thread", "threaded", "ratio"))
for _, s in ipairs({ { 16, 64, 64 }, { 16, 128, 128 }, { 8, 256, 256 }, { 8, 256, 1024 }, { 4, 512, 512 },
  { 4, 768, 768 }, { 4, 768, 3072 }, { 4, 1024, 1024 }, { 2, 1024, 4096 } }) do
  local x = T.randn(s, 1)
  local out = T.zeros(s)
  local ws = ns.workspace("float32", s[2], s[3])
  local slices = {}
  for i = 1, s[1] do slices[i] = { x:select(1, i), out:select(1, i) } end
  local tp = best(function() ns.zeropower_into(out, x, r, ws) end)
  local tt = best(function() for i = 1, s[1] do ns.zeropower_into(slices[i][2], slices[i][1], r, ws) end end)
  print(("%-14s %10.2f ms %10.2f ms %7.2f"):format(table.concat(s, "x"), tp * 1e3, tt * 1e3, tt / tp))
end
