-- One rank dies while the others wait in a collective; the job must end
-- with a non-zero code (tests/mpi/faults.sh), never hang.
--   muon run tests/mpi/rank_death_check.lua exit|segv
local comm = require("muon.comm")
local how = arg and arg[1] or "exit"
local w = comm.world()
if w:rank() == 1 then
  io.stdout:flush()
  if how == "segv" then
    local ffi = require("ffi")
    ffi.cast("volatile int *", 0)[0] = 1 -- a real SIGSEGV (null store)
  else
    os.exit(3) -- exit without MPI_Finalize
  end
end
w:barrier()
print("@@ " .. w:rank() .. " fail not-aborted")
comm.finalize()
