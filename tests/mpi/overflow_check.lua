-- A finite gradient whose momentum overflows on one rank only (the holder
-- of that part of the parameter), under mpirun:
--   build/muon run tests/mpi/overflow_check.lua MODE
-- MODE skip:  nonfinite = "skip": every rank skips the group in that step
--             (values and state unchanged, skipped_nonfinite = 1), the
--             other group steps, and the next step is bitwise the
--             one-process engine's
-- MODE error: nonfinite = "error": every rank fails with MU_ENONFINITE
--             naming the parameter, nothing changes
local H = require("mpi.harness")
local D = require("muon.dist")
local E = require("muon.errors")
local engine = require("muon.engine")

local mode = arg[1]

local function config(dist)
  return {
    groups = {
      { name = "hidden", optimizer = "muon", match = "^w", nonfinite = mode, momentum = 0.95 },
      { name = "other", optimizer = "muon", match = "^v", nonfinite = mode },
    },
    dist = dist and { mesh = { { "shard", H.size } } } or nil,
  }
end

local SHAPES = { w = { 8, 6 }, v = { 6, 6 } }

local bits_equal = H.bits_equal

H.main(function()
  H.init()
  local ref = engine.new(H.alone(config(false)))
  local eng = engine.new(config(true))
  local mesh, loc = H.add_dim1_sharded(ref, eng, { { "w", SHAPES.w, 11 }, { "v", SHAPES.v, 12 } })
  -- step s: small gradients; at step 2, 3e38 in rank 0's part of w only
  local function set_grads(s)
    H.set_dim1_grads(ref, loc, s, function(name, g)
      g:mul_(0.01)
      if s == 2 and name == "w" then D.box_view(g, H.dim1_box(SHAPES.w, mesh, 0)):fill(3e38) end
    end)
  end
  set_grads(1)
  eng:step()
  ref:step()
  local before = loc.w.value:clone()
  local v_before = loc.v.value:clone()
  set_grads(2)
  local ok, err = pcall(eng.step, eng)
  local rok, rerr = pcall(ref.step, ref)
  if mode == "skip" then
    H.check("skip-agreed", ok and rok, tostring(err or rerr))
    H.check("skip-unchanged", bits_equal(loc.w.value, before), "w changed")
    H.check("skip-counted", eng:stats().muon.skipped_nonfinite == 1 and ref:stats().muon.skipped_nonfinite == 1,
      eng:stats().muon.skipped_nonfinite)
    set_grads(3)
    eng:step()
    ref:step()
    H.check("after-skip-bitwise", bits_equal(loc.w.value, D.box_view(ref:param("w").value, loc.w.box):clone())
      and bits_equal(loc.v.value, D.box_view(ref:param("v").value, loc.v.box):clone()), "values differ from one process")
  else
    local msg = tostring(err)
    H.check("error-everywhere", not ok and E.code(err) == E.ENONFINITE
      and msg:find("parameter 'w': its gradient is finite but the momentum", 1, true) ~= nil, msg)
    H.check("error-one-process", not rok and E.code(rerr) == E.ENONFINITE, tostring(rerr))
    H.check("error-unchanged", bits_equal(loc.w.value, before) and bits_equal(loc.v.value, v_before), "a value changed")
  end
end)
