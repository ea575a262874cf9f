-- The engine step inside an OpenMP host (`make bench`): tests/bench/omp_host.c,
-- a llm.c-style loop (an OpenMP parallel loop of host work, then
-- mu_engine_step on the width-128 GPT block set), with the default
-- OMP_WAIT_POLICY. Prints the median step time with the engine alone and
-- inside the host, for the engine's workers on the host's OpenMP team (the
-- default when the process has an OpenMP runtime) and on threads of its
-- own (MU_NS_OPENMP=0), with both OpenBLAS cores; interleaved rounds,
-- medians. Target: inside the host within 10% of alone.
--   luajit tests/bench/omp_bench.lua [HOST_N]
local ROUNDS, STEPS = 5, 40
local host_n = tonumber(arg[1] or "") or 65536

local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua")
local capture, median = B.capture, B.median

local prog = B.build("omp_host", "omp_bench", "needs a compiler with -fopenmp")
if not prog then return end
local config = os.tmpname()
local f = assert(io.open(config, "w"))
f:write('return { groups = { { name = "hidden", optimizer = "muon", match = ".*" } } }\n')
f:close()

local function run(core, pool, mode)
  local env = "-u OMP_WAIT_POLICY" .. (core and "" or " -u OPENBLAS_CORETYPE") .. (pool == "own" and "" or " -u MU_NS_OPENMP")
    .. (core and (" OPENBLAS_CORETYPE=" .. core) or "") .. (pool == "own" and " MU_NS_OPENMP=0" or "")
  local out = capture(("env %s %s %s %s %d %d"):format(env, prog, mode, config, STEPS, host_n))
  local st, ht = out:match("RESULT (%S+) (%S+)")
  if not st then error("omp_bench: a run failed:\n" .. out) end
  return tonumber(st), tonumber(ht)
end

print(("OpenMP host: %d-element parallel loop of host work, then the step (width-128 block set, 16 Muon matrices); "
  .. "default OMP_WAIT_POLICY; medians of %d interleaved rounds of %d steps"):format(host_n, ROUNDS, STEPS))
local met = true
for _, core in ipairs({ false, "Haswell" }) do
  local t = {}
  for _, pool in ipairs({ "openmp", "own" }) do t[pool] = { alone = {}, host = {}, work = {} } end
  for r = 1, ROUNDS do
    for _, pool in ipairs({ "openmp", "own" }) do
      t[pool].alone[r] = run(core, pool, "alone")
      t[pool].host[r], t[pool].work[r] = run(core, pool, "host")
    end
  end
  print(("OpenBLAS core %s (host work %.1f ms per loop):"):format(core or "SkylakeX (default)", median(t.openmp.work) * 1e3))
  for _, pool in ipairs({ "openmp", "own" }) do
    local a, h = median(t[pool].alone), median(t[pool].host)
    print(("  workers on %-22s alone %6.2f ms   in the OpenMP host %6.2f ms   host/alone %.2f"):format(
      pool == "openmp" and "the host's OpenMP team" or "threads of their own", a * 1e3, h * 1e3, h / a))
    if pool == "openmp" and h / a > 1.1 then met = false end
  end
end
os.remove(config)
print(("target: inside the host within 10%% of alone (OpenMP team): %s"):format(met and "met" or "NOT met"))
