-- What bounds a sandboxed config besides its way out (sandbox_spec):
--   1. nesting: every library call that calls back into Lua from C counts
--      towards one depth limit, so that a config cannot overflow the C stack
--      (string.gsub whose replacement calls gsub again used to SIGSEGV the
--      host). Each reproducer fails with MU_ENOMEM "C stack: nested library
--      calls deeper than 100" at load time (engine.new, mu_engine_open,
--      muon check) and inside a hook at step time (eng:step, mu_engine_step);
--   2. the hook budget: one call of the host into a config function at
--      step time (hook, schedule) is bounded in instructions, CPU time and
--      Lua heap growth (hook_budget); exceeding a limit fails the step with
--      nothing changed, naming the hook, the parameter and the limit; deep
--      recursion and exhausted memory are MU_ENOMEM with a message.
-- (The same on a mesh, one rank misbehaving: tests/mpi/budget.sh.)
local H = require("helpers")
local ffi = require("ffi")
package.path = "tests/fuzz/?.lua;" .. package.path
local D = require("driver")
local T = H.muon.tensor
local E = require("muon.errors")
local engine = require("muon.engine")
local sandbox = require("muon.sandbox")
local C = require("muon.core").C

local BUILD = os.getenv("MUON_BUILD") or "build"
local MUON = BUILD .. "/muon"

local dir = H.tmpdir()
local nfile = 0
local function write_config(text)
  nfile = nfile + 1
  local path = ("%s/cfg%d.lua"):format(dir, nfile)
  H.write_file(path, text)
  return path
end

local has = H.has

local run = require("readme").run_status

-- An engine of config (a path or a table; opts for engine.new) holding one
-- parameter w (4x3), and its first step under pcall: the engine, its
-- snapshot before the step, pcall's ok and error.
local function first_step(config, opts)
  local eng = engine.new(config, opts)
  eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
  local before = D.snapshot(eng)
  local ok, err = pcall(eng.step, eng)
  return eng, before, ok, err
end

local NESTED = "C stack: nested library calls deeper than " .. sandbox.MAX_NESTING
local STACK = "Lua stack overflow: calls nested deeper than the Lua stack allows"

-- Code that nests library calls without end (each a chunk of statements),
-- and what its error names.
local REPRODUCERS = {
  { "string.gsub, a replacement function",
    "local function f() return (string.gsub('x', 'x', f)) end f()", "(string.gsub)" },
  { "string.gsub, a replacement table's __index",
    "local t; t = setmetatable({}, { __index = function() return (('x'):gsub('x', t)) end }); ('x'):gsub('x', t)",
    "(string.gsub)" },
  { "table.sort, a comparator", "local function c(a, b) table.sort({ 2, 1 }, c) return a < b end "
    .. "table.sort({ 2, 1 }, c)", "(table.sort)" },
  { "table.sort, the elements' __lt", "local mt = {} mt.__lt = function() table.sort({ setmetatable({}, mt), "
    .. "setmetatable({}, mt) }) return false end table.sort({ setmetatable({}, mt), setmetatable({}, mt) })",
    "(table.sort)" },
  { "string.format %s, a __tostring", "local mt = {} mt.__tostring = function() "
    .. "return string.format('%s', setmetatable({}, mt)) end string.format('%s', setmetatable({}, mt))",
    "(string.format)" },
  { "tostring, a __tostring", "local mt = {} mt.__tostring = function() "
    .. "return 'x' .. tostring(setmetatable({}, mt)) end tostring(setmetatable({}, mt))", "(tostring)" },
  { "print, a __tostring", "local mt = {} mt.__tostring = function() print(setmetatable({}, mt)) return '' end "
    .. "print(setmetatable({}, mt))", "(tostring)" },
  { "os.time, a table's __index", "local t; t = setmetatable({}, { __index = function() os.time(t) end }) os.time(t)",
    "(os.time)" },
  { "pcall", "local function f() local ok, e = pcall(f) if not ok then error(e, 0) end end f()", "(pcall)" },
  { "a chain: gsub, sort's __lt, format's __tostring",
    "local mt = {} local function g(s) table.sort({ setmetatable({}, mt), setmetatable({}, mt) }) return s end "
    .. "mt.__lt = function() return string.format('%s', setmetatable({}, { __tostring = function() "
    .. "return (('x'):gsub('x', g)) end })) < 'y' end g('x')", "C stack" },
  { "a muon call that calls back into the config (opt:step(closure))",
    "local m = require('muon') local opt = m.optim.AdamW({}) local function f() return opt:step(f) end f()",
    "C stack" },
  { "plain Lua recursion (the Lua stack)", "local function f(n) return 1 + f(n + 1) end f(1)", STACK },
}

local function expect_nesting(err, code, want, what)
  assert.equal(E.ENOMEM, code, what .. ": " .. tostring(err))
  if want ~= STACK then has(err, NESTED) end
  has(err, want)
end

local GROUPS = "groups = { { name = 'm', optimizer = 'muon', lr = 0.02 } }"

describe("nesting: library calls that call back into Lua stop at the limit", function()
  for _, r in ipairs(REPRODUCERS) do
    local name, body, want = r[1], r[2], r[3]
    it(name .. ": at load time (engine.new, mu_engine_open, muon check)", function()
      local path = write_config(body .. "\nreturn { " .. GROUPS .. " }")
      local ok, err = pcall(engine.new, path)
      assert.is_false(ok)
      expect_nesting(err, E.code(err), want, "engine.new")
      has(err, "config '" .. path .. "': error while running: ")
      local rc = H.c_engine_open(path)
      expect_nesting(ffi.string(C.mu_last_error()), rc, want, "mu_engine_open")
      local shapes = dir .. "/shapes.txt"
      H.write_file(shapes, "w 4 3\n")
      local out, status = run(MUON .. " check " .. path .. " --params " .. shapes)
      assert.equal(1, status, out) -- (a message and exit 1, not a signal)
      if want ~= STACK then has(out, NESTED) end
      has(out, want)
    end)

    it(name .. ": inside a hook at step time (eng:step, mu_engine_step), nothing changed", function()
      local path = write_config("return { groups = { { name = 'm', optimizer = 'muon', lr = 0.02, "
        .. "post_update_fn = function(p, w, ctx)\n" .. body .. "\nend } } }")
      local eng, before, ok, err = first_step(path)
      assert.is_false(ok)
      expect_nesting(err, E.code(err), want, "eng:step")
      has(err, "post_update_fn: parameter 'w': ")
      assert.equal(before, D.snapshot(eng))
      local rc0, e = H.c_engine_open(path)
      assert.equal(0, rc0)
      local shape = ffi.new("int64_t[2]", { 2, 2 })
      local w, g = ffi.new("float[4]", { 1, 2, 3, 4 }), ffi.new("float[4]", { 1, 1, 1, 1 })
      assert.equal(0, C.mu_engine_add_param(e, "w", C.MU_F32, 2, shape, w, g))
      local rc = C.mu_engine_step(e)
      expect_nesting(ffi.string(C.mu_engine_error(e)), rc, want, "mu_engine_step")
      assert.same({ 1, 2, 3, 4 }, { w[0], w[1], w[2], w[3] })
    end)
  end

  it("nesting below the limit works, and the depth is back to 0 after every error", function()
    local path = write_config([[
      local function nest(n) if n == 0 then return 'x' end return (('x'):gsub('x', function() return nest(n - 1) end)) end
      assert(nest(90) == 'x')
      for _ = 1, 3 do assert(not pcall(nest, 1000)) end
      assert(nest(90) == 'x')
      local t = { 5, 3, 9, 1 }
      table.sort(t, function(a, b) return a < b end)
      assert(table.concat(t, ',') == '1,3,5,9')
      local mt = { __lt = function(a, b) return a.v < b.v end, __tostring = function(s) return 'v' .. s.v end }
      local u = { setmetatable({ v = 2 }, mt), setmetatable({ v = 1 }, mt) }
      table.sort(u)
      assert(string.format('%s %s %d', u[1], u[2], 7) == 'v1 v2 7' and tostring(u[2]) == 'v2')
      assert(('a-b'):gsub('%a', { a = 'A' }) == 'A-b')
      assert(os.time({ year = 2020, month = 1, day = 1, hour = 0 }) == os.time(setmetatable({},
        { __index = { year = 2020, month = 1, day = 1, hour = 0 } })))
      return { groups = { { optimizer = 'adamw' } } }
    ]])
    local ok, err = pcall(engine.new, path)
    assert.is_true(ok, tostring(err))
  end)
end)

-- A sandboxed config whose `hook` misbehaves (`kind`) at step 2, once (the
-- schedule tells the hooks which step runs); w1, w2 in a Muon group with
-- hook state, b in AdamW.
local MISBEHAVE = {
  loop = "while true do end",
  alloc = "local t = {} for i = 1, 1e9 do t[i] = { i } end",
  deep = "local function f(n) return 1 + f(n + 1) end f(1)",
  nest = "local function f() return (string.gsub('x', 'x', f)) end f()",
  bigstring = "local s = 'x' while true do s = s .. s end",
  seconds = "local x = 0 while true do x = x + 1 end",
}
local function budget_config(hook, kind, budget)
  return ([[
local cur, done = 0, false
local function misbehave()
  if cur == 2 and not done then
    done = true
    %s
  end
end
local hooks = {
  schedule = function(step, g)
    cur = step
    if HOOK == 'schedule' then misbehave() end
    return g.base_lr * (1 - 0.01 * step)
  end,
  post_update_fn = function(p, w, ctx) if HOOK == 'post_update_fn' then misbehave() end w:mul_(0.999) end,
  post_ortho_fn = function(O, state, ctx)
    if HOOK == 'post_ortho_fn' then misbehave() end
    state.s:add_(1)
  end,
  momentum_update_fn = function(grads, bufs, m1, m2, nesterov)
    if HOOK == 'momentum_update_fn' then misbehave() end
    local out = {}
    for i, g in ipairs(grads) do bufs[i]:mul_(m2):add_(g) out[i] = g:add(bufs[i]:mul(m1)) end
    return out
  end,
}
return {
  hook_budget = %s,
  schedule = hooks.schedule,
  groups = {
    { name = 'm', optimizer = 'muon', match = '^w', lr = 0.02, hook_state = { s = 'rows' },
      post_update_fn = hooks.post_update_fn, post_ortho_fn = hooks.post_ortho_fn,
      momentum_update_fn = hooks.momentum_update_fn },
    { name = 'a', optimizer = 'adamw', lr = 1e-3 },
  },
}
]]):format(MISBEHAVE[kind] or "", budget):gsub("HOOK", "'" .. hook .. "'")
end

local function budget_engine(hook, kind, budget)
  local eng = engine.new(write_config(budget_config(hook, kind, budget)))
  local ps = {}
  for i, spec in ipairs({ { "w1", { 6, 4 } }, { "w2", { 4, 5 } }, { "b", { 7 } } }) do
    ps[spec[1]] = { w = T.randn(spec[2], i), g = T.zeros(spec[2]) }
    eng:add_param(spec[1], ps[spec[1]].w, ps[spec[1]].g)
  end
  local function grads(step)
    for i, name in ipairs({ "w1", "w2", "b" }) do ps[name].g:copy(T.randn(ps[name].g:size(), 100 * step + i)) end
  end
  return eng, grads
end

local BUDGET = "{ instructions = 2e7, seconds = 30, memory = 2^24 }"
local SUBJECT = { post_update_fn = "parameter 'w1'", post_ortho_fn = "parameter 'w", -- (w1 or w2 first)
  momentum_update_fn = "parameters 'w1', 'w2'", schedule = "group 1 ('m')" }
local LIMIT = {
  loop = { E.ELUA, "exceeded the hook budget of 20000000 Lua instructions (hook_budget.instructions; endless loop?)" },
  alloc = { E.ENOMEM, "exceeded the hook memory limit of 16777216 bytes of Lua heap (hook_budget.memory)" },
  deep = { E.ENOMEM, STACK },
  nest = { E.ENOMEM, NESTED .. " (string.gsub)" },
  bigstring = { E.ENOMEM, "exceeded the hook memory limit of 16777216 bytes of Lua heap (hook_budget.memory)" },
}

describe("hook budget: a misbehaving hook fails the step, nothing changed", function()
  for _, hook in ipairs({ "post_update_fn", "post_ortho_fn", "momentum_update_fn", "schedule" }) do
    for _, kind in ipairs({ "loop", "alloc", "deep", "nest", "bigstring" }) do
      it(("%s: %s fails with the limit's message; the step again passes, as if never tried"):format(hook, kind),
        function()
          local eng, grads = budget_engine(hook, kind, BUDGET)
          local ref, rgrads = budget_engine(hook, "none", BUDGET)
          for step = 1, 3 do
            grads(step); rgrads(step)
            local before = D.snapshot(eng)
            local t0 = os.clock()
            local ok, err = pcall(eng.step, eng)
            local spent = os.clock() - t0
            if step == 2 then
              assert.is_false(ok, "step 2 passed")
              assert.equal(LIMIT[kind][1], E.code(err), tostring(err))
              has(err, hook .. ": " .. SUBJECT[hook])
              has(err, LIMIT[kind][2])
              assert.is_true(spent < 10, ("the failing step took %.2f s"):format(spent))
              assert.equal(before, D.snapshot(eng))
              assert.is_true(pcall(eng.step, eng)) -- (the hook behaves from now on)
            else
              assert.is_true(ok, tostring(err))
            end
            ref:step()
            assert.equal(D.snapshot(ref), D.snapshot(eng))
          end
        end)
    end
  end

  it("the CPU-time limit ends a hook within its seconds", function()
    local eng, grads = budget_engine("post_update_fn", "seconds", "{ instructions = math.huge, seconds = 0.2 }")
    grads(1)
    eng:step()
    grads(2)
    local before = D.snapshot(eng)
    local t0 = os.clock()
    local ok, err = pcall(eng.step, eng)
    local spent = os.clock() - t0
    assert.is_false(ok)
    assert.equal(E.ELUA, E.code(err))
    has(err, "post_update_fn: parameter 'w1': exceeded the hook time limit of 0.2 CPU seconds (hook_budget.seconds; ")
    assert.is_true(spent >= 0.2 and spent < 3, ("%.2f s"):format(spent))
    assert.equal(before, D.snapshot(eng))
  end)

  it("a hook cannot catch a limit's error (pcall, xpcall), and a loop over host calls is bounded too", function()
    for _, body in ipairs({
      "pcall(function() while true do end end) while true do pcall(function() end) end",
      "xpcall(function() while true do end end, function() while true do end end)",
      "for _ = 1, 1e9 do pcall(function() local t = {} for i = 1, 1e9 do t[i] = i end end) end",
      "while true do w:add_(0) end",
    }) do
      local path = write_config("return { hook_budget = { instructions = 1e7, memory = 2^24 }, groups = { { "
        .. "optimizer = 'muon', post_update_fn = function(p, w, ctx) " .. body .. " end } } }")
      local eng, before, ok, err = first_step(path)
      assert.is_false(ok, body)
      has(err, "post_update_fn: parameter 'w': exceeded the hook ")
      assert.equal(before, D.snapshot(eng))
    end
  end)

  it("a huge tensor allocation in a hook is MU_ENOMEM with a message (C memory: not the Lua heap's limit)", function()
    local path = write_config("return { groups = { { optimizer = 'muon', post_update_fn = function(p, w, ctx) "
      .. "local T = require('muon').tensor local _ = T.zeros({ 2^40, 2^10 }) end } } }")
    local eng, before, ok, err = first_step(path)
    assert.is_false(ok)
    assert.equal(E.ENOMEM, E.code(err), tostring(err))
    has(err, "post_update_fn: ")
    assert.equal(before, D.snapshot(eng))
  end)

  it("defaults: far above what a sane hook needs; a hook within its budget is unchanged by it", function()
    assert.same({ instructions = 1e10, seconds = 300, memory = 2 ^ 30 }, sandbox.HOOK_BUDGET)
    local a, ga = budget_engine("post_update_fn", "none", "nil")
    local b, gb = budget_engine("post_update_fn", "none", "{ instructions = 1e12, memory = 2^40 }")
    for step = 1, 3 do
      ga(step); gb(step)
      a:step(); b:step()
    end
    assert.equal(D.snapshot(a), D.snapshot(b))
  end)

  it("trusted configs have no budget unless they set one (then functions in their tables are bounded)", function()
    local loop = "local x = 0 for i = 1, 3e6 do x = x + i end"
    local function stepped(trusted, budget)
      local path = write_config("return { " .. (budget and ("hook_budget = " .. budget .. ", ") or "")
        .. "groups = { { optimizer = 'muon', post_update_fn = function() " .. loop .. " end } } }")
      local _, _, ok, err = first_step(path, { trusted = trusted })
      return ok, err
    end
    local saved = sandbox.HOOK_BUDGET
    sandbox.HOOK_BUDGET = { instructions = 1e6, seconds = 300, memory = 2 ^ 30 }
    local ok_s, err_s = stepped(false)
    local ok_t, err_t = stepped(true)
    local ok_b, err_b = stepped(true, "{ instructions = 1e6 }")
    sandbox.HOOK_BUDGET = saved
    assert.is_false(ok_s)
    has(err_s, "exceeded the hook budget of 1000000 Lua instructions")
    assert.is_true(ok_t, tostring(err_t))
    assert.is_false(ok_b)
    has(err_b, "post_update_fn: parameter 'w': exceeded the hook budget of 1000000 Lua instructions")
    -- a table config (built by the host) likewise
    local _, _, ok, err = first_step({ hook_budget = { instructions = 1e6 }, groups = { { optimizer = "muon",
      post_update_fn = function() local x = 0 for i = 1, 3e6 do x = x + i end return x end } } })
    assert.is_false(ok)
    has(err, "hook_budget.instructions")
  end)

  -- A trusted config has coroutine.create, wrap and resume (and the VM's
  -- own pcall): LuaJIT's one hook must count a coroutine the hook creates
  -- like the hook itself, and a limit, once exceeded, must stop code that
  -- catches its error and goes on.
  local ESCAPES = {
    "coroutine.wrap(function() while true do end end)()",
    "coroutine.resume(coroutine.create(function() while true do end end)) while true do end",
    "while true do coroutine.resume(coroutine.create(function() while true do end end)) end",
    "local co = coroutine.wrap(function() while true do coroutine.yield() end end) while true do co() end",
    "coroutine.wrap(function() coroutine.wrap(function() while true do end end)() end)()",
    "while true do pcall(coroutine.wrap(function() while true do end end)) end",
    "while true do pcall(function() while true do end end) end",
  }
  local LIMITS = { { "instructions = 1e6", "exceeded the hook budget of 1000000 Lua instructions" },
    { "seconds = 0.1", "exceeded the hook time limit of 0.1 CPU seconds" } }

  -- The first step of a config (its text, or a table) under hook_budget =
  -- { <limit> } with post_update_fn = function() <body> end (or the text
  -- given whole) fails within 5 s and changes nothing; its error.
  local function fails_unchanged(limit, body, opts, text)
    local config = type(body) == "table" and body or write_config(text or ("return { hook_budget = { " .. limit
      .. " }, groups = { { optimizer = 'muon', post_update_fn = function(p, w, ctx) " .. body .. " end } } }"))
    local t0 = os.clock()
    local eng, before, ok, err = first_step(config, opts)
    assert.is_false(ok, tostring(body))
    assert.is_true(os.clock() - t0 < 5, tostring(body))
    assert.equal(before, D.snapshot(eng))
    return err
  end

  for _, limit in ipairs(LIMITS) do
    it(("trusted: a loop in a coroutine the hook creates is bounded (%s), nothing changed"):format(limit[1]),
      function()
        for _, body in ipairs(ESCAPES) do
          local err = fails_unchanged(limit[1], body, { trusted = true })
          assert.equal(E.ELUA, E.code(err), body)
          has(err, "post_update_fn: parameter 'w': " .. limit[2])
        end
      end)
  end

  it("trusted: the Lua heap a coroutine the hook creates keeps counts (hook_budget.memory)", function()
    local err = fails_unchanged("memory = 2^24", "local keep = {} coroutine.wrap(function() "
      .. "while true do keep[#keep + 1] = { 1, 2, 3 } end end)()", { trusted = true })
    assert.equal(E.ENOMEM, E.code(err))
    has(err, "post_update_fn: parameter 'w': exceeded the hook memory limit of 16777216 bytes of Lua heap")
  end)

  it("trusted: a table config's hook and a schedule are bounded through coroutines too", function()
    has(fails_unchanged(nil, { hook_budget = { instructions = 1e6 }, groups = { { optimizer = "muon",
      post_update_fn = function() coroutine.wrap(function() while true do end end)() end } } }),
      "post_update_fn: parameter 'w': exceeded the hook budget of 1000000 Lua instructions")
    has(fails_unchanged(nil, "", { trusted = true }, "return { hook_budget = { seconds = 0.1 }, groups = { { "
      .. "optimizer = 'muon' } }, schedule = function() while true do coroutine.resume(coroutine.create("
      .. "function() while true do end end)) end end }"), "exceeded the hook time limit of 0.1 CPU seconds")
  end)

  it("sandboxed: a hook has no coroutines (blocked), and the same loops without them are bounded", function()
    has(fails_unchanged("instructions = 1e6", ESCAPES[1]), "coroutine.wrap is blocked in sandboxed configs")
    for _, limit in ipairs(LIMITS) do
      has(fails_unchanged(limit[1], ESCAPES[#ESCAPES]), "post_update_fn: parameter 'w': " .. limit[2])
    end
  end)

  it("hook_budget is checked strictly (key names, values)", function()
    for _, c in ipairs({
      { "5", "hook_budget must be a table { instructions = n, seconds = s, memory = bytes }, got number" },
      { "{ instructons = 1e6 }", "hook_budget: unknown hook_budget key 'instructons' (did you mean 'instructions'?); "
        .. "valid hook_budget keys: instructions, memory, seconds" },
      { "{ seconds = -1 }", "hook_budget.seconds must be a number > 0 (math.huge: no limit), got -1" },
      { "{ memory = 0/0 }", "hook_budget.memory must be a number > 0 (math.huge: no limit), got nan" },
      { "{ instructions = '1e6' }", "hook_budget.instructions must be a number > 0 (math.huge: no limit), got the string \"1e6\"" },
      { "{ 1e6 }", "hook_budget: unknown hook_budget key 1;" },
    }) do
      local path = write_config("return { hook_budget = " .. c[1] .. ", " .. GROUPS .. " }")
      for _, trusted in ipairs({ false, true }) do
        local ok, err = pcall(engine.new, path, { trusted = trusted })
        assert.is_false(ok, c[1])
        assert.equal(E.EINVAL, E.code(err))
        has(err, "config '" .. path .. "': " .. c[2])
      end
    end
  end)
end)
