-- Newton-Schulz benchmark (`make bench`): ms per call (median), effective
-- GFLOP/s counting the plain-gemm flops, the same-run standalone sgemm time
-- for those flops, plain/symmetric, and torch (the seed's function, float32,
-- 2 threads, same OpenBLAS core) / ours when /usr/bin/python3 has torch.
--   luajit tests/bench/ns_bench.lua [SHAPE ...]   (SHAPE like 768x768, 12x768x768)
-- Ours runs MU_NS_THREADS workers when set, else one per OpenBLAS thread;
-- every BLAS call is single-threaded and its tiles are fixed by the shape,
-- so the results are the same bits whatever the worker count.
local ffi = require("ffi")
local muon = require("muon")
local T = muon.tensor
local ns = require("muon.ns")

ffi.cdef [[
struct mu_bench_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct mu_bench_timespec *ts);
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]]
local ts = ffi.new("struct mu_bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- The library links OpenBLAS; its symbols resolve through the loaded copy.
local blas = ffi.load("libopenblas.so.0")

local STEPS = 5
local SHAPES = { "768x768", "768x3072", "3072x768", "1024x4096", "2048x2048", "4096x4096", "12x768x768" }
if #arg > 0 then SHAPES = arg end

local function parse(s)
  local t = {}
  for v in s:gmatch("%d+") do t[#t + 1] = tonumber(v) end
  return t
end

-- Median seconds of fn(), with a warm-up; runs adapt to a per-item budget.
local function median_time(fn, budget)
  local t0 = now()
  fn()
  local first = now() - t0
  local runs = math.max(first > 3 and 2 or 3, math.min(7, math.floor((budget or 1.5) / math.max(first, 1e-6))))
  local times = {}
  for i = 1, runs do
    t0 = now()
    fn()
    times[i] = now() - t0
  end
  table.sort(times)
  return times[math.floor(runs / 2) + 1], runs
end

-- Standalone sgemm rate (flop/s) on the shape of NS's largest product
-- (n x n) * (n x m), measured in this run.
local sgemm_rate_cache = {}
local function sgemm_rate(n, m)
  local key = n .. "x" .. m
  if sgemm_rate_cache[key] then return sgemm_rate_cache[key] end
  local a, b, c = T.randn({ n, n }, 3), T.randn({ n, m }, 4), T.zeros({ n, m })
  local pa, pb, pc = a:ptr(), b:ptr(), c:ptr()
  local t = median_time(function()
    blas.cblas_sgemm(101, 111, 111, n, m, n, 1, pa, n, pb, m, 0, pc, m)
  end, 0.5)
  local rate = 2 * n * n * m / t
  sgemm_rate_cache[key] = rate
  return rate
end

-- Torch timings (one python process for all shapes), or nil + reason.
local function torch_times(shapes)
  local py = "/usr/bin/python3"
  local f = io.open(py, "r")
  if not f then return nil, "no /usr/bin/python3" end
  f:close()
  local ok = os.execute(py .. " -c 'import torch' >/dev/null 2>&1")
  if ok ~= 0 and ok ~= true then return nil, "python3 cannot import torch" end
  local dir = (debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$")) or "tests/bench"
  -- Same OpenBLAS core as ours (Debian's torch uses the system OpenBLAS).
  local core = muon.blas_info().core
  local cmd = ("OPENBLAS_CORETYPE=%s %s %s/ns_torch.py %s 2>&1"):format(core, py, dir, table.concat(shapes, " "))
  local p = io.popen(cmd)
  local out = {}
  for line in p:lines() do
    local s, ms = line:match("^(%S+) ([%d%.]+)$")
    if s then out[s] = tonumber(ms) end
  end
  p:close()
  if next(out) == nil then return nil, "torch run failed" end
  return out
end

local info = muon.blas_info()
local workers = math.min(16, info.threads) -- MU__NS_MAX_SLOTS in src/ns.c
local env_workers = tonumber(os.getenv("MU_NS_THREADS") or "")
if env_workers and env_workers >= 1 and env_workers == math.floor(env_workers) then
  workers = math.min(16, env_workers)
end
print(("OpenBLAS core %s, %d threads; NS workers %d; %d steps, asym5, float32"):format(info.core, info.threads,
  workers, STEPS))

local rows = {}
for _, s in ipairs(SHAPES) do
  local shape = parse(s)
  local b = #shape == 3 and shape[1] or 1
  local r, c = shape[#shape - 1], shape[#shape]
  local n, m = math.min(r, c), math.max(r, c)
  local flops = b * STEPS * (4 * n * n * m + 2 * n * n * n)
  local x = T.randn(shape, 1)
  local out = T.zeros(shape)
  local ws = ns.workspace("float32", r, c)
  local res = {}
  for _, path in ipairs({ "symmetric", "plain" }) do
    local ro = ns.resolve({ steps = STEPS, variant = "asym5", path = path })
    res[path] = median_time(function() ns.zeropower_into(out, x, ro, ws) end, 2.0)
  end
  local sg = flops / sgemm_rate(n, m)
  rows[#rows + 1] = { s = s, sym = res.symmetric, plain = res.plain, sgemm = sg, flops = flops }
end

local torch, why = torch_times(SHAPES)

print(("%-11s %9s %9s %8s %9s %11s %7s %9s %8s"):format("shape", "sym ms", "plain ms", "GFLOP/s",
  "plain/sym", "sgemm ms", "sym/sg", "torch ms", "torch/us"))
for _, row in ipairs(rows) do
  local t = torch and torch[row.s]
  print(("%-11s %9.1f %9.1f %8.0f %9.2f %11.1f %7.2f %9s %8s"):format(row.s, row.sym * 1e3, row.plain * 1e3,
    row.flops / row.sym * 1e-9, row.plain / row.sym, row.sgemm * 1e3, row.sym / row.sgemm,
    t and ("%.1f"):format(t) or "-", t and ("%.2f"):format(t / (row.sym * 1e3)) or "-"))
end
print("GFLOP/s: plain-gemm flops (steps x (4 n^2 m + 2 n^3), n = smaller dim) / symmetric time;")
print("sgemm ms: those flops at this run's standalone sgemm rate ((n x n)(n x m) product).")
if not torch then print("torch: unavailable (" .. tostring(why) .. ")") end

-- Targets (issue 3): symmetric >= 1.25x plain on the big/batched shapes,
-- >= 1.4x faster than the seed's torch function on every shape.
local sym_ok, sym_bad, torch_bad = true, {}, {}
for _, row in ipairs(rows) do
  local big = ({ ["2048x2048"] = true, ["4096x4096"] = true, ["12x768x768"] = true })[row.s]
  if big and row.plain / row.sym < 1.25 then sym_ok = false; sym_bad[#sym_bad + 1] = row.s end
  local t = torch and torch[row.s]
  if t and t / (row.sym * 1e3) < 1.4 then torch_bad[#torch_bad + 1] = row.s end
end
print(("target plain/sym >= 1.25 (2048^2, 4096^2, 12x768^2): %s"):format(
  sym_ok and "met" or ("NOT met on " .. table.concat(sym_bad, ", "))))
if torch then
  print(("target torch/us >= 1.4 (every shape): %s"):format(
    #torch_bad == 0 and "met" or ("NOT met on " .. table.concat(torch_bad, ", "))))
end
