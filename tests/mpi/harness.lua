-- Per-rank result lines for MPI tests: "@@ <rank> ok|fail <name> [detail]".
-- The driving .sh aggregates them into one TAP line per test name (ok only
-- if every rank reported ok). On an unexpected Lua error the job is aborted
-- (comm.abort) so no rank waits forever in a collective.
local comm = require("muon.comm")

local H = { results = {} }

function H.init()
  H.world = comm.world()
  H.rank, H.size = H.world:rank(), H.world:size()
  return H.world
end

function H.check(name, cond, detail)
  local line = ("@@ %d %s %s%s"):format(H.rank or 0, cond and "ok" or "fail", name,
    detail and (" # " .. tostring(detail):gsub("\n", " | ")) or "")
  io.stdout:write(line, "\n")
  io.stdout:flush()
end

-- Whether tensors a and b hold the same values element by element (NaN
-- matching NaN), for bitwise comparisons with a one-process run; false and
-- the first differing element otherwise.
function H.bits_equal(a, b)
  if a:numel() ~= b:numel() then return false, "numel differs" end
  if a:numel() == 0 then return true end
  local fa, fb = a:contiguous():flat(), b:contiguous():flat()
  for i = 1, #fa do
    if fa[i] ~= fb[i] and not (fa[i] ~= fa[i] and fb[i] ~= fb[i]) then
      return false, ("element %d: %.17g vs %.17g"):format(i, fa[i], fb[i])
    end
  end
  return true
end

-- Run main() and report; abort the whole job on an unexpected error.
function H.main(fn)
  local ok, err = xpcall(fn, debug.traceback)
  if not ok then
    io.stdout:write(("@@ %d fail uncaught-error # %s\n"):format(H.rank or -1, tostring(err):gsub("\n", " | ")))
    io.stdout:flush()
    comm.abort(3)
    os.exit(3)
  end
  comm.finalize()
end

return H
