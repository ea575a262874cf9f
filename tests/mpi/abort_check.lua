-- Rank 1 raises an uncaught error while the others wait in a collective:
-- the host (muon run) must abort the job instead of hanging.
local comm = require("muon.comm")
local w = comm.world()
if w:rank() == 1 then error("deliberate failure on rank 1") end
w:barrier()
print("@@ " .. w:rank() .. " fail not-aborted")
comm.finalize()
