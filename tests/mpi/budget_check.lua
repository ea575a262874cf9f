-- The hook budget on a mesh: a sandboxed config whose hook misbehaves on
-- one rank only (rank 1, found by the config itself from
-- OMPI_COMM_WORLD_RANK) at step 2, under mpirun:
--   build/muon run tests/mpi/budget_check.lua
-- For each hook (post_update_fn, post_ortho_fn, momentum_update_fn,
-- schedule) and misbehaviour (an endless loop, a huge allocation, a deep
-- recursion, nested library calls): every rank fails the step within the
-- limit with the failing rank's error (its code, the hook, the parameter
-- and the limit), nothing changed on any rank (values, state, hook state,
-- step count), no rank hangs; the step then passes and every rank's values
-- are bitwise those of a twin engine that never failed.
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local E = require("muon.errors")
local engine = require("muon.engine")

local BAD_RANK -- (rank 1; rank 0 when run alone)
local MISBEHAVE = {
  loop = "while true do end",
  alloc = "local t = {} for i = 1, 1e9 do t[i] = { i } end",
  deep = "local function f(n) return 1 + f(n + 1) end f(1)",
  nest = "local function f() return (string.gsub('x', 'x', f)) end f()",
}
local LIMIT = {
  loop = { E.ELUA, "exceeded the hook budget of 20000000 Lua instructions (hook_budget.instructions; endless loop?)" },
  alloc = { E.ENOMEM, "exceeded the hook memory limit of 16777216 bytes of Lua heap (hook_budget.memory)" },
  deep = { E.ENOMEM, "Lua stack overflow: calls nested deeper than the Lua stack allows" },
  nest = { E.ENOMEM, "C stack: nested library calls deeper than 100 (string.gsub)" },
}
local SUBJECT = { post_update_fn = "parameter 'w", post_ortho_fn = "parameter 'w",
  momentum_update_fn = "parameters 'w1', 'w2'", schedule = "group 1 ('m')" }

local function config_text(hook, kind)
  return (([[
local bad = tonumber(os.getenv('OMPI_COMM_WORLD_RANK') or '0') == %d
local cur, done = 0, false
local function misbehave(hook)
  if hook == HOOK and cur == 2 and bad and not done then
    done = true
    %s
  end
end
return {
  hook_budget = { instructions = 2e7, seconds = 60, memory = 2^24 },
  schedule = function(step, g)
    cur = step
    misbehave('schedule')
    return g.base_lr * (1 - 0.01 * step)
  end,
  groups = {
    { name = 'm', optimizer = 'muon', match = '^w', lr = 0.02, hook_state = { s = 'rows' },
      post_update_fn = function(p, w, ctx) misbehave('post_update_fn') w:mul_(0.999) end,
      post_ortho_fn = function(O, state, ctx) misbehave('post_ortho_fn') state.s:add_(1) end,
      momentum_update_fn = function(grads, bufs, m1, m2)
        misbehave('momentum_update_fn')
        local out = {}
        for i, g in ipairs(grads) do bufs[i]:mul_(m2):add_(g) out[i] = g:add(bufs[i]:mul(m1)) end
        return out
      end },
    { name = 'a', optimizer = 'adamw', match = '^b', lr = 1e-3 },
  },
  dist = { mesh = { { 'shard', %d } } },
}
]]):format(BAD_RANK, MISBEHAVE[kind] or "", H.size):gsub("HOOK", "'" .. hook .. "'"))
end

local SHAPES = { w1 = { 6, 4 }, w2 = { 4, 5 }, b = { 7 } }
local NAMES = { "w1", "w2", "b" }

local bits_equal = H.bits_equal

-- An engine of the config on the mesh: its local parts, their grads.
local function build(hook, kind)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(config_text(hook, kind))
  f:close()
  local eng = engine.new(path)
  os.remove(path)
  local mesh = D.mesh({ { "shard", H.size } }, H.size)
  local loc = {}
  for i, name in ipairs(NAMES) do
    local shape = SHAPES[name]
    local pl = { { "shard", 1 } }
    local box = D.local_box(shape, D.placement(pl, mesh, #shape), mesh, H.rank)
    local value = D.box_view(T.randn(shape, i), box):clone()
    local grad = T.zeros(box.len)
    pl.shape = shape
    eng:add_param(name, value, grad, pl)
    loc[name] = { value = value, grad = grad, box = box }
  end
  local function grads(step)
    for i, name in ipairs(NAMES) do
      loc[name].grad:copy(D.box_view(T.randn(SHAPES[name], 100 * step + i), loc[name].box))
    end
  end
  return eng, loc, grads
end

-- This rank's values and held state, as one comparable list of tensors.
local function snapshot(eng, loc)
  local s = { step = eng:get("step") }
  for _, name in ipairs(NAMES) do
    s[#s + 1] = loc[name].value:clone()
    local st = eng:state(name)
    local keys = {}
    for k, v in pairs(st or {}) do if T.is_tensor(v) then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do s[#s + 1] = st[k]:clone() end
  end
  return s
end

local function same(a, b)
  if a.step ~= b.step or #a ~= #b then return false end
  for i = 1, #a do
    if not bits_equal(a[i], b[i]) then return false end
  end
  return true
end

H.main(function()
  H.init()
  BAD_RANK = math.min(1, H.size - 1)
  local prefix = H.size > 1 and ("rank %d: "):format(BAD_RANK) or "" -- (the failing rank's error, everywhere)
  for _, hook in ipairs({ "post_update_fn", "post_ortho_fn", "momentum_update_fn", "schedule" }) do
    for _, kind in ipairs({ "loop", "alloc", "deep", "nest" }) do
      local name = hook .. "-" .. kind
      local eng, loc, grads = build(hook, kind)
      local ref, rloc, rgrads = build(hook, "none")
      local ok_all, why = true, nil
      local function fail(msg) if ok_all then ok_all, why = false, msg end end
      for step = 1, 3 do
        grads(step); rgrads(step)
        local before = snapshot(eng, loc)
        local t0 = os.clock()
        local ok, err = pcall(eng.step, eng)
        local spent = os.clock() - t0
        if step == 2 then
          local msg = tostring(err)
          if ok then fail("step 2 passed")
          elseif E.code(err) ~= LIMIT[kind][1] then fail("code " .. tostring(E.code(err)) .. ": " .. msg)
          elseif not msg:find(prefix .. hook .. ": " .. SUBJECT[hook], 1, true)
            or not msg:find(LIMIT[kind][2], 1, true) then fail("message: " .. msg) end
          if spent > 30 then fail(("the failing step took %.1f s"):format(spent)) end
          if not same(before, snapshot(eng, loc)) then fail("the failed step changed something") end
          local ok2, err2 = pcall(eng.step, eng)
          if not ok2 then fail("the step again: " .. tostring(err2)) end
        elseif not ok then
          fail("step " .. step .. ": " .. tostring(err))
        end
        ref:step()
        if not same(snapshot(ref, rloc), snapshot(eng, loc)) then fail("step " .. step .. ": differs from the twin") end
      end
      H.check(name, ok_all, why)
    end
  end
end)
