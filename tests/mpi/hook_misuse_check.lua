-- Hooks that misbehave on a mesh, on one rank only (the owner of a
-- matrix for pre_ortho_fn / post_ortho_fn, the last rank for
-- post_update_fn): a write into ctx (ctx.region, ctx.logical_shape,
-- ctx.box, ctx.signals), a write into post_update_fn's parameter, a
-- coroutine.yield. Every rank fails the step with that hook's message,
-- nothing changes, no rank hangs; then describe() is as before, save and
-- load work, and the steps are bitwise the one-process engine's.
--   build/muon run tests/mpi/hook_misuse_check.lua PATH
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local E = require("muon.errors")
local engine = require("muon.engine")

local path = arg[1]

-- live.misuse = { hook, f } makes hook call f(args...) (eng's hooks only).
local function config(dist, live)
  local function hook(name)
    return function(...)
      local m = live.misuse
      if m and m[1] == name and (name ~= "post_update_fn" or H.rank == H.size - 1) then m[2](...) end
    end
  end
  return {
    groups = {
      { optimizer = "muon", match = "^w", lr = 0.02, pre_ortho_fn = hook("pre_ortho_fn"),
        post_ortho_fn = hook("post_ortho_fn"), post_update_fn = hook("post_update_fn") },
      { optimizer = "adamw", match = "^b", lr = 0.01 },
    },
    dist = dist and { mesh = { { "shard", H.size } } } or nil,
  }
end

local SHAPES = { w1 = { 8, 6 }, w2 = { 5, 7 }, b = { 6, 4 } }

H.main(function()
  H.init()
  local live = {}
  local ref, eng = engine.new(H.alone(config(false, {}))), engine.new(config(true, live))
  local mesh, loc = H.add_dim1_sharded(ref, eng, { { "w1", SHAPES.w1, 11 }, { "w2", SHAPES.w2, 12 },
    { "b", SHAPES.b, 13 } })
  for _, e in ipairs({ ref, eng }) do e:set_signal("s", { 1, 2, 3 }) end
  local function snapshot()
    local parts = { tostring(eng:get("step")) }
    for _, name in ipairs({ "w1", "w2", "b" }) do
      parts[#parts + 1] = table.concat(loc[name].value:flat(), ",")
      for k, v in pairs(eng:state(name) or {}) do
        if T.is_tensor(v) then parts[#parts + 1] = k .. "=" .. table.concat(v:flat(), ",") end
      end
    end
    table.sort(parts)
    return table.concat(parts, ";")
  end
  local function shapes()
    local s = {}
    for _, row in ipairs(eng:describe()) do s[#s + 1] = row.name .. table.concat(row.shape, "x") end
    return table.concat(s, " ")
  end
  local described = shapes()
  local steps = 0
  local function step_both()
    steps = steps + 1
    H.set_dim1_grads(ref, loc, steps)
    H.ref_step(ref)
    return pcall(eng.step, eng)
  end
  local cases = {
    { "region-set", "post_ortho_fn", function(_, _, ctx) ctx.region = { start = { 0 } } end,
      "post_ortho_fn: cannot set ctx.region: a hook's ctx is read-only" },
    { "region-start", "post_ortho_fn", function(_, _, ctx) ctx.region.start[1] = 5 end,
      "post_ortho_fn: changed ctx.region.start[1] (0 -> 5)" },
    { "logical-shape", "pre_ortho_fn", function(_, _, ctx) ctx.logical_shape[1] = 2 * ctx.logical_shape[1] end,
      "pre_ortho_fn: changed ctx.logical_shape[1]" },
    { "box-start", "post_update_fn", function(_, _, ctx) ctx.box.start[1] = 99 end,
      "post_update_fn: changed ctx.box.start[1]" },
    { "box-len", "post_update_fn", function(_, _, ctx) ctx.box.len = { 1, 1 } end, "post_update_fn: changed ctx.box.len" },
    { "signal", "post_update_fn", function(_, _, ctx) ctx.signals.s[2] = 7 end, "changed ctx.signals.s[2] (2 -> 7)" },
    { "param-value", "post_update_fn", function(p) p.value = T.zeros({ 1 }) end,
      "post_update_fn: cannot set param.value: post_update_fn's parameter is read-only" },
    { "param-shape", "post_update_fn", function(p) p.logical_shape[1] = 0 end,
      "post_update_fn: changed param.logical_shape[1]" },
    { "yield-owner", "post_ortho_fn", function() coroutine.yield() end,
      "post_ortho_fn: coroutine.yield inside a hook: a hook must return, not yield" },
    { "yield-last-rank", "post_update_fn", function() coroutine.yield() end,
      "post_update_fn: coroutine.yield inside a hook: a hook must return, not yield" },
  }
  local ok, err = step_both()
  H.check("first-step", ok, not ok and tostring(err) or nil)
  for _, c in ipairs(cases) do
    local before = snapshot()
    live.misuse = { c[2], c[3] }
    H.set_dim1_grads(ref, loc, steps + 1)
    local co = coroutine.create(function() return eng:step() end)
    local ok2, err2 = coroutine.resume(co)
    live.misuse = nil
    local msg = tostring(err2)
    H.check(c[1] .. "-fails-everywhere", not ok2 and coroutine.status(co) == "dead" and E.code(err2) == E.ELUA
      and msg:find(c[4], 1, true) ~= nil, msg)
    H.check(c[1] .. "-nothing-changed", snapshot() == before and shapes() == described)
  end
  -- the engine goes on: save, load, steps bitwise one process's
  eng:save(path)
  eng:load(path)
  ok, err = step_both()
  H.check("then-steps", ok, not ok and tostring(err) or nil)
  local same = true
  for name, l in pairs(loc) do
    same = same and H.bits_equal(l.value, D.box_view(ref:param(name).value, l.box):clone())
  end
  H.check("then-bitwise-one-process", same)
  H.check("describe-unchanged", shapes() == described, shapes())
  if H.rank == 0 then os.remove(path) end
  H.check("mesh", mesh ~= nil)
end)
