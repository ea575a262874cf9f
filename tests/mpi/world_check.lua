-- A run under mpirun without a mesh (tests/mpi/world.sh): every rank fails
-- each collective call (step, reduce_grads, clip_grad_norm, save, load)
-- naming the fix, nothing changed, no hang; dist = { independent = true }
-- steps each rank's own model; muon.world() lets one sandboxed config
-- build its mesh for any rank count; a Muon group whose match selects
-- nothing fails the first step on every rank of a mesh.
local H = require("mpi.harness")
local T = require("muon.tensor")
local E = require("muon.errors")
local engine = require("muon.engine")

local function config_file(text)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

H.main(function()
  H.init()
  local me, W = H.rank, H.size
  local GROUPS = "groups = { { name = 'hidden', min_dim = 2 }, { name = 'rest', optimizer = 'adamw' } }"

  do -- no dist: each collective call fails on this rank, naming the fix
    local path = config_file("return { " .. GROUPS .. " }\n")
    local eng = engine.new(path)
    local w = T.randn({ 6, 4 }, 1)
    local before = w:clone()
    eng:add_param("w", w, T.randn({ 6, 4 }, 2))
    for _, call in ipairs({ { "step" }, { "reduce_grads" }, { "clip_grad_norm", 1.0 }, { "save", path .. ".st" },
      { "load", path .. ".st" } }) do
      local ok, err = pcall(eng[call[1]], eng, call[2])
      local want = ("%s: this process is rank %d of %d (mpirun), but config '%s' has no dist section"):format(call[1],
        me, W, path)
      local good = not ok and E.code(err) == E.EINVAL and tostring(err):find(want, 1, true)
        and tostring(err):find("dist = { independent = true }", 1, true)
        and tostring(err):find(("dist = { mesh = { { \"replicate\", %d } } }"):format(W), 1, true)
      H.check("lone-" .. call[1] .. "-fails", good, tostring(err))
    end
    H.check("lone-nothing-changed", H.bits_equal(w, before) and eng:get("step") == 0)
    os.remove(path)
  end

  do -- dist = { independent = true }: each rank trains its own model
    local path = config_file("return { " .. GROUPS .. ", dist = { independent = true } }\n")
    local eng = engine.new(path)
    local w, g = T.randn({ 6, 4 }, 10 + me), T.randn({ 6, 4 }, 20 + me)
    eng:add_param("w", w, g)
    local ref = require("muon.optim").Muon({ require("muon.param")("w", w:clone(), g:clone()) }, { lr = 0.02 })
    eng:step()
    ref:step()
    H.check("independent-steps-its-own-model", H.bits_equal(w, ref.param_groups[1].params[1].value)
      and eng:get("step") == 1, "differs from one process")
    eng:save(path .. "." .. me .. ".st")
    H.check("independent-saves", true)
    os.remove(path .. "." .. me .. ".st")
    os.remove(path)
  end

  do -- muon.world() in a sandboxed config: its mesh for this rank count
    local path = config_file("local muon = require('muon')\nlocal w = muon.world()\n"
      .. "return { name = ('rank %d of %d'):format(w.rank, w.size), " .. GROUPS
      .. ", dist = { mesh = { { 'replicate', w.size } } } }\n")
    local eng = engine.new(path)
    H.check("world-in-config", eng.config.name == ("rank %d of %d"):format(me, W), eng.config.name)
    local w = T.randn({ 6, 4 }, 1)
    eng:add_param("w", w, T.randn({ 6, 4 }, 2 + me))
    eng:reduce_grads()
    eng:step()
    H.check("world-config-steps", eng:get("step") == 1)
    os.remove(path)
  end

  do -- eng:stats() on a sharded mesh: the whole parameters' figures, as one process measures them
    local D = require("muon.dist")
    local cfg = { groups = { { name = "hidden", min_dim = 2 }, { name = "rest", optimizer = "adamw" } } }
    local one = engine.new(H.alone({ groups = cfg.groups }))
    cfg.dist = { mesh = { { "shard", W } } }
    cfg.log = { level = "debug" }
    local eng = engine.new(cfg)
    local mesh = D.mesh({ { "shard", W } }, W)
    for i, shape in ipairs({ { 3 * W + 1, 5 }, { 7, 4 }, { 2 * W + 3 } }) do
      local v, g = T.randn(shape, i), T.randn(shape, 10 + i)
      one:add_param("p" .. i, v:clone(), g:clone())
      local box = D.local_box(shape, D.placement({ "S(1)" }, mesh, #shape), mesh, me)
      local pl = { "S(1)", shape = shape }
      eng:add_param("p" .. i, D.box_view(v, box):clone(), D.box_view(g, box):clone(), pl)
    end
    one:step()
    local said = require("helpers").stderr_of(function() eng:step() end)
    -- the seed's debug_rank0 line for the unevenly sharded ones, rank 0 only
    local want = ("muon: debug: [hyper-optimizer uneven-shard] p p1 placement (S(1)) device_mesh (shard=%d) "
      .. "local_shape [%d, 5] global_shape [%d, 5]"):format(W, select(2, D.chunk(3 * W + 1, W, 0)), 3 * W + 1)
    H.check("debug-uneven-shard-line", me == 0 and said:find(want, 1, true) ~= nil or me ~= 0 and said == "", said)
    local a, b = one:stats(), eng:stats()
    local close = function(x, y) return x and y and math.abs(x - y) <= 1e-6 * math.abs(y) end
    H.check("stats-grad-norm-as-one-process", close(b.grad_norm, a.grad_norm), b.grad_norm .. " vs " .. a.grad_norm)
    H.check("stats-update-rms-as-one-process", close(b.update_rms.hidden, a.update_rms.hidden)
      and close(b.update_rms.rest, a.update_rms.rest), tostring(b.update_rms.hidden) .. " vs " .. a.update_rms.hidden)
    H.check("stats-ns-residual-as-one-process", close(b.ns_residual, a.ns_residual) and b.ns_matrices == a.ns_matrices,
      tostring(b.ns_residual) .. " vs " .. tostring(a.ns_residual))
    H.check("stats-bytes-moved", b.bytes_sent > 0 and b.bytes_recv > 0)
  end

  do -- a Muon group whose match selects nothing, on a mesh: every rank fails
    local eng = engine.new({ groups = { { name = "hidden", match = "attn" }, { name = "rest", optimizer = "adamw" } },
      dist = { mesh = { { "replicate", W } } } })
    local w = T.randn({ 6, 4 }, 1)
    local before = w:clone()
    eng:add_param("mlp.w", w, T.randn({ 6, 4 }, 2))
    local ok, err = pcall(eng.step, eng)
    H.check("routing-error-on-every-rank", not ok and tostring(err):find("group 1 ('hidden') (muon: match = \"attn\") "
      .. "selects none of the 1 parameters", 1, true) and H.bits_equal(w, before), tostring(err))
  end
end)
