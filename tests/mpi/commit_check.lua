-- What the commit writes, checked on a mesh (tests/commit_spec.lua has one
-- process): a post_ortho_fn leaving NaN in the hook state of a parameter
-- sharded over the ranks (the state's part on its holders), and a
-- parameter whose part on rank 0 only holds NaN.
--   build/muon run tests/mpi/commit_check.lua hook error|skip
--   build/muon run tests/mpi/commit_check.lua param error
--   build/muon run tests/mpi/commit_check.lua post error|skip   (post_update_fn
--            leaving NaN in rank 0's piece of w)
-- error: every rank fails with MU_ENONFINITE naming the parameter and the
-- tensor, nothing changed; skip: every rank skips the group (counted),
-- nothing of it changed, and the next step is bitwise one process's.
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local E = require("muon.errors")
local engine = require("muon.engine")

local what, policy = arg[1], arg[2]
local SHAPES = { w = { 8, 6 }, v = { 6, 6 } }

local function config(dist)
  local n, m = 0, 0
  local w = { optimizer = "muon", match = "^w", nonfinite = policy, hook_state = { s = "matrix" },
    post_ortho_fn = function(x, state)
      n = n + 1
      state.s:mul(0.5):add(x)
      if n == 2 and what == "hook" then state.s:view({ 48 }):narrow(1, 48, 1):fill(0 / 0) end
    end }
  if what == "post" then -- NaN in the first element of w, on the rank holding it
    w.post_update_fn = function(_, x, ctx)
      m = m + 1
      if m == 2 and x:numel() > 0 and ctx.box.start[1] == 1 and ctx.box.start[2] == 1 then
        x:view({ x:numel() }):narrow(1, 1, 1):fill(0 / 0)
      end
    end
  end
  return {
    groups = { w, { optimizer = "muon", match = "^v", nonfinite = policy } },
    dist = dist and { mesh = { { "shard", H.size } } } or nil,
  }
end

local bits_equal = H.bits_equal

H.main(function()
  H.init()
  local me = H.rank
  local ref = engine.new(H.alone(config(false)))
  local eng = engine.new(config(true))
  local mesh, loc = H.add_dim1_sharded(ref, eng, { { "w", SHAPES.w, 11 }, { "v", SHAPES.v, 12 } })
  local function set_grads(s) H.set_dim1_grads(ref, loc, s) end
  local function snapshot(e)
    local parts = {}
    for _, name in ipairs({ "w", "v" }) do
      parts[#parts + 1] = table.concat(e:param(name).value:flat(), ",")
      for k, t in pairs(e:state(name) or {}) do
        if T.is_tensor(t) then parts[#parts + 1] = k .. "=" .. table.concat(t:flat(), ",") end
      end
    end
    table.sort(parts)
    return table.concat(parts, ";")
  end
  set_grads(1)
  eng:step()
  ref:step()
  if what == "param" then -- rank 0's part of v only
    local full = ref:param("v").value
    local b0 = H.dim1_box(SHAPES.v, mesh, 0)
    D.box_view(full, b0):view({ D.numel(b0.len) }):narrow(1, 1, 1):fill(0 / 0)
    if me == 0 then loc.v.value:view({ loc.v.value:numel() }):narrow(1, 1, 1):fill(0 / 0) end
  end
  local before, rbefore = snapshot(eng), snapshot(ref)
  set_grads(2)
  local ok, err = pcall(eng.step, eng)
  local rok, rerr = pcall(ref.step, ref)
  local want = ({ hook = "parameter 'w': hook state 's' (pre_ortho_fn / post_ortho_fn) would hold NaN or Inf",
    param = "parameter 'v': the step would leave NaN or Inf in the parameter",
    post = "parameter 'w': post_update_fn left NaN or Inf in the parameter" })[what]
  if policy == "error" then
    local msg = tostring(err)
    H.check(what .. "-error-everywhere", not ok and E.code(err) == E.ENONFINITE and msg:find(want, 1, true) ~= nil, msg)
    H.check(what .. "-error-one-process", not rok and E.code(rerr) == E.ENONFINITE
      and tostring(rerr):find(want, 1, true) ~= nil, tostring(rerr))
    H.check(what .. "-error-unchanged", snapshot(eng) == before and snapshot(ref) == rbefore)
  else
    H.check(what .. "-skip-agreed", ok and rok, tostring(err or rerr))
    H.check(what .. "-skip-counted", eng:stats().muon.skipped_nonfinite == 1 and ref:stats().muon.skipped_nonfinite == 1)
    H.check(what .. "-skip-w-unchanged", bits_equal(loc.w.value, D.box_view(ref:param("w").value, loc.w.box):clone()))
    set_grads(3)
    eng:step()
    ref:step()
    H.check(what .. "-after-skip-bitwise", bits_equal(loc.w.value, D.box_view(ref:param("w").value, loc.w.box):clone())
      and bits_equal(loc.v.value, D.box_view(ref:param("v").value, loc.v.box):clone()))
  end
end)
