-- Distributed planning (HSDP): device mesh, placements, local shards,
-- Newton-Schulz owners, batch schedule, communication volumes, and the
-- cross-rank agreement check. Pure Lua, computed once at setup; the step
-- itself lives in muon.step (the protocol) and muon.router (the exchanges).
--
--   local dist = require("muon.dist")
--   local mesh = dist.mesh({ {"replicate", 2}, {"shard", 2} }, 4)
--   mesh:coords(3)                      --> {1, 1}  (0-based, last axis fastest)
--   local pl = dist.placement({ "replicate", {"shard", 1} }, mesh)   -- or {"R", "S(1)"}
--   local box = dist.local_box({10, 6}, pl, mesh, rank)   -- { start = {..0-based}, len = {..} }
--   dist.chunk(10, 4, i)                --> start, len of torch.chunk piece i (0-based)
--[[ reference muon.dist
    Distributed planning (HSDP), pure Lua, computed once at setup: the
    device mesh, placements, local shards, Newton-Schulz owners, the batch
    schedule, communication volumes, and the cross-rank agreement. Ranks
    and mesh coordinates are 0-based (MPI); tensor dims 1-based. Ranks map
    to mesh coordinates in row-major order (the last axis fastest), as
    torch's DeviceMesh.
    Its entries: meshes, placements and boxes in lua/muon/dist_mesh.lua,
    the plan in lua/muon/dist_plan.lua, split Newton-Schulz in
    lua/muon/dist_split.lua, the agreement in lua/muon/dist_agree.lua.
]]
-- One module name for four jobs, each in its own file (a part's names
-- starting with "_" are for the other parts only).
local D = {}
for _, part in ipairs({ "muon.dist_mesh", "muon.dist_plan", "muon.dist_split", "muon.dist_agree" }) do
  for k, v in pairs(require(part)) do
    if not k:find("^_") then D[k] = v end
  end
end
return D
