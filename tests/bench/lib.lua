-- What the benchmarks share: a monotonic clock, medians, shell helpers,
-- and a baseline revision built from git into /tmp (nothing of it in the
-- repository). Benchmarks load it with dofile from their own directory,
-- so a measuring subprocess finds it whatever its LUA_PATH.
local ffi = require("ffi")

local B = {}

pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } mu_bench_ts;
int clock_gettime(int clk, mu_bench_ts *ts);
]])
local ts = ffi.new("mu_bench_ts")

-- Seconds on CLOCK_MONOTONIC.
function B.now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- The median of a list (the lower middle one for an even count).
function B.median(xs)
  local c = {}
  for i, x in ipairs(xs) do c[i] = x end
  table.sort(c)
  return c[math.floor((#c + 1) / 2)]
end

-- A shell word.
function B.sh(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- A command's output (stdout and stderr).
function B.capture(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  p:close()
  return out
end

-- The path of a program under the build tree (MUON_BUILD, default build)
-- that `make` builds on demand (tests/bench/NAME.c), made if needed; nil
-- and a line saying the bench `who` is skipped when it cannot be.
function B.build(name, who, needs)
  local prog = (os.getenv("MUON_BUILD") or "build") .. "/bench/" .. name
  if os.execute("make -s " .. prog .. " >/dev/null 2>&1") ~= 0 then
    print(("%s: cannot build %s (%s); skipped"):format(who, prog, needs))
    return nil
  end
  return prog
end

-- The tree of revision rev built into /tmp/muon-bench-baseline-<rev>
-- (once); its path, or nil when rev is not in this checkout's git history.
function B.baseline(rev, who)
  local base = "/tmp/muon-bench-baseline-" .. rev
  if os.execute("git rev-parse --verify -q " .. rev .. "^{commit} >/dev/null 2>&1") ~= 0 then return nil end
  if os.execute("test -f " .. base .. "/build/libmuon.so") ~= 0 then
    io.write(who .. ": building the baseline " .. rev .. " in " .. base .. " ...\n")
    io.flush()
    os.execute("rm -rf " .. base .. " && mkdir -p " .. base .. " && git archive " .. rev .. " | tar -x -C " .. base)
    os.execute("make -s -C " .. base .. " build/libmuon.so >/dev/null 2>&1")
  end
  return os.execute("test -f " .. base .. "/build/libmuon.so") == 0 and base or nil
end

return B
