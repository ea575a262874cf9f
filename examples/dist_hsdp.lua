-- HSDP with the config engine: parameters sharded over one mesh axis and
-- replicated over the other, Newton-Schulz spread over all ranks.
--
--   mpirun -np 4 build/muon run examples/dist_hsdp.lua            (mesh 2 x 2)
--   mpirun -np 2 build/muon run examples/dist_hsdp.lua            (mesh 1 x 2)
--   build/muon run examples/dist_hsdp.lua [checkpoint path]       (one process)
--
-- The checkpoint goes to dist_hsdp.safetensors in the current directory
-- unless a path is given; the example runs from any directory.
--
-- (On a small shared machine add the Open MPI settings of the README, e.g.
-- OMPI_MCA_mpi_yield_when_idle=1.) Every run prints the same losses: the
-- distributed step is bitwise equal to the one-process step.
--
-- The toy problem: pull each weight matrix W towards a fixed target M with
-- loss 0.5 * ||W - M||^2, whose gradient W - M each rank computes on its own
-- shard. A real trainer fills the local grad buffers from its backward pass.
local muon = require("muon")
local T = require("muon.tensor")
local comm = require("muon.comm")
local dist = require("muon.dist")
local engine = require("muon.engine")
local foreach = require("muon.foreach")

local world = comm.world()
local rank, size = world:rank(), world:size()
local replicas = size % 2 == 0 and size > 2 and 2 or 1
local mesh_spec = { { "replicate", replicas }, { "shard", math.floor(size / replicas) } }

-- The shipped Muon config plus a mesh.
local cfg = dofile(muon.config_path("muon"))
cfg.dist = { mesh = mesh_spec }
local eng = engine.new(cfg)

-- Parameters: global shape and placement per mesh axis (replicate axis, shard axis).
local model = {
  { "layers.0.attn.qkv", { 96, 32 }, { "R", "S(1)" } },
  { "layers.0.attn.out", { 32, 32 }, { "R", "S(2)" } },
  { "layers.0.mlp.up", { 128, 32 }, { "R", "S(1)" } },
  { "layers.0.mlp.down", { 32, 128 }, { "R", "S(2)" } },
  { "layers.0.experts", { 4, 32, 16 }, { "R", "S(1)" } }, -- a stack of 4 experts
  { "layers.0.conv", { 24, 1, 9 }, { "R", "S(1)" } },     -- conv-like A x 1 x B
  { "layers.0.norm.bias", { 32 }, { "R", "R" } },         -- 1-D: AdamW
  { "embed", { 50, 32 }, { "R", "S(1)" } },               -- AdamW, sharded
}
local mesh = dist.mesh(mesh_spec, size)
local shards = {}
for i, m in ipairs(model) do
  local name, shape, placement = m[1], m[2], m[3]
  local pl = dist.placement(placement, mesh, #shape)
  local box = dist.local_box(shape, pl, mesh, rank)
  local function local_part(full)
    local v = full
    for d = 1, #shape do
      if box.len[d] ~= shape[d] then v = v:narrow(d, box.start[d] + 1, box.len[d]) end
    end
    return v:clone()
  end
  local empty = dist.numel(box.len) == 0
  local value = empty and T.zeros(box.len) or local_part(T.randn(shape, i))
  local target = empty and T.zeros(box.len) or local_part(T.randn(shape, 100 + i))
  local grad = T.zeros(box.len)
  -- placement: one entry per mesh axis, plus the global shape.
  eng:add_param(name, value, grad, { placement[1], placement[2], shape = shape })
  -- Count each distinct shard once: on the rank at coordinate 0 of every axis that replicates it.
  local first = true
  for a, p in ipairs(pl) do
    if p.kind == "R" and mesh:coords(rank)[a] ~= 0 then first = false end
  end
  shards[#shards + 1] = { value = value, target = target, grad = grad, replica0 = first }
end

for step = 1, 30 do
  -- grad = W - M on the local shard; loss summed once per distinct shard.
  local loss = 0
  for _, s in ipairs(shards) do
    if s.value:numel() > 0 then
      s.grad:copy(s.value)
      foreach.apply({ s.grad }, { s.target }, nil, 1.0, -1.0)
      if s.replica0 then loss = loss + 0.5 * s.grad:norm() ^ 2 end
    end
  end
  loss = world:allreduce({ loss }, "sum", "f64")[1]
  -- HSDP: each replica's backward pass saw its own data, so the trainer
  -- averages the gradients over the replicate axis before the step (the
  -- same bits on every replica). Here the replicas compute the same
  -- gradient, whose mean is itself: every world size prints the same losses.
  eng:reduce_grads({ op = "mean" })
  eng:step()
  if rank == 0 and (step == 1 or step % 10 == 0) then
    print(("step %2d  loss %.6f  lr %.5f"):format(step, loss, eng:get("lr")))
  end
end

local cs = eng:comm_stats()
local bytes = world:allreduce({ cs.data.bytes_sent }, "sum")[1]
if rank == 0 then
  print(("%d ranks, mesh %s: gradient reduction and NS routing moved %d bytes in total over 30 steps (%.1f KB per step per rank)")
    :format(size, mesh:describe(), bytes, bytes / 30 / size / 1024))
end
local path = arg and arg[1] or "dist_hsdp.safetensors"
eng:save(path) -- one file of full tensors, loadable at any world size
if rank == 0 then print("saved " .. path) end
