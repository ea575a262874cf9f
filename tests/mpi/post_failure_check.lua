-- A post_update_fn that fails on one rank only changes nothing on any
-- rank (the step computes, then commits):
--   build/muon run tests/mpi/post_failure_check.lua RANK
-- Three parameters sharded on dim 1 over { shard, N }: w (Muon, with
-- pre_ortho_fn keeping hook state and post_update_fn), v (Muon, no hook:
-- the direct path) and b (AdamW). At step 1 the hooks keep a view of
-- their tensor, the param table post_update_fn got and the hook state; at
-- step 3, on every rank, they write through all of them and into this
-- step's tensor, and post_update_fn on rank RANK then fails: raising
-- ("error"), leaving NaN in its piece ("nan", nonfinite = "error") or
-- running out of its hook budget ("budget"). Every rank must fail, with
-- its parameters, state (hook state included), step counts and counters
-- bitwise as before; the next step then matches, bitwise, a one-process
-- run that never took the failed step.
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local E = require("muon.errors")
local engine = require("muon.engine")

local fail_rank = tonumber(arg[1])
local SHAPES = { w = { 8, 6 }, v = { 6, 6 }, b = { 10 } }

-- fail: a failing run (on a mesh), else the one-process reference.
local function config(mode, fail, dist)
  local n, m = 0, 0
  local kept = {}
  local cfg = { groups = {
    { optimizer = "muon", match = "^w", hook_state = { s = "matrix" },
      pre_ortho_fn = function(x, state)
        n = n + 1
        state.s:mul(0.5):add(x)
        if n == 1 then kept.state = state.s end
        if fail and n == 3 then kept.state:fill(9) end
      end,
      post_update_fn = function(p, x, ctx)
        m = m + 1
        local norm = ctx.global_norm(x) -- (a reduction: a collective on the mesh)
        if m == 1 then kept.p, kept.view = p, x:numel() > 0 and x:narrow(1, 1, 1) or nil end
        if fail and m == 3 then
          kept.p.value:fill(7)
          if kept.view then kept.view:fill(-7) end
          x:fill(norm)
          if H.rank == fail_rank then
            if mode == "error" then error("post_update_fn fails on rank " .. H.rank) end
            if mode == "nan" then x:fill(0 / 0) end
            if mode == "budget" then while true do end end
          end
        end
      end },
    { optimizer = "muon", match = "^v" },
    { optimizer = "adamw", match = "^b", lr = 0.01 } },
    hook_budget = { instructions = 1e7 },
    dist = dist and { mesh = { { "shard", H.size } } } or nil }
  return cfg
end

local function snapshot(e)
  local parts = { tostring(e:get("step")) }
  for _, name in ipairs({ "w", "v", "b" }) do
    parts[#parts + 1] = name .. "=" .. table.concat(e:param(name).value:flat(), ",")
    local keys = {}
    for k in pairs(e:state(name) or {}) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local t = e:state(name)[k]
      parts[#parts + 1] = name .. "/" .. k .. "=" .. (T.is_tensor(t) and table.concat(t:flat(), ",") or tostring(t))
    end
  end
  local st = e:stats()
  for _, k in ipairs({ "muon", "adamw" }) do parts[#parts + 1] = k .. ":" .. st[k].steps .. "/" .. st[k].skipped_nonfinite end
  return table.concat(parts, ";")
end

H.main(function()
  H.init()
  for _, mode in ipairs({ "error", "nan", "budget" }) do
    local ref = engine.new(H.alone(config(mode, false, false)))
    local eng = engine.new(config(mode, true, true))
    local _, loc = H.add_dim1_sharded(ref, eng, { { "w", SHAPES.w, 11 }, { "v", SHAPES.v, 12 }, { "b", SHAPES.b, 13 } })
    for s = 1, 2 do
      H.set_dim1_grads(ref, loc, s)
      eng:step()
      H.ref_step(ref)
    end
    H.set_dim1_grads(ref, loc, 3)
    local before = snapshot(eng)
    local ok, err = pcall(eng.step, eng)
    local want = ({ error = "post_update_fn fails on rank " .. fail_rank,
      nan = "parameter 'w': post_update_fn left NaN or Inf in the parameter",
      budget = "exceeded the hook budget" })[mode]
    H.check(mode .. "-fails-everywhere", not ok and tostring(err):find(want, 1, true) ~= nil
      and E.code(err) == (mode == "nan" and E.ENONFINITE or E.ELUA), tostring(err))
    H.check(mode .. "-nothing-changed", snapshot(eng) == before)
    -- the next step: as a one-process run without the failed one
    H.set_dim1_grads(ref, loc, 4)
    local ok4, err4 = pcall(eng.step, eng)
    local rok = H.ref_step(ref)
    local same = ok4 and rok
    for name, l in pairs(loc) do
      same = same and H.bits_equal(l.value, D.box_view(ref:param(name).value, l.box):clone())
    end
    H.check(mode .. "-then-as-one-process", same, tostring(err4))
  end
end)
