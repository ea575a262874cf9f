-- Sandboxed configs: every way out is blocked (with a message naming the
-- call and how to allow it), and hooks still work through the membrane.
local H = require("helpers")
local muon = H.muon
local T = muon.tensor
local engine = require("muon.engine")

local write_config = H.config_file

local GROUPS = "groups = { { name = 'm', optimizer = 'muon', min_dim = 2, lr = 0.02, weight_decay = 0 },"
  .. " { name = 'a', optimizer = 'adamw', lr = 1e-3 } }"

-- Run `body` inside a config (at load time) and return the error.
local function load_error(body, trusted)
  local path = write_config(body .. "\nreturn { " .. GROUPS .. " }")
  local ok, err = pcall(engine.new, path, trusted and { trusted = true } or nil)
  os.remove(path)
  return ok, tostring(err)
end

-- Run `body` inside a post_update_fn hook (at step time, with a real
-- parameter in scope as p/w) and return the error.
local function hook_error(body)
  local path = write_config("local muon = require('muon')\nreturn { " .. GROUPS
    .. ", hooks = { post_update_fn = function(p, w, ctx)\n" .. body .. "\nend } }")
  local eng = engine.new(path)
  os.remove(path)
  local w, g = T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2)
  eng:add_param("w", w, g)
  local ok, err = pcall(eng.step, eng)
  return ok, tostring(err)
end

local function assert_blocked(ok, err, what)
  assert.is_false(ok, what .. " was not blocked")
  assert.truthy(err:find(what, 1, true), "message does not name " .. what .. ": " .. err)
  assert.truthy(err:find("blocked", 1, true), err)
  assert.truthy(err:find("trusted = true", 1, true), "message does not say how to allow it: " .. err)
  assert.truthy(err:find("--trust", 1, true), err)
  assert.truthy(err:find("mu_engine_open_ex", 1, true), err)
end

describe("sandboxed config: blocked at load time", function()
  local cases = {
    { "local _ = require('muon').core", "muon.core" },
    { "local _ = require('muon').safetensors", "muon.safetensors" },
    { "local _ = require('muon').comm", "muon.comm" },
    { "local _ = require('muon').engine", "muon.engine" },
    { "require('muon.core')", "require('muon.core')" },
    { "require('muon.safetensors')", "require('muon.safetensors')" },
    { "require('muon.config')", "require('muon.config')" },
    { "require('muon.host')", "require('muon.host')" },
    { "require('muon.checkpoint')", "require('muon.checkpoint')" },
    { "require('jit')", "require('jit')" },
    { "require('cjson')", "require('cjson')" },
    { "require('muon').tensor.wrap(nil, {1})", "muon.tensor.wrap" },
    { "require('muon').tensor.load('/etc/passwd')", "muon.tensor.load" },
    { "local _ = require('muon').tensor.methods", "muon.tensor.methods" },
    { "require('muon').ns.workspace('float32', 2, 2)", "muon.ns.workspace" },
    { "require('muon').tensor.zeros({2, 2}):ptr()", "tensor:ptr()" },
    { "require('muon').tensor.zeros({2, 2}):save('/tmp/muon_sandbox_x.npy')", "tensor:save()" },
    { "local t = require('muon').tensor.zeros({2, 2}); local d = t.data", "tensor.data" },
    { "local t = require('muon').tensor.zeros({2, 2}); t.dims[100] = 1", "tensor.dims" },
    { "local t = require('muon').tensor.zeros({2, 2}); local s = t.storage", "tensor.storage" },
    { "local t = require('muon').tensor.zeros({2, 2}); local s = t.strides", "tensor.strides" },
    { "local m = require('muon'); local o = m.optim.Muon({ m.param('w', m.tensor.zeros({2, 2}), m.tensor.zeros({2, 2})) }); o:save('/tmp/muon_sandbox_o')",
      "object member 'save'" },
    { "local m = require('muon'); local o = m.optim.AdamW({}); o:load('/tmp/x')", "object member 'load'" },
    { "local m = require('muon'); local o = m.optim.Muon({}); o:_commit({ group = {}, params = {} })", "object member '_commit'" },
    { "local m = require('muon'); local o = m.optim.Muon({}); local s = o._scratch", "object member '_scratch'" },
    { "local m = require('muon'); local o = m.optim.Muon({}); o._stepper:step()", "object member '_stepper'" },
    { "require('muon.ns').zeropower(require('muon').tensor.zeros({2, 2}), { workspace = {} })", "workspace option" },
    { "os.exit(3)", "os.exit" },
    { "io.write('x')", "io.write" },
    { "collectgarbage()", "collectgarbage" },
    { "setfenv(1, {})", "setfenv" },
    { "loadstring('return 1')", "loadstring" },
    { "loadfile('/etc/passwd')", "loadfile" },
    { "load(function() return nil end)", "load of a reader function" },
    { "local _ = package.loaded['muon.core']", "package.loaded" },
    { "jit.off()", "jit.off" },
    { "ffi.cast('int *', 0)", "ffi.cast" },
  }
  for _, c in ipairs(cases) do
    it("blocks " .. c[1], function()
      local ok, err = load_error(c[1])
      assert_blocked(ok, err, c[2])
    end)
  end

  it("tensor:save and tensor:ptr work again in a trusted config", function()
    local out = os.tmpname()
    local ok, err = load_error(("local t = require('muon').tensor.from({1, 2}, {2}); assert(t:ptr()[1] == 2); t:save(%q)")
      :format(out), true)
    assert.is_true(ok, err)
    assert.same({ 1, 2 }, T.load(out):flat())
    os.remove(out)
  end)

  it("a config may build and step its own optimizer (bitwise as outside the sandbox)", function()
    local path = write_config([[
      local m = require('muon')
      local T = m.tensor
      local w, g = T.randn({ 5, 3 }, 1), T.randn({ 5, 3 }, 2)
      local o = m.optim.Muon({ m.param('w', w, g) }, { lr = 0.1, weight_decay = 0.01 })
      o:step()
      o:step()
      assert(o.stats.steps == 2 and o:state_dict().kind == 'muon')
      assert(not pcall(function() o.defaults = {} end))
      local parts = {}
      for i, v in ipairs(w:flat()) do parts[i] = ('%a'):format(v) end
      return { groups = { { optimizer = 'adamw' } }, name = table.concat(parts, ',') }
    ]])
    local eng = engine.new(path)
    os.remove(path)
    local w, g = T.randn({ 5, 3 }, 1), T.randn({ 5, 3 }, 2)
    local o = muon.optim.Muon({ muon.param("w", w, g) }, { lr = 0.1, weight_decay = 0.01 })
    o:step()
    o:step()
    local parts = {}
    for i, v in ipairs(w:flat()) do parts[i] = ("%a"):format(v) end
    assert.equal(table.concat(parts, ","), eng.config.name)
  end)

  it("tensor:copy and :shares_storage take only tensors (no forged structs)", function()
    local ok, err = load_error([[
      local t = require('muon').tensor.zeros({ 2 })
      local a, e = pcall(t.copy, t, { data = nil, ndim = 1, dims = { 2 }, strides = { 1 }, scalar = 0 })
      assert(not a and tostring(e):find('not a tensor'), tostring(e))
      a, e = pcall(t.shares_storage, t, {})
      assert(not a and tostring(e):find('not a tensor'), tostring(e))
    ]])
    assert.is_true(ok, err)
  end)

  it("no file was written by a blocked save", function()
    load_error("pcall(function() require('muon').tensor.zeros({2}):save('/tmp/muon_sandbox_y.npy') end)")
    assert.is_nil(io.open("/tmp/muon_sandbox_y.npy", "rb"))
  end)

  it("cannot reach the host's string metatable or tensor metatables", function()
    local ok, err = load_error([[
      assert(getmetatable("") == nil, "string metatable visible")
      local t = require('muon').tensor.zeros({2})
      assert(getmetatable(t) == "muon.tensor (sandboxed)", tostring(getmetatable(t)))
      assert(not pcall(setmetatable, t, {}), "setmetatable on a proxy")
      assert(rawget(t, "data") == nil)
      local ok = pcall(function() t.foo = 1 end)
      assert(not ok, "tensor proxy is writable")
    ]])
    assert.is_true(ok, err)
    -- and the host's string library is intact
    assert.equal("ab", ("a"):format() .. "b")
  end)

  it("a blocked call caught by pcall in the config leaves no way around", function()
    local ok, err = load_error([[
      local muon = require('muon')
      local a, e = pcall(function() return muon.core end)
      assert(not a and tostring(e):find('blocked'))
      local t = muon.tensor.zeros({2})
      for _, k in ipairs({ 'ptr', 'save', 'data', 'storage', 'dims', 'strides', 'offset', 'scalar', 'ndim' }) do
        assert(not pcall(function() return t[k] end), k)
      end
    ]])
    assert.is_true(ok, err)
  end)
end)

describe("sandboxed config: load budget", function()
  it("an endless loop at load time fails after the instruction budget", function()
    local config = require("muon.config")
    local saved = config.LOAD_BUDGET
    config.LOAD_BUDGET = 1e6
    local ok, err = load_error("local x = 0 while true do x = x + 1 end")
    config.LOAD_BUDGET = saved
    assert.is_false(ok)
    assert.truthy(err:find("exceeded the load budget of 1000000 Lua instructions", 1, true), err)
  end)

  it("leaves a host's own hook in place (and then does not bound the load)", function()
    local calls = 0
    local function hook() calls = calls + 1 end
    debug.sethook(hook, "", 1000)
    local ok, err = load_error("local x = 0 for i = 1, 1e5 do x = x + i end")
    local h = debug.gethook()
    debug.sethook()
    assert.is_true(ok, err)
    assert.equal(hook, h)
  end)
end)

describe("sandboxed config: blocked inside hooks", function()
  local cases = {
    { "w:ptr()", "tensor:ptr()" },
    { "w:save('/tmp/muon_sandbox_z.npy')", "tensor:save()" },
    { "local d = w.data", "tensor.data" },
    { "local d = p.value.dims", "tensor.dims" },
    { "local d = p.grad:ptr()", "tensor:ptr()" },
    { "local c = muon.core", "muon.core" },
    { "io.open('/tmp/muon_sandbox_z', 'w')", "io.open" },
  }
  for _, c in ipairs(cases) do
    it("blocks " .. c[1] .. " in post_update_fn", function()
      local ok, err = hook_error(c[1])
      assert_blocked(ok, err, c[2])
    end)
  end

  it("hooks never see FFI cdata", function()
    local ok, err = hook_error([[
      assert(type(w) == "table" and type(p) == "table" and type(p.value) == "table", type(w))
      assert(p.value == w, "param value and local tensor differ")
      assert(p.name == "w" and ctx.param_fqn == "w")
      for _, k in ipairs({ "value", "grad" }) do assert(type(p[k]) ~= "cdata") end
      assert(not pcall(function() p.name = "x" end), "param proxy writable")
      error("sentinel-ok")
    ]])
    assert.is_false(ok)
    assert.truthy(err:find("sentinel-ok", 1, true), err)
  end)
end)

describe("sandboxed config: hooks still work", function()
  local HOOKS = [[
local muon = require('muon')
local ns = require('muon.ns')
return { groups = { { name = 'm', optimizer = 'muon', lr = 0.02, weight_decay = 0.01 } },
  hooks = {
    reshape_fn = function(name, x)
      if name == 'heads' then return { x:view({ 2, 4, 6 }) } end
    end,
    zeropower_fn = function(x, steps)
      return ns.zeropower(x, { steps = steps, variant = 'asym5', eps = 1e-10 })
    end,
    momentum_update_fn = function(grads, bufs, m1, m2, nesterov)
      local out = {}
      for i, g in ipairs(grads) do
        local u = g:clone()
        bufs[i]:copy(g)   -- plain momentum-free update: buf = g
        out[i] = u
      end
      return out
    end,
    post_update_fn = function(p, w, ctx)
      if ctx.param_fqn == 'clamped' then
        local n = w:norm()
        local c = w:clone():fill(0)
        c:narrow(1, 1, 1):fill(n)
        w:copy(c)
      end
    end,
  } }
]]

  local function run(trusted)
    local path = write_config(HOOKS)
    local eng = engine.new(path, trusted and { trusted = true } or nil)
    os.remove(path)
    local ps = {}
    for i, spec in ipairs({ { "heads", { 8, 6 } }, { "clamped", { 3, 5 } }, { "plain", { 5, 3 } } }) do
      local w, g = T.randn(spec[2], 10 + i), T.randn(spec[2], 20 + i)
      eng:add_param(spec[1], w, g)
      ps[spec[1]] = { w = w, g = g }
    end
    for s = 1, 3 do
      for name, p in pairs(ps) do p.g:copy(T.randn(p.w:size(), 100 * s + #name)) end
      eng:step()
    end
    return ps
  end

  it("gives bitwise the same results as the trusted config", function()
    local a, b = run(false), run(true)
    for name in pairs(a) do H.assert_equal_bits(a[name].w, b[name].w, name) end
  end)

  it("post_update_fn changes the real parameter (hand-checked)", function()
    local ps = run(false)
    local w = ps.clamped.w
    local rows = w:totable()
    -- first row holds the norm of the previous weights, the rest is zero
    for j = 2, #rows do
      for k = 1, #rows[j] do assert.equal(0, rows[j][k]) end
    end
    local v = rows[1][1]
    assert.truthy(v > 0)
    for k = 1, #rows[1] do assert.equal(v, rows[1][k]) end
  end)

  it("schedules and match functions get plain values", function()
    local path = write_config([[
      return { groups = { { optimizer = 'adamw', lr = 0.1, weight_decay = 0,
          match = function(name, shape) assert(type(shape) == 'table'); return name:sub(1, 1) == 'b' end } },
        schedule = function(step, g)
          assert(type(g.base) == 'table' and g.base.lr == 0.1)
          g.base.lr = 1e9 -- a copy: the engine's value stays
          return g.base_lr / step
        end }
    ]])
    local eng = engine.new(path)
    os.remove(path)
    local w, g = T.from({ 1, 2 }, { 2 }), T.from({ 1, 1 }, { 2 })
    eng:add_param("b", w, g)
    eng:step()
    eng:step()
    assert.near(0.05, eng:get("lr"), 1e-15)
    assert.equal(0.1, eng.groups[1].base.lr)
  end)
end)

describe("sandboxed config: errors across the membrane", function()
  local S = require("muon.sandbox")
  local config = require("muon.config")
  local E = require("muon.errors")

  -- A function defined by sandboxed source, as the host sees it (exported).
  local function sandboxed(src)
    local chunk = assert(load(src, "@errs.lua", "t", config.sandbox("errs.lua")))
    return S.export(chunk())
  end

  local function raised(f, ...)
    local ok, err = pcall(f, ...)
    assert.is_false(ok, "expected an error")
    return err
  end

  it("a string the config raises stays a string", function()
    local err = raised(sandboxed("return function() error('boom') end"))
    assert.equal("errs.lua:1: boom", err)
    assert.equal(42, raised(sandboxed("return function() error(42, 0) end")))
  end)

  it("a table the config raises reaches the host as an MU_ELUA object, its metamethods never called", function()
    local calls = 0
    local f = sandboxed([[return function(note)
      local mt = { __tostring = function() note() return 'x' end, __index = function() note() end,
                   __concat = function() note() return 'x' end }
      error(setmetatable({ code = -3, msg = 'forged EIO' }, mt))
    end]])
    local err = raised(f, function() calls = calls + 1 end)
    assert.is_true(E.is(err))
    assert.equal(E.ELUA, err.code) -- not the EIO it names: a config cannot choose the status
    assert.equal("forged EIO", tostring(err))
    assert.equal("forged EIO!", err .. "!")
    assert.truthy(err.tb:find("errs.lua:4", 1, true), err.tb)
    assert.equal(0, calls)
  end)

  it("other values the config raises: MU_ELUA objects naming the type, no proxy or cdata", function()
    for _, c in ipairs({ { "nil", "nil" }, { "false", "boolean" }, { "function() end", "function" },
                         { "require('muon').tensor.zeros({2})", "table" } }) do
      local err = raised(sandboxed("return function() error(" .. c[1] .. ") end"))
      assert.is_true(E.is(err), c[1])
      assert.equal(E.ELUA, err.code)
      assert.equal("(error object is a " .. c[2] .. " value)", err.msg)
      for _, v in pairs(err) do assert.is_not.equal("cdata", type(v)) end
    end
  end)

  it("a muon error raised inside the config keeps its code and message", function()
    local err = raised(sandboxed("return function(x) return x:view({7}) end"), T.zeros({ 2, 3 }))
    assert.is_true(E.is(err))
    assert.equal(E.ESHAPE, err.code)
    assert.equal("view: view of 6 elements as a shape of 7 elements", err.msg)
    -- through a facade function as well
    local x = T.zeros({ 3, 3 })
    x:set(0 / 0, 1, 1)
    err = raised(sandboxed("local ns = require('muon.ns') return function(x) return ns.zeropower(x) end"), x)
    assert.equal(E.ENONFINITE, err.code)
    assert.matches("^zeropower: ", err.msg)
  end)

  it("the config sees a protected string-like copy and cannot change what the host gets", function()
    local f = sandboxed([[return function(x)
      local ok, e = pcall(function() return x:view({7}) end)
      assert(not ok and type(e) == 'table' and e.code == -6 and tostring(e) == e.msg, tostring(e))
      assert(e:find('view:', 1, true) == 1 and ('<' .. e):sub(1, 6) == '<view:')
      assert(e.tb == nil, 'host traceback visible')
      assert(getmetatable(e) == 'muon.error', tostring(getmetatable(e)))
      assert(not pcall(setmetatable, e, {}), 'metatable changed')
      e.code, e.msg = -3, 'changed'
      error(e)
    end]])
    local err = raised(f, T.zeros({ 2, 3 }))
    assert.equal(E.ESHAPE, err.code)
    assert.equal("view: view of 6 elements as a shape of 7 elements", err.msg)
    -- and the string methods on the host's objects are intact
    assert.equal("x", ("x"):match("x"))
  end)

  it("a hook's error keeps the config's lines in its traceback", function()
    local path = write_config("local function inner() error('deep boom') end\nreturn { " .. GROUPS
      .. ", hooks = { post_update_fn = function() inner() end } }")
    local eng = engine.new(path)
    os.remove(path)
    eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
    local ok, err = pcall(eng.step, eng)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("deep boom", 1, true), tostring(err))
    local tb = E.traceback(err)
    assert.truthy(tb and tb:find(path .. ":1:", 1, true), tostring(tb))
  end)
end)

describe("sandboxed config: tensor maths", function()
  -- One battery of ops, run in a sandboxed config, in a trusted one and
  -- here: every result (tensors as hex floats) must be bitwise the same.
  local BODY = [[
    local T = require('muon').tensor
    local x, y = T.randn({ 4, 6 }, 1), T.randn({ 6 }, 2)
    local c = T.randn({ 4, 1 }, 3):abs()
    local b3 = T.randn({ 2, 4, 6 }, 4, 'float64')
    local results = {
      x + y, 2 + x, x - 1, 1 - x, x * y, 3 * x, x / 3, 0.5 / c, -x, x - x,
      x:add(y, 0.3), x:sub(y, -2), x:mul(c), x:div(c:sqrt():add(1e-10)),
      x:addcmul(y, c, 0.7), x:addcdiv(y, c, -0.2), x:lerp(y, 0.3), x:lerp(x:abs(), c:clamp(0, 1)),
      x:sqrt(), x:abs():rsqrt(), x:sign(), x:clamp(-0.5, nil), x:clamp(nil, 0.5),
      x:gt(0), x:lt(y), x:ge(0.1), x:le(y), x:eq(x), x:ne(y),
      T.where(x:gt(0), x, 0), x:where(x:lt(0), y), x:masked_fill(x:lt(0), -1),
      x:sum(1), x:mean(-1, true), x:amax(2), x:norm(2, 1, true), T.sum(b3, 2),
      x:matmul(x:transpose(1, 2)), T.mm(x, T.randn({ 6, 3 }, 5)), b3:bmm(b3:transpose(2, 3)),
      b3:matmul(T.randn({ 6, 2 }, 6, 'float64')), T.matmul(y, x:transpose(1, 2)),
      x:transpose(1, 2):contiguous():mul_(2):add_(1):sqrt_(), x:clone():clamp_(0, 1):neg_(),
      x:clone():masked_fill_(x:gt(0.5), 0.5):addcmul_(x, x, -1):lerp_(y, 0.9),
    }
    local numbers = { x:sum(), x:mean(), x:amax(), x:norm(), b3:sum(), T.norm(y) }
    local parts = {}
    for _, t in ipairs(results) do
      for _, v in ipairs(t:flat()) do parts[#parts + 1] = ('%a'):format(v) end
    end
    for _, v in ipairs(numbers) do parts[#parts + 1] = ('%a'):format(v) end
    local r = x + 1
  ]]

  local function from_config(trusted)
    -- (name is the one free-form string a config may return)
    local path = write_config(BODY .. "\nreturn { groups = { { optimizer = 'adamw' } }, name = table.concat(parts, ',')"
      .. " .. '|' .. type(r) .. '|' .. tostring(getmetatable(r)) }")
    local eng = engine.new(path, trusted and { trusted = true } or nil)
    os.remove(path)
    local name, kind, mt = eng.config.name:match("^(.*)|([^|]*)|([^|]*)$")
    return { name = name, kind = kind, mt = mt }
  end

  it("ops and operators work on proxies, bitwise as trusted and as outside any config", function()
    local sandboxed, trusted = from_config(false), from_config(true)
    local host = assert(loadstring(BODY .. " return table.concat(parts, ',')"))()
    assert.equal(host, trusted.name)
    assert.equal(host, sandboxed.name)
    assert.is_true(#host > 1000)
    assert.equal("table", sandboxed.kind) -- results come back as proxies
    assert.equal("muon.tensor (sandboxed)", sandboxed.mt)
    assert.equal("cdata", trusted.kind)
  end)

  it("out-of-bounds or overflowing views and ops, forged tensors and cdata are errors", function()
    local ok, err = load_error([[
      local T = require('muon').tensor
      local x = T.zeros({ 4 })
      local function fails(f, what, msg)
        local ok, e = pcall(f)
        assert(not ok, what .. ' did not fail')
        assert(tostring(e):find(msg, 1, true), what .. ': ' .. tostring(e))
      end
      fails(function() return x:view({ 2147549185, 2147418113, 4 }) end, 'wrapping view', 'view shape too large')
      fails(function() return x:narrow(1, 1, 2 ^ 60) end, 'narrow', 'out of range')
      fails(function() return x:view({ 2, 2 }):mm(x:view({ 2, 2 }):narrow(2, 1, 2 ^ 40)) end, 'narrow in mm', 'out of range')
      fails(function() return T.zeros({ 2 ^ 40, 2 ^ 40 }) end, 'zeros', 'shape too large')
      fails(function() return T.zeros({ 2 ^ 31, 0 }):mm(T.zeros({ 0, 2 ^ 31 })) end, 'huge product', 'shape too large')
      fails(function() return x:sum(2 ^ 40) end, 'dim', 'out of range')
      fails(function() return x + {} end, 'table operand', 'must be a tensor or a number')
      fails(function() return {} - x end, 'table operand left', 'cannot combine a table with a tensor')
      fails(function() return x:add({ data = 0, ndim = 1, dims = { 1e9 }, strides = { 1 } }) end, 'forged tensor',
        'other must be a tensor or a number, got table')
      fails(function() return x:addcmul(x, { ndim = 1 }) end, 'forged tensor2', 'tensor2 must be a tensor')
      fails(function() return x + 1LL end, 'int64 cdata', 'got cdata')
      fails(function() return x:clamp(1LL) end, 'cdata bound', 'min must be a number')
      fails(function() return T.matmul(x:view({ 2, 2 }), {}) end, 'matmul table', 'other must be a tensor')
      fails(function() return T.where({}, x, x) end, 'where table', 'condition must be a tensor')
      fails(function() return (x + 1).data end, 'result data', 'blocked')
      fails(function() return x:mul(2):ptr() end, 'result ptr', 'blocked')
      local r = x + 1
      assert(type(r) == 'table' and getmetatable(r) == 'muon.tensor (sandboxed)')
      assert(type(x:sum()) == 'number' and type(x:mean(1)) == 'table')
    ]])
    assert.is_true(ok, err)
  end)

  -- NorMuon-style row normalization after Newton-Schulz, a QK-clip-style
  -- rescale and cautious weight decay, written with the tensor maths.
  local VARIANTS = [[
local ns = require('muon.ns')
local state = {}
return { groups = { { name = 'm', optimizer = 'muon', lr = 0.02, weight_decay = 0.01 } },
  hooks = {
    zeropower_fn = function(x, steps)
      local O = ns.zeropower(x, { steps = steps, variant = 'asym5', eps = 1e-10 })
      local key = table.concat(O:size(), 'x')
      local m = O:mul(O):mean(-1, true)
      local v = state[key]
      v = v == nil and m or v:lerp(m, 0.05)
      state[key] = v
      return O:div(v:sqrt():add(1e-10))
    end,
    post_update_fn = function(p, w, ctx)
      local m = w:abs():amax()
      if m > 0.3 then w:mul_(0.3 / m) end
      local agree = p.grad:sign():eq(w:sign())
      w:sub_(w:mul(agree), ctx.lr * 0.1)
    end,
  } }
]]

  local function run(trusted)
    local path = write_config(VARIANTS)
    local eng = engine.new(path, trusted and { trusted = true } or nil)
    os.remove(path)
    local ps = {}
    for i, shape in ipairs({ { 8, 6 }, { 3, 5 }, { 5, 3 } }) do
      local w, g = T.randn(shape, 30 + i), T.randn(shape, 40 + i)
      eng:add_param("p" .. i, w, g)
      ps[i] = { w = w, g = g }
    end
    for s = 1, 3 do
      for i, p in ipairs(ps) do p.g:copy(T.randn(p.w:size(), 100 * s + i)) end
      eng:step()
    end
    return ps
  end

  it("hooks written with tensor maths: bitwise the same as trusted, and they act", function()
    local a, b = run(false), run(true)
    for i in ipairs(a) do
      H.assert_equal_bits(a[i].w, b[i].w, "p" .. i)
      assert.is_true(a[i].w:abs():amax() <= 0.3, "clipped")
    end
  end)
end)

describe("sandboxed config: the load budget cannot be escaped", function()
  local config = require("muon.config")
  local BUDGET = 2e5 -- small: every case ends within a fraction of a second

  -- Load body (then a valid config) with the small budget; the error, and
  -- checks that nothing of the sandbox stayed switched on.
  local function bounded(body)
    local saved = config.LOAD_BUDGET
    config.LOAD_BUDGET = BUDGET
    local ok, err = load_error(body)
    config.LOAD_BUDGET = saved
    assert.equal(string, getmetatable("").__index, "string metatable left switched")
    assert.is_true((jit.status()), "JIT left off")
    assert.is_nil(debug.gethook(), "count hook left set")
    return ok, err
  end

  local function assert_budget(body)
    local ok, err = bounded(body)
    assert.is_false(ok, body)
    assert.truthy(err:find("exceeded the load budget of 200000 Lua instructions", 1, true), err)
  end

  local cases = {
    ["an endless loop inside pcall"] = "pcall(function() while true do end end)",
    ["pcall in an endless loop"] = "while true do pcall(function() local x = 0 for i = 1, 1e4 do x = x + i end end) end",
    ["catching the budget error again and again"] =
      "for _ = 1, 1e9 do local ok, e = pcall(function() while true do end end) end",
    ["a chunk made by load() (never JIT-compiled)"] = "load('local x = 0 while true do x = x + 1 end')()",
    ["load()-made chunks in a pcall loop"] =
      "while true do pcall(load('local x = 0 for i = 1, 1e9 do x = x + 1 end')) end",
    ["a function defined inside a load()-made chunk"] =
      "local f = load('return function() local x = 0 while true do x = x + 1 end end')() f()",
    ["a backtracking string.find"] = "local s = ('a'):rep(3000) string.find(s, ('a-'):rep(10) .. 'b')",
    ["a backtracking pattern as a method, in a pcall loop"] =
      "local s = ('a'):rep(3000) while true do pcall(s.find, s, ('a*'):rep(4) .. 'b') end",
    ["gsub, gmatch and match"] = "local s = ('a'):rep(2000) pcall(s.gsub, s, 'a-a-a-b', '') "
      .. "pcall(s.match, s, '(a*)(a*)b') for _ in s:gmatch('a-a-a-b') do end while true do end",
    ["an xpcall handler that loops"] = "xpcall(function() while true do end end, function() while true do end end)",
    ["xpcall in an endless loop"] = "while true do xpcall(function() while true do end end, function(e) return e end) end",
    ["an __index metamethod loop"] = "local t = setmetatable({}, { __index = function() while true do end end }) local _ = t.x",
    ["an __eq metamethod loop"] = "local mt = { __eq = function() while true do end end } "
      .. "local _ = setmetatable({}, mt) == setmetatable({}, mt)",
    ["a __tostring loop called by the config"] =
      "local t = setmetatable({}, { __tostring = function() while true do end end }) pcall(tostring, t)",
    ["string.rep of a huge string"] = "while true do pcall(string.rep, 'x', 1e8) end",
    ["table.sort and table.concat"] = "local t = {} for i = 1, 1e4 do t[i] = i end "
      .. "while true do table.sort(t) table.concat(t, ',') end",
    ["unpack of a huge range"] = "while true do pcall(unpack, {}, 1, 1e7) end",
    ["table.insert at the front of a long list"] = "local t = {} for i = 1, 1e4 do t[i] = i end "
      .. "while true do table.insert(t, 1, 0) table.remove(t, 1) end",
    ["an error object's string methods"] = "local m = require('muon') "
      .. "local _, e = pcall(m.tensor.zeros({2}).view, m.tensor.zeros({2}), {7}) "
      .. "local s = e:rep(1000) while true do pcall(e.find, e, ('a-'):rep(8) .. 'b') end",
    ["tensor matmuls in a loop"] = "local T = require('muon').tensor local a = T.randn({64, 64}, 1) "
      .. "while true do local _ = a:matmul(a) end",
    ["one huge matmul (refused before it runs)"] =
      "local T = require('muon').tensor local a = T.zeros({8000, 1}) local _ = T.mm(a, a:transpose(1, 2))",
  }
  local names = {}
  for name in pairs(cases) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    it("ends " .. name .. " with the budget error", function() assert_budget(cases[name]) end)
  end

  it("never runs an error object's __tostring outside the budget", function()
    local ok, err = bounded("error(setmetatable({}, { __tostring = function() while true do end end, "
      .. "__index = function() while true do end end, __concat = function() while true do end end }))")
    assert.is_false(ok)
    assert.truthy(err:find("(error object is a table value)", 1, true), err)
    ok, err = bounded("error(setmetatable({ msg = 'own message' }, { __metatable = 'muon.error', "
      .. "__index = function() while true do end end }))")
    assert.is_false(ok)
    assert.truthy(err:find("own message", 1, true), err)
  end)

  it("a CPU-time limit ends a load even while instructions remain", function()
    local saved = config.LOAD_SECONDS
    config.LOAD_SECONDS = 1e-3
    local ok, err = load_error("while true do end")
    config.LOAD_SECONDS = saved
    assert.is_false(ok)
    assert.truthy(err:find("exceeded the load time limit of 0.001 CPU seconds", 1, true), err)
  end)

  it("a __gc metamethod on a table never runs", function()
    local ok, err = bounded("setmetatable({}, { __gc = function() while true do end end })")
    assert.is_true(ok, err)
    collectgarbage()
    collectgarbage()
  end)

  it("coroutines are blocked (no way to run outside the bounded coroutine)", function()
    for _, body in ipairs({ "coroutine.wrap(function() end)", "coroutine.create(function() end)" }) do
      local ok, err = bounded(body)
      assert_blocked(ok, err, body:match("^[%w.]+"))
    end
  end)

  it("a config within the budget still loads, with pcall, load and patterns working", function()
    local ok, err = bounded([[
      local ok, e = pcall(error, 'x', 0)
      assert(not ok and e == 'x')
      assert(select(2, xpcall(error, function(m) return 'handled ' .. m end, 'y', 0)) == 'handled y')
      assert(load('return 1 + ...')(2) == 3)
      assert(('layer.12.weight'):match('^layer%.(%d+)%.') == '12')
      assert(('a,b,c'):gsub(',', ';') == 'a;b;c')
      local t = { 3, 1, 2 } table.sort(t) assert(table.concat(t) == '123')
    ]])
    assert.is_true(ok, err)
  end)

  it("the pattern cost estimate bounds the real matcher's work (hand-counted cases)", function()
    local S = require("muon.sandbox")
    assert.equal(1 * 1 * 2, S.pattern_cost("^a", 10))          -- anchored, one item
    assert.equal(11 * 2, S.pattern_cost("a", 10))              -- 11 start positions
    assert.equal(11 * 11 * 3, S.pattern_cost("a*b", 10))       -- one quantifier
    assert.equal(11 * 11 * 11 * 4, S.pattern_cost("[%a]-%d+x", 10))
    assert.equal(11 * 2 * 3, S.pattern_cost("%.?x", 10))
    assert.equal(11 * 11 * 1, S.pattern_cost("%bxy", 10))      -- a balance scan
    -- a quantified item that ends the pattern cannot fail: one scan, no choices
    assert.equal(11 * 2 + 11, S.pattern_cost(".*", 10))
    assert.equal(1 * 11 * 4 + 11, S.pattern_cost("^(%w+)%.(%d-)", 10))
    assert.equal(11 * 11 * 3, S.pattern_cost(".*$", 10))       -- "$" after it: it can fail
    assert.equal(11 * 11 * 4, S.pattern_cost("a.*b", 10))
  end)
end)

describe("sandboxed config: no path to string.dump", function()
  local cases = {
    "('').dump(print)", "(\"x\").dump(print)", "local s = 'x' s.dump(print)", "string.dump(print)",
    "local m = require('muon') local _, e = pcall(m.tensor.zeros({2}).view, m.tensor.zeros({2}), {7}) e:dump()",
  }
  for _, body in ipairs(cases) do
    it("blocks " .. body, function()
      local ok, err = load_error(body)
      assert_blocked(ok, err, "string.dump")
      assert.equal(string.dump, ("").dump) -- the host's strings are intact afterwards
    end)
  end

  it("getmetatable('') is nil, at load time and in a hook", function()
    local ok, err = load_error("assert(getmetatable('') == nil) assert(getmetatable('x') == nil)")
    assert.is_true(ok, err)
    ok, err = hook_error("assert(getmetatable('') == nil) error('reached')")
    assert.truthy(err:find("reached", 1, true), err)
  end)

  it("blocks ('').dump inside a hook at step time, and restores the host's strings after", function()
    local ok, err = hook_error("('').dump(print)")
    assert_blocked(ok, err, "string.dump")
    assert.equal(string, getmetatable("").__index)
    ok, err = hook_error("local d = ('x').dump assert(d ~= string.dump) error('still sandboxed')")
    assert.truthy(err:find("still sandboxed", 1, true), err)
  end)

  it("a host function the config calls sees the host's strings (and the config's again after)", function()
    local ok, err = load_error([[
      local T = require('muon').tensor
      local _ = tostring(T.zeros({2}))       -- host code formatting strings
      local ok, e = pcall(T.zeros, 'bad')     -- a host error raised with string methods
      assert(not ok and tostring(e):find('shape', 1, true), tostring(e))
      assert(not pcall(T.zeros, { 2 }, 1 / 0 == 1 and 'x' or coroutine)) -- an argument that cannot leave
      assert(not pcall(function() return ('').dump(print) end), 'dump reachable after a host call')
    ]])
    assert.is_true(ok, err)
  end)
end)

describe("sandboxed config: hooks at step time", function()
  it("refuse a backtracking pattern instead of hanging", function()
    local ok, err = hook_error("local s = ('a'):rep(200) s:find(('a-'):rep(6) .. 'b')")
    assert.is_false(ok)
    assert.truthy(err:find("matching steps", 1, true), err)
  end)

  -- (Count hooks do not fire inside compiled traces: a hook's loop that got
  -- JIT-compiled would be invisible to any instruction budget.)
  it("are never JIT-compiled: their loops stay visible to count hooks (a trusted config's are not)", function()
    local ITER = 2e5
    local function hook_calls(trusted)
      local path = write_config("return { groups = { { optimizer = 'muon', lr = 0 } }, hooks = { "
        .. "post_update_fn = function() local x = 0 for i = 1, " .. ITER .. " do x = x + i % 7 end "
        .. "local f = load('local y = 0 for i = 1, " .. ITER .. " do y = y + i end return y') f() end } }")
      local eng = engine.new(path, { trusted = trusted })
      os.remove(path)
      eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
      eng:step() -- warm up: traces of the host's code exist in both runs
      local n = 0
      debug.sethook(function() n = n + 1 end, "", 1000)
      for _ = 1, 3 do eng:step() end
      debug.sethook()
      return n
    end
    local sandboxed, trusted = hook_calls(false), hook_calls(true)
    -- both loops, 3 steps, at least 2 instructions an iteration, interpreted
    assert.is_true(sandboxed >= 3 * 2 * ITER * 2 / 1000, tostring(sandboxed))
    assert.is_true(trusted < sandboxed / 2, ("trusted %d, sandboxed %d"):format(trusted, sandboxed))
  end)

  -- (A name of any length a parameter may have, up to MU_MAX_NAME = 64 KiB,
  -- routes: a group without match takes every name without running a
  -- pattern on it; ".*", the shipped configs' match, is linear in the
  -- name's length.)
  it("names of any length route with no match, or with match = '.*', and step", function()
    local no_match = write_config("return { groups = { { optimizer = 'adamw', exclude = 'bias' } } }")
    for _, n in ipairs({ 7 * 1024, 8 * 1024, 64 * 1024 }) do
      local name = ("h."):rep(n / 2)
      for _, cfg in ipairs({ no_match, "configs/muon.lua", { groups = { { optimizer = "lion" } } } }) do
        local eng = engine.new(cfg)
        local w, g = T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2)
        eng:add_param(name, w, g)
        assert.is_true(select(2, eng:step()))
        assert.equal(name, eng:describe()[1].name)
      end
    end
    os.remove(no_match)
  end)

  it("a group's match pattern that would backtrack for ages is refused at add_param", function()
    local path = write_config("return { groups = { { optimizer = 'adamw', match = ('a-'):rep(12) .. 'b' } } }")
    local eng = engine.new(path)
    os.remove(path)
    local ok, err = pcall(eng.add_param, eng, ("a"):rep(60), T.zeros({ 2 }), T.zeros({ 2 }))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("matching steps", 1, true), tostring(err))
    -- a long name shows as its first 60 bytes and its length
    ok, err = pcall(eng.add_param, eng, ("a"):rep(5000), T.zeros({ 2 }), T.zeros({ 2 }))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("on '" .. ("a"):rep(60) .. "...' (5000 bytes) may take ", 1, true), tostring(err))
  end)
end)

describe("config files: what is read, and the messages", function()
  local E = require("muon.errors")

  local function open_error(path, trusted)
    local ok, err = pcall(engine.new, path, trusted and { trusted = true } or nil)
    assert.is_false(ok, path)
    return err
  end

  local function bytes_file(bytes)
    local path = H.tmpname(".lua")
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
    return path
  end

  it("refuses bytecode, valid or malformed, after a #! line too, trusted or not (EFORMAT)", function()
    local valid = string.dump(assert(loadstring("return { groups = { { optimizer = 'adamw' } } }")))
    for _, bytes in ipairs({ valid, "\27LJ\2\255\255\255junk", "#!/usr/bin/env muon\n\27LJ\2\255junk",
                             "#!/usr/bin/env muon\n" .. valid }) do
      local path = bytes_file(bytes)
      for _, trusted in ipairs({ false, true }) do
        local err = open_error(path, trusted)
        assert.equal(E.EFORMAT, E.code(err))
        assert.equal(("config '%s': precompiled bytecode is not accepted (source text only)"):format(path), tostring(err))
      end
      os.remove(path)
    end
  end)

  it("refuses bytecode in the sandbox's load()", function()
    local ok, err = load_error("load(string.char(27) .. 'LJ')")
    assert_blocked(ok, err, "load of bytecode")
    ok, err = load_error("load('return 1', 'x', 'b')")
    assert_blocked(ok, err, "load of bytecode")
    -- after a #! line too
    ok, err = load_error("load('#!x\\n' .. string.char(27) .. 'LJ\\2junk')")
    assert_blocked(ok, err, "load of bytecode")
    ok, err = load_error("load('#!x\\n' .. string.char(27) .. 'LJ\\2junk', 'x', 't')")
    assert_blocked(ok, err, "load of bytecode")
  end)

  it("refuses a directory and a FIFO (without blocking), naming the path, resolved, and why (EIO)", function()
    local dir = H.tmpname(".d")
    assert(os.execute("mkdir " .. dir) == 0)
    local err = open_error(dir)
    assert.equal(E.EIO, E.code(err))
    assert.equal(("config '%s' (resolved %s): Is a directory"):format(dir, dir), tostring(err))
    local fifo = dir .. "/fifo.lua"
    assert(os.execute("mkfifo " .. fifo) == 0)
    err = open_error(fifo)
    assert.equal(E.EIO, E.code(err))
    assert.equal(("config '%s' (resolved %s): not a regular file (a FIFO)"):format(fifo, fifo), tostring(err))
    os.execute("rm -rf " .. dir)
  end)

  it("a missing config: the path as given, resolved, and the OS reason", function()
    local err = open_error("configs/does_not_exist.lua")
    assert.equal(E.EIO, E.code(err))
    local cwd = assert(io.popen("pwd -P")):read("*l")
    assert.equal(("config 'configs/does_not_exist.lua' (resolved %s/configs/does_not_exist.lua): "
      .. "No such file or directory"):format(cwd), tostring(err))
  end)

  it("a syntax error names the user's file and line, and no file of muon's own", function()
    local path = write_config("return {\n  groups = { { optimizer = 'adamw' }\n")
    local err = open_error(path)
    os.remove(path)
    assert.equal(E.EFORMAT, E.code(err))
    assert.truthy(tostring(err):find(("config '%s': syntax error: %s:3:"):format(path, path), 1, true), tostring(err))
  end)

  it("a bad argument to a sandboxed library function names the function and the config's line", function()
    for _, c in ipairs({ { "string.upper()", "upper" }, { "('x'):sub({})", "sub" }, { "string.rep()", "rep" },
                         { "('x'):find()", "find" }, { "string.format('%d', 'x')", "format" },
                         { "table.concat({ {} })", "concat" } }) do
      local path = write_config("\n" .. c[1] .. "\nreturn { groups = { { optimizer = 'adamw' } } }")
      local ok, err = pcall(engine.new, path)
      os.remove(path)
      assert.is_false(ok)
      assert.truthy(tostring(err):find(path .. ":2: ", 1, true), tostring(err))
      assert.truthy(tostring(err):find("'" .. c[2] .. "'", 1, true), tostring(err))
    end
  end)

  it("errors while running name no file of muon's own", function()
    for _, body in ipairs({ "require('muon').tensor.zeros('x')", "require('muon').tensor.zeros({2}):view({7})",
                            "('x'):upper(nil, {}) string.upper()", "string.rep()", "table.concat({ {} })",
                            "require('muon').optim.Muon({}, { lr = 'fast' })" }) do
      local ok, err = load_error(body)
      assert.is_false(ok, body)
      assert.is_nil(err:find("muon/[%w_]+%.lua:%d"), err)
      assert.truthy(err:find("error while running", 1, true), err)
    end
  end)
end)
