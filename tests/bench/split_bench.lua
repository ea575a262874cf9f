-- Split Newton-Schulz benchmark (`make bench`), one 2048 x 8192 float32
-- matrix (4 blocks of 2048), asym5, 5 steps:
--   np 2, one BLAS thread per rank (one rank per core on the 2-core
--     target): the split iteration over both ranks (mu__split_run) against
--     the same matrix on one rank alone (mu_ns_zeropower, the other rank
--     idle), interleaved rounds; target: split / one rank <= 0.6; the bytes
--     each rank moved (counted, and the machines' formula);
--   one process, the default threads: the blocked iteration (what one
--     process runs for this shape) against the unblocked one of src/ns.c
--     (MU_NS_SPLIT_PLAN=off), interleaved rounds: no slower beyond noise.
--   luajit tests/bench/split_bench.lua [rows] [cols] [rounds] [method] [dtype]
local comm = require("muon.comm")

local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua")
local sh = B.sh
local rows, cols = tonumber(arg[1] or 2048), tonumber(arg[2] or 8192)
local rounds, method, dtype = tonumber(arg[3] or 3), arg[4] or "standard", arg[5] or "float32"

local T = require("muon.tensor")
local ns = require("muon.ns")
local C = require("muon.core").C
local ffi = require("ffi")
local SV = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/../split_virtual.lua")
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
pcall(ffi.cdef, "int unsetenv(const char *name);")

local now, median = B.now, B.median
local cts = ffi.new("mu_bench_ts") -- (tests/bench/lib.lua declares it and clock_gettime)
-- This process's CPU seconds (CLOCK_PROCESS_CPUTIME_ID): on a shared
-- machine the wall time of two ranks also measures the other jobs.
local function cpu()
  ffi.C.clock_gettime(2, cts)
  return tonumber(cts.tv_sec) + tonumber(cts.tv_nsec) * 1e-9
end
local opts = { method = method, dtype = dtype }
local label = ("%dx%d %s %s"):format(rows, cols, dtype, method)

if comm.world_size() == 1 and arg[6] ~= "--worker" then
  local info, model = require("muon").blas_info(), "?"
  for line in io.lines("/proc/cpuinfo") do
    model = line:match("^model name%s*:%s*(.-)%s*$") or model
    if model ~= "?" then break end
  end
  print(("CPU %s; OpenBLAS %s core, %d threads"):format(model, tostring(info.core), info.threads))
  -- one process: blocked against unblocked
  local x = T.randn({ rows, cols }, 3)
  local out = T.zeros({ rows, cols })
  local r = ns.resolve(opts)
  local ws = ns.workspace("float32", rows, cols)
  local t = { blocked = {}, unblocked = {} }
  for _ = 1, rounds do
    for _, mode in ipairs({ "blocked", "unblocked" }) do
      if mode == "unblocked" then ffi.C.setenv("MU_NS_SPLIT_PLAN", "off", 1) else ffi.C.unsetenv("MU_NS_SPLIT_PLAN") end
      local t0 = now()
      ns.zeropower_into(out, x, r, ws)
      t[mode][#t[mode] + 1] = now() - t0
    end
  end
  ffi.C.unsetenv("MU_NS_SPLIT_PLAN")
  print(("one process, %s: blocked %.3f s, unblocked %.3f s (medians of %d interleaved rounds): "
    .. "blocked / unblocked %.3f"):format(label, median(t.blocked), median(t.unblocked), rounds,
    median(t.blocked) / median(t.unblocked)))
  local env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
    .. "OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl=self,vader OMPI_MCA_plm=isolated"
  local f = io.open("build/muon", "r")
  local host = f and "build/muon run" or "luajit"
  if f then f:close() end
  local cmd = ("%s OPENBLAS_NUM_THREADS=1 timeout -k 10 900 mpirun --timeout 880 --stdin none -np 2 %s "
    .. "tests/bench/split_bench.lua %d %d %d %s %s --worker </dev/null"):format(env, host, rows, cols, rounds,
    sh(method), sh(dtype))
  local ok = os.execute(cmd)
  if ok ~= 0 and ok ~= true then error("split_bench: mpirun failed (" .. tostring(ok) .. ")") end
  return
end

-- np 2: split over both ranks against one rank alone.
local w = comm.world()
local rank = w:rank()
local x = T.randn({ rows, cols }, 3)
local r = ns.resolve(opts)
local m = SV.machine(x, r, w:size(), rank)
local piece = SV.piece(x, m)
local out = T.zeros(piece:size())
local whole = T.zeros({ rows, cols })
local ws = ns.workspace("float32", rows, cols)
local t = { split = {}, one = {}, split_cpu = {}, one_cpu = {} }
local stats
for _ = 1, rounds do
  -- one rank alone (rank 0 works, the other waits at the barrier)
  w:barrier()
  local t0, c0 = now(), cpu()
  if rank == 0 then ns.zeropower_into(whole, x, r, ws) end
  t.one_cpu[#t.one_cpu + 1] = cpu() - c0
  w:barrier()
  t.one[#t.one + 1] = now() - t0
  -- split over the group
  w:barrier()
  w:reset_stats()
  t0, c0 = now(), cpu()
  local rc = C.mu__split_run(m.ptr, w.ptr, piece, out)
  t.split_cpu[#t.split_cpu + 1] = cpu() - c0
  w:barrier()
  t.split[#t.split + 1] = now() - t0
  stats = w:stats()
  assert(rc == 0, "split run failed: " .. rc)
end
local i = m.info
local sent = tonumber(i.call_bytes_sent + i.bytes_sent)
print(("np %d rank %d, %s, 1 BLAS thread per rank: split %.3f s, one rank alone %.3f s (medians of %d "
  .. "interleaved rounds): split / alone %.3f (target <= 0.6); this rank's CPU seconds: split %.3f, alone %s; "
  .. "blocks %d-%d of %d, %d stripes; sent %.1f MB (formula %.1f MB), received %.1f MB, %d exchanges"):format(
  w:size(), rank, label, median(t.split), median(t.one), rounds, median(t.split) / median(t.one),
  median(t.split_cpu), rank == 0 and ("%.3f"):format(median(t.one_cpu)) or "-", tonumber(i.first_block),
  tonumber(i.first_block + i.nblocks - 1), tonumber(i.blocks), tonumber(i.stripes),
  stats.bytes_sent / 1e6, sent / 1e6, stats.bytes_recv / 1e6, stats.calls))
comm.finalize()
