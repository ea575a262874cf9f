-- busted output handler for `make test` (tests/run.sh: busted -o tests/tap_progress.lua):
-- busted's TAP lines, flushed as each test ends, plus a "# <spec file>"
-- line when a file starts and "# <spec file>: N tests, S s" when it ends,
-- so that a long suite is never silent for more than one test; a test that
-- took more than SLOW seconds gets a "# slow" note naming it.
local SLOW = 5
local ffi = require("ffi")
pcall(ffi.cdef, "struct tap_timespec { long tv_sec; long tv_nsec; }; int clock_gettime(int, struct tap_timespec *);")
local ts = ffi.new("struct tap_timespec")
local function wall() -- (monotonic seconds: CLOCK_MONOTONIC is 1 on Linux)
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + 1e-9 * tonumber(ts.tv_nsec)
end

return function(options)
  -- (busted's TAP handler writes with io.write: line buffering sends each
  -- line whole as it ends, not in 4 KiB blocks cut anywhere)
  io.stdout:setvbuf("line")
  local busted = require("busted")
  local handler = require("busted.outputHandlers.TAP")(options)
  local file_t0, file_n, test_t0 = 0, 0, 0

  local function line(s) io.write(s, "\n") end

  busted.subscribe({ "file", "start" }, function(file)
    file_t0, file_n = wall(), 0
    line("# " .. tostring(file.name))
    return nil, true
  end)
  busted.subscribe({ "file", "end" }, function(file)
    line(("# %s: %d tests, %.0f s"):format(tostring(file.name), file_n, wall() - file_t0))
    return nil, true
  end)
  busted.subscribe({ "test", "start" }, function()
    test_t0 = wall()
    return nil, true
  end)
  busted.subscribe({ "test", "end" }, function(element)
    file_n = file_n + 1
    local dt = wall() - test_t0
    if dt > SLOW then line(("# slow: %.1f s: %s"):format(dt, handler.getFullName(element))) end
    return nil, true
  end)
  return handler
end
