-- Whole-step scheduling (`make bench`): a GPT block set of width 128 (4
-- layers of qkv 384x128, proj 128x128, fc 512x128, fc-proj 128x512) through
-- the one-process Muon step, as 16 2-D parameters and as 4 stacked (4, out,
-- in) parameters. Prints the step time (median), the plain-gemm flop count
-- of its Newton-Schulz (5 steps x (4 n^2 m + 2 n^3) per matrix, n the
-- smaller dim), the achieved GFLOP/s, the same-run sgemm rate (OpenBLAS's
-- own threads, on the NS products' shapes) and, when git has it, the same
-- step with the tree before whole-step scheduling (built into /tmp).
-- Target: GFLOP/s >= 1.2x the sgemm rate (about 2x faster than before).
--   luajit tests/bench/block_bench.lua            (compare both cores)
--   luajit tests/bench/block_bench.lua --measure  (one measurement)
local BASELINE = "af4f7d7"
local ROUNDS = 5

local ffi = require("ffi")
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua")
local now, median, sh, capture = B.now, B.median, B.sh, B.capture

-- (out, in) per layer; NS runs on n x m with n = min, m = max.
local SHAPES = { { 384, 128 }, { 128, 128 }, { 512, 128 }, { 128, 512 } }
local LAYERS, NS_STEPS = 4, 5
local function ns_flops()
  local f = 0
  for _, s in ipairs(SHAPES) do
    local n, m = math.min(s[1], s[2]), math.max(s[1], s[2])
    f = f + LAYERS * NS_STEPS * (4 * n * n * m + 2 * n * n * n)
  end
  return f
end

local function measure()
  local muon = require("muon")
  local T = muon.tensor
  local function step_time(params)
    local opt = muon.optim.Muon(params)
    for _ = 1, 3 do opt:step() end -- warm-up: buffers and state
    local times = {}
    for r = 1, 31 do
      local t0 = now()
      opt:step()
      times[r] = now() - t0
    end
    return median(times)
  end
  local flat, stacked = {}, {}
  for l = 1, LAYERS do
    for i, s in ipairs(SHAPES) do
      local k = #flat + 1
      flat[k] = muon.param(("h.%d.w%d"):format(l, i), T.randn(s, k), T.randn(s, 100 + k))
    end
  end
  for i, s in ipairs(SHAPES) do
    local shape = { LAYERS, s[1], s[2] }
    stacked[i] = muon.param("stack.w" .. i, T.randn(shape, 200 + i), T.randn(shape, 300 + i))
  end
  return step_time(flat), step_time(stacked)
end

-- Same-run sgemm rate (OpenBLAS's own threads): the NS products' flops
-- ((n x n)(n x m) per matrix) over their sgemm time.
local function sgemm_rate()
  local muon = require("muon")
  local T = muon.tensor
  ffi.cdef [[
  void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
  ]]
  local blas = ffi.load("libopenblas.so.0")
  local flops, secs = 0, 0
  for _, s in ipairs(SHAPES) do
    local n, m = math.min(s[1], s[2]), math.max(s[1], s[2])
    local a, b, c = T.randn({ n, n }, 3), T.randn({ n, m }, 4), T.zeros({ n, m })
    local pa, pb, pc = a:ptr(), b:ptr(), c:ptr()
    local reps = 200
    local times = {}
    for r = 1, 7 do
      local t0 = now()
      for _ = 1, reps do blas.cblas_sgemm(101, 111, 111, n, m, n, 1, pa, n, pb, m, 0, pc, m) end
      times[r] = (now() - t0) / reps
    end
    flops, secs = flops + 2 * n * n * m, secs + median(times)
  end
  return flops / secs
end

if arg[1] == "--measure" then
  local a, b = measure()
  print(("RESULT %.9f %.9f %.6e %s"):format(a, b, sgemm_rate(), require("muon").blas_info().core))
  return
end


local base = B.baseline(BASELINE, "block_bench")
local have_base = base ~= nil

local here = io.popen("pwd"):read("*l")
local function run_tree(dir, core)
  local env = ("LUA_PATH=%s MUON_LIB=%s"):format(sh(dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;;"),
    sh(dir .. "/build/libmuon.so"))
  local coreenv = core and ("OPENBLAS_CORETYPE=" .. core) or "-u OPENBLAS_CORETYPE"
  local out = capture(("env %s %s luajit tests/bench/block_bench.lua --measure"):format(coreenv, env))
  local a, b, c, name = out:match("RESULT (%S+) (%S+) (%S+) (%S+)")
  if not a then error("block_bench: a measurement failed:\n" .. out) end
  return { tonumber(a), tonumber(b), tonumber(c), name }
end

local flops = ns_flops()
print(("width-128 block set: 4 x (384x128, 128x128, 512x128, 128x512), Muon, %d NS steps; NS plain-gemm flops %.3f G per step")
  :format(NS_STEPS, flops * 1e-9))
local function med(rows, i)
  local xs = {}
  for r, row in ipairs(rows) do xs[r] = row[i] end
  return median(xs)
end
local met = true
for _, core in ipairs({ false, "Haswell" }) do
  local new, old = {}, {}
  for r = 1, ROUNDS do -- interleaved, so that load on the machine hits both
    new[r] = run_tree(here, core)
    if have_base then old[r] = run_tree(base, core) end
  end
  local sg = med(new, 3)
  print(("OpenBLAS core %s: same-run sgemm %.0f GFLOP/s (2 threads, the NS products' shapes)"):format(new[1][4], sg * 1e-9))
  for i, what in ipairs({ "16 2-D params ", "4 stacked (4,o,i)" }) do
    local t = med(new, i)
    local rate = flops / t
    local line = ("  %-17s step %6.2f ms  %5.0f GFLOP/s = %.2fx sgemm"):format(what, t * 1e3, rate * 1e-9, rate / sg)
    if have_base then
      local o = med(old, i)
      line = line .. ("   before (%s): %6.2f ms, %5.0f GFLOP/s: %.2fx faster"):format(BASELINE, o * 1e3, flops / o * 1e-9, o / t)
    end
    print(line)
    if rate < 1.2 * sg then met = false end
  end
end
print(("target GFLOP/s >= 1.2x same-run sgemm: %s"):format(met and "met" or "NOT met"))
