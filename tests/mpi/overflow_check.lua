-- A finite gradient whose momentum overflows on one rank only (the holder
-- of that part of the parameter), under mpirun:
--   build/muon run tests/mpi/overflow_check.lua MODE [STATE_DTYPE]
-- MODE skip:  nonfinite = "skip": every rank skips the group in that step
--             (values and state unchanged, skipped_nonfinite = 1), the
--             other group steps, and the next step is bitwise the
--             one-process engine's
-- MODE error: nonfinite = "error": every rank fails with MU_ENONFINITE
--             naming the parameter, nothing changes
-- STATE_DTYPE bfloat16: the momentum is float32-finite (3.397e38, no
--             nesterov) and overflows only when rounded to the bfloat16
--             state
-- MODE load:  a checkpoint whose state is Inf once converted to bfloat16,
--             or below AdamW's invariant (exp_avg_sq < 0), fails the load
--             on every rank naming the tensor and the file; nothing changes
local H = require("mpi.harness")
local D = require("muon.dist")
local E = require("muon.errors")
local engine = require("muon.engine")

local mode, sd = arg[1], arg[2] or "float32"
local bf16 = sd == "bfloat16"

local function config(dist)
  return {
    groups = {
      { name = "hidden", optimizer = "muon", match = "^w", nonfinite = mode, momentum = 0.95, state_dtype = sd,
        nesterov = not bf16 },
      { name = "other", optimizer = "muon", match = "^v", nonfinite = mode },
    },
    dist = dist and { mesh = { { "shard", H.size } } } or nil,
  }
end

local function load_mode()
  local function cfg(dist, dtype)
    return { groups = { { optimizer = "muon", match = "^w", state_dtype = dtype }, { optimizer = "adamw", match = "^v" } },
      dist = dist and { mesh = { { "shard", H.size } } } or nil }
  end
  local ref, eng = engine.new(H.alone(cfg(false, "float32"))), engine.new(cfg(true, "bfloat16"))
  local _, loc = H.add_dim1_sharded(ref, eng, { { "w", { 8, 6 }, 11 }, { "v", { 6, 6 }, 12 } })
  H.set_dim1_grads(ref, loc, 1)
  ref:step()
  eng:step()
  local path = H.world:bcast_string(H.rank == 0 and os.tmpname() or "", 0)
  for _, c in ipairs({
    { "above-bf16", function(s) s.w.momentum_buffer:set(3.397e38, 3, 2) end,
      "state tensor 'muon/w/momentum_buffer' holds NaN or Inf once converted from float32 to bfloat16" },
    { "negative-exp-avg-sq", function(s) s.v.exp_avg_sq:set(-1, 2, 2) end,
      "state tensor 'adamw/v/exp_avg_sq' holds -1 (element 8), below 0, which AdamW's exp_avg_sq never is" },
  }) do
    if H.rank == 0 then
      local keep = { w = ref:state("w").momentum_buffer:clone(), v = ref:state("v").exp_avg_sq:clone() }
      c[2]({ w = ref:state("w"), v = ref:state("v") })
      ref:save(path)
      ref:state("w").momentum_buffer:copy(keep.w)
      ref:state("v").exp_avg_sq:copy(keep.v)
    end
    H.world:barrier()
    local before = loc.w.value:clone()
    local mom = eng:state("w") and eng:state("w").momentum_buffer:clone("float32")
    local ok, err = pcall(eng.load, eng, path)
    local msg = tostring(err)
    H.check(c[1] .. "-load-fails-everywhere", not ok and E.code(err) == E.EFORMAT
      and msg:find("checkpoint '" .. path .. "': " .. c[3], 1, true) ~= nil, msg)
    H.check(c[1] .. "-load-changes-nothing", eng:get("step") == 1 and H.bits_equal(loc.w.value, before)
      and (mom == nil or H.bits_equal(eng:state("w").momentum_buffer:clone("float32"), mom)))
    H.world:barrier()
  end
  if H.rank == 0 then os.remove(path) end
end

local SHAPES = { w = { 8, 6 }, v = { 6, 6 } }

local bits_equal = H.bits_equal

H.main(function()
  H.init()
  if mode == "load" then return load_mode() end
  local ref = engine.new(H.alone(config(false)))
  local eng = engine.new(config(true))
  local mesh, loc = H.add_dim1_sharded(ref, eng, { { "w", SHAPES.w, 11 }, { "v", SHAPES.v, 12 } })
  -- step s: small gradients; at step 2, 3e38 in rank 0's part of w only
  local function set_grads(s)
    H.set_dim1_grads(ref, loc, s, function(name, g)
      g:mul_(0.01)
      if s == 2 and name == "w" then D.box_view(g, H.dim1_box(SHAPES.w, mesh, 0)):fill(bf16 and 3.397e38 or 3e38) end
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
      and msg:find(bf16 and "parameter 'w': its gradient is finite but the momentum_buffer overflowed to "
        .. "NaN or Inf in bfloat16" or "parameter 'w': its gradient is finite but the momentum", 1, true) ~= nil, msg)
    H.check("error-one-process", not rok and E.code(rerr) == E.ENONFINITE, tostring(rerr))
    H.check("error-unchanged", bits_equal(loc.w.value, before) and bits_equal(loc.v.value, v_before), "a value changed")
  end
end)
