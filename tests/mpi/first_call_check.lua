-- The first communicator-building call failing on one rank only: rank 1's
-- first add_param (which builds the engine's communicators, a collective)
-- raises before it (a grad of the wrong shape), uncaught, while rank 0
-- enters it. The host aborts the job with rank 1's message: no hang.
--   build/muon run tests/mpi/first_call_check.lua add_param|open
local T = require("muon.tensor")
local engine = require("muon.engine")
local comm = require("muon.comm")
local me, W = comm.world():rank(), comm.world():size()
local how = arg[1]
local cfg = { groups = { { optimizer = "adamw", match = ".", lr = 0.01 } }, dist = { mesh = { { "world", W } } } }
if how == "open" and me == 1 then cfg.groups[1].lr = "fast" end -- engine.new fails on rank 1 only
local eng = engine.new(cfg)
eng:add_param("b", T.zeros({ 4 }), me == 1 and T.zeros({ 5 }) or T.zeros({ 4 }))
eng:step()
print("not-aborted")
