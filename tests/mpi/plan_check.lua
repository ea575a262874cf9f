-- `muon check --world N --rank R` against a real run (tests/mpi/plan.sh):
-- every rank plans itself in-process the way the CLI does
-- (muon.check_world) and compares the figures with its real engine's
-- plan, its measured state bytes (eng:memory()) and the data bytes it
-- sends and receives in one step (comm_stats).
--   mpirun -np N build/muon run tests/mpi/plan_check.lua CONFIG SHAPES MESH
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local engine = require("muon.engine")
local check = require("muon.check")
local CW = require("muon.check_world")

H.main(function()
  local w = H.init()
  local cfg, shapes_path, mesh_arg = arg[1], arg[2], arg[3]
  local shapes = assert(check.read_shapes(shapes_path))
  local text, problems, f = CW.run(cfg, shapes, { world = H.size, rank = H.rank, mesh = mesh_arg })
  H.check("check-world-runs", #problems == 0 and f ~= nil, table.concat(problems, "; "))
  local eng = engine.new(cfg)
  local axes = CW.parse_mesh(mesh_arg)
  local mesh = D.mesh(axes, H.size)
  local grads = {}
  for i, s in ipairs(shapes) do
    local pl = {}
    for a, ax in ipairs(mesh.axes) do pl[a] = (ax.name:match("^shard") and #s.shape >= 1) and "S(1)" or "R" end
    if s.placement then pl = s.placement end
    local box = D.local_box(s.shape, D.placement(pl, mesh, #s.shape), mesh, H.rank)
    local v = T.randn(box.len, i)
    grads[i] = T.randn(box.len, 100 + i)
    local spec = { shape = s.shape }
    for a = 1, #pl do spec[a] = pl[a] end
    eng:add_param(s.name, v, grads[i], spec)
  end
  eng:step()
  local st0 = eng:comm_stats().data
  eng:step()
  local st1 = eng:comm_stats().data
  local real = CW.figures(eng.stepper.plan)
  local function same(key, a, b) H.check("figure-" .. key, a == b, ("check says %s, the run %s"):format(tostring(a), tostring(b))) end
  for _, k in ipairs({ "held", "state_held", "owned_ns", "owned_elementwise", "state_bytes", "ns_flops", "bytes_sent",
                       "bytes_recv", "imbalance" }) do
    same(k, f[k], real[k])
  end
  same("state-bytes-measured", f.state_bytes, eng:memory().state_bytes)
  same("bytes-sent-measured", f.bytes_sent, st1.bytes_sent - st0.bytes_sent)
  same("bytes-recv-measured", f.bytes_recv, st1.bytes_recv - st0.bytes_recv)
  H.check("check-world-text", text:find(("plan of rank %d of %d"):format(H.rank, H.size), 1, true) ~= nil, text)
  w:barrier()
end)
