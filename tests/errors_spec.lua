-- Error objects (lua/muon/errors.lua): they behave like their message for
-- Lua callers, core.check gives them the C status as their code, and
-- E.call_hook tags whatever a config function raises as MU_ELUA.
local H = require("helpers")
local T = H.muon.tensor
local ns = H.muon.ns
local core = require("muon.core")
local E = require("muon.errors")
local C = core.C

local NAMES = { "EINVAL", "ENOMEM", "EIO", "EFORMAT", "EDTYPE", "ESHAPE", "ENONFINITE", "ESTATE", "ELUA", "ECOMM" }

-- The error a function raises (it must raise).
local function raised(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return err
end

describe("error codes", function()
  it("are the C header's, by name and back", function()
    assert.equal(0, E.OK)
    for _, n in ipairs(NAMES) do
      assert.equal(tonumber(C["MU_" .. n]), E[n], n)
      assert.equal(n, E.name(E[n]))
      assert.equal(n, require("ffi").string(C.mu_errname(E[n])))
    end
    assert.is_nil(E.name(-99))
  end)

  it("a misspelt name is an error, not nil", function()
    assert.has_error(function() return E.EINVALL end, "muon.errors: no code or function 'EINVALL'")
    assert.has_error(function() E.new(-99, "x") end, "muon.errors: -99 is not a failure code")
    assert.has_error(function() E.new(E.OK, "x") end, "muon.errors: 0 is not a failure code")
  end)
end)

describe("error objects", function()
  it("behave like their message", function()
    local e = E.new(E.EIO, "cannot open 'x.npy': No such file")
    assert.is_true(E.is(e))
    assert.equal("cannot open 'x.npy': No such file", tostring(e))
    assert.equal("load: cannot open 'x.npy': No such file!", "load: " .. e .. "!")
    assert.equal(13, (e:find("'x.npy'", 1, true)))
    assert.equal("x.npy", e:match("'([^']+)'"))
    assert.equal("cannot open 'y.npy': No such file", (e:gsub("x%.npy", "y.npy")))
    assert.equal(#e.msg, e:len())
    assert.equal(E.EIO, e.code)
    assert.equal("muon.error", getmetatable(e)) -- protected
    assert.has_error(function() setmetatable(e, {}) end)
  end)

  it("work with busted's error assertions", function()
    local function f() E.raise(E.EINVAL, "group %d: lr must be >= 0, got %s", 2, -1) end
    assert.has_error(f, "group 2: lr must be >= 0, got -1")
    assert.error_matches(f, "lr must be >= 0")
    assert.matches("^group 2", raised(f))
  end)

  it("carry no position prefix", function()
    local err = raised(E.raise, E.EFORMAT, "bad header")
    assert.equal("bad header", err.msg)
    assert.equal("100% sure", raised(E.raise, E.EINVAL, "100% sure").msg) -- no format without arguments
  end)

  it("E.code: objects, tables naming a code, and plain values", function()
    assert.equal(E.ESHAPE, E.code(E.new(E.ESHAPE, "x")))
    -- a table that is not muon's error object cannot choose a code
    assert.is_nil(E.code({ code = "EFORMAT", msg = "x" }))
    assert.is_nil(E.code({ code = -3 }))
    assert.is_nil(E.code({ code = "ENOPE" }))
    assert.is_nil(E.code({ code = 0 }))
    assert.is_nil(E.code("x"))
    assert.is_nil(E.code(nil))
    assert.equal("x", E.message({ msg = "x" }))
    assert.equal("(error object is a boolean value)", E.message(false))
    assert.equal("3", E.message(3))
  end)

  it("E.wrap prefixes the message and keeps code and traceback", function()
    local w = E.wrap(E.new(E.EIO, "cannot open", "TB"), "load: ")
    assert.is_true(E.is(w))
    assert.equal("load: cannot open", w.msg)
    assert.equal(E.EIO, w.code)
    assert.equal("TB", w.tb)
    assert.equal("x: plain", E.wrap("plain", "x: ")) -- no code, no fallback: still a string
    local f = E.wrap("plain", "x: ", E.EFORMAT)
    assert.equal(E.EFORMAT, f.code)
    assert.equal("x: plain", f.msg)
  end)
end)

describe("core.check", function()
  it("raises objects whose code is the C status, with the messages as before", function()
    local err = raised(function() return T.zeros({ 2, 3 }):view({ 7 }) end)
    assert.is_true(E.is(err))
    assert.equal(E.ESHAPE, err.code)
    assert.equal("view: view of 6 elements as a shape of 7 elements", err.msg)

    local missing = H.tmpname(".npy")
    err = raised(T.load, missing)
    assert.equal(E.EIO, err.code)
    assert.truthy(err:find("load: ", 1, true) == 1, err.msg)
    assert.truthy(err:find(missing, 1, true), err.msg)

    H.write_file(missing, "not an npy file at all")
    err = raised(T.load, missing)
    os.remove(missing)
    assert.equal(E.EFORMAT, err.code)

    local x = T.zeros({ 3, 3 })
    x:set(0 / 0, 2, 2)
    err = raised(ns.zeropower, x)
    assert.equal(E.ENONFINITE, err.code)
    assert.matches("^zeropower: .*NaN or Inf", err.msg)
  end)

  it("is E.check", function()
    assert.equal(core.check, E.check)
    assert.has_no.errors(function() core.check(0, "fine") end)
    local err = raised(core.check, C.MU_EDTYPE, nil)
    assert.equal(E.EDTYPE, err.code)
  end)
end)

describe("E.call_hook", function()
  it("returns the hook's results, nils included", function()
    local a, b, c, d = E.call_hook("hook", function(x, y) return x, nil, y end, 1, 2)
    assert.equal(1, a)
    assert.is_nil(b)
    assert.equal(2, c)
    assert.is_nil(d)
    assert.equal(3, select("#", E.call_hook("hook", function() return nil, nil, nil end)))
  end)

  it("tags whatever the hook raises as MU_ELUA, naming the hook", function()
    local function inner() error("boom") end
    local err = raised(E.call_hook, "post_update_fn", function() inner() end)
    assert.is_true(E.is(err))
    assert.equal(E.ELUA, err.code)
    assert.matches("^post_update_fn: .*errors_spec%.lua:%d+: boom$", err.msg)
    -- the traceback reaches down to the line that raised
    assert.truthy(err.tb:find("in function 'inner'", 1, true), err.tb)

    err = raised(E.call_hook, "schedule", function() error({ code = "EIO", msg = "forged" }) end)
    assert.equal(E.ELUA, err.code)
    assert.equal("schedule: forged", err.msg)

    err = raised(E.call_hook, "hook", function() error(setmetatable({}, { __tostring = function() return "custom" end })) end)
    assert.equal("hook: custom", err.msg)

    err = raised(E.call_hook, "hook", function() error() end)
    assert.equal("hook: (error object is a nil value)", err.msg)

    -- a muon error inside the hook: still the hook's failure
    err = raised(E.call_hook, "zeropower_fn", function() return T.zeros({ 2, 3 }):view({ 7 }) end)
    assert.equal(E.ELUA, err.code)
    assert.equal("zeropower_fn: view: view of 6 elements as a shape of 7 elements", err.msg)
  end)

  it("does not wrap an MU_ELUA object twice", function()
    local err = raised(E.call_hook, "outer", function()
      E.call_hook("inner", function() error("deep", 0) end)
    end)
    assert.equal("inner: deep", err.msg)
    assert.equal(E.ELUA, err.code)
  end)
end)

describe("E.capture", function()
  it("keeps the traceback of the first raise when an error is raised again", function()
    local function deep() error("again-" .. tostring(os.time()), 0) end
    local ok, caught = xpcall(deep, E.capture)
    assert.is_false(ok)
    local line = debug.getinfo(deep, "S").linedefined
    assert.truthy(caught[2]:find("errors_spec.lua:" .. line .. ":", 1, true), caught[2])
    -- raised again elsewhere: the first traceback comes back
    local ok2, again = xpcall(function() error(caught[1], 0) end, E.capture)
    assert.is_false(ok2)
    assert.equal(caught[2], again[2])
    assert.equal(caught[2], E.traceback(caught[1]))
    assert.is_nil(E.traceback("never raised " .. tostring(os.clock())))
  end)
end)

-- Blame (lua/muon/errors.lua, core.position): misuse of a public function
-- names the user's line that called into muon, found by frame; nothing
-- when no Lua line of the user's called muon (a C function: pcall, a C
-- host; muon's own pcalls).
describe("E.blame", function()
  local SPEC = debug.getinfo(1, "S").short_src
  local x = T.zeros({ 2, 2 })
  local function message(f)
    local ok, err = pcall(f)
    assert.is_false(ok)
    return tostring(err)
  end
  -- the line of the caller of here()
  local function here() return debug.getinfo(2, "l").currentline end
  local function tail() return x:add({}) end -- a tail call into muon

  it("names the spec's line that called muon: methods, module functions, operators, foreach, ns, modules", function()
    local F, muon = H.muon.foreach, H.muon
    local cases = {
      { here(), function() local r = x:add({}) return r end, "add: other must be a tensor or a number, got table" },
      { here(), function() local r = T.mul(x, "2") return r end, "mul: other must be a tensor or a number, got string" },
      { here(), function() local r = x + {} return r end, "add: other must be a tensor or a number, got table" },
      { here(), function() local r = x:sum(3) return r end, "sum: dim 3 out of range for a 2-D tensor (1..2 or -2..-1)" },
      { here(), function() local r = T.zeros({ 2 }, "float16") return r end,
        "dtype must be 'float32', 'float64' or 'bfloat16', got float16" },
      -- found three calls deep inside muon (the old fixed level named tensor.lua)
      { here(), function() local r = T.from({ { { 1 }, { 2 } }, { { 1 }, { 2, 3 } } }) return r end,
        "ragged nested table at dim 3" },
      { here(), function() F.scale({ x }, { 1, 2 }) end, "scales has 2 values, expected 1" },
      { here(), function() local r = muon.ns.zeropower(x, { steps = -1 }) return r end,
        "ns_steps must be a non-negative integer, got -1" },
      { here(), function() local r = muon.optm return r end, "muon has no field 'optm'" },
    }
    for i, c in ipairs(cases) do
      local msg = message(c[2])
      assert.equal(SPEC .. ":" .. c[1] .. ": " .. c[3], msg:sub(1, #SPEC + #tostring(c[1]) + 3 + #c[3]), "case " .. i)
    end
    -- a tail call into muon leaves no frame of its caller: as with Lua's own
    -- errors, the line that called the caller is named
    local line = here(); local msg = message(function() local r = tail() return r end)
    assert.equal(SPEC .. ":" .. line .. ": add: other must be a tensor or a number, got table", msg)
    -- E.blame from the user's own code names that line
    line = here(); msg = message(function() E.blame(E.EINVAL, "%d%% bad", 100) end)
    assert.equal(SPEC .. ":" .. line .. ": 100% bad", msg)
    assert.equal(E.EINVAL, E.code(select(2, pcall(E.blame, E.EINVAL, "x"))))
  end)

  it("names no line when a C function called muon (pcall), or no frame is below muon's", function()
    local ok, err = pcall(T.from, "x")
    assert.is_false(ok)
    assert.equal("values must be a table", err.msg)
    ok, err = pcall(x.add, x, {})
    assert.equal("add: other must be a tensor or a number, got table", err.msg)
    -- no frame below muon's at all (a coroutine's body, as a C host's call)
    ok, err = coroutine.resume(coroutine.create(T.from), "x")
    assert.is_false(ok)
    assert.equal("values must be a table", err.msg)
    ok, err = pcall(H.muon.ns.resolve, { variant = "nope" })
    assert.matches("^ns_variant must be ", err.msg)
  end)

  -- Configs: the config's line when a trusted config calls muon; behind
  -- the sandbox's membrane (a C xpcall) none, as before.
  local dir = H.tmpdir()
  local HOOK = table.concat({
    "return { groups = { { optimizer = 'muon', post_update_fn = function(p, t)",
    "  local r = t:add({})",
    "  return r",
    "end } } }",
  }, "\n") .. "\n"
  local WANT = "add: other must be a tensor or a number, got table"
  teardown(function() H.rmrf(dir) end)

  it("in a config's hook at step time: the hook's line when trusted, none when sandboxed (engine.new)", function()
    local path = dir .. "/hook.lua"
    H.write_file(path, HOOK)
    local engine = require("muon.engine")
    for _, trusted in ipairs({ true, false }) do
      local e = engine.new(path, { trusted = trusted })
      e:add_param("w", T.randn({ 2, 2 }, 1), T.randn({ 2, 2 }, 2))
      local ok, err = pcall(e.step, e)
      assert.is_false(ok)
      assert.equal(E.ELUA, E.code(err))
      assert.equal("post_update_fn: " .. (trusted and (path .. ":2: ") or "") .. WANT, err.msg)
    end
  end)

  it("in a config's top level: its line when trusted, none when sandboxed", function()
    local path = dir .. "/top.lua"
    H.write_file(path, "local T = require('muon.tensor')\nlocal r = T.zeros({ 2 }):add({})\nreturn r\n")
    local config = require("muon.config")
    for _, trusted in ipairs({ true, false }) do
      local ok, err = pcall(config.load, path, trusted)
      assert.is_false(ok)
      assert.equal(("config '%s': error while running: %s%s"):format(path, trusted and (path .. ":2: ") or "", WANT),
        err.msg)
    end
  end)

  it("through a C host (mu_engine_*): the trusted hook's line, else none, never muon's files", function()
    local ffi = require("ffi")
    local path = dir .. "/chost.lua"
    H.write_file(path, HOOK)
    for _, trusted in ipairs({ true, false }) do
      local box = ffi.new("mu_engine *[1]")
      local opts = ffi.new("mu_engine_opts", { trusted = trusted and 1 or 0 })
      assert.equal(0, C.mu_engine_open_ex(box, path, opts), ffi.string(C.mu_last_error()))
      local e = ffi.gc(box[0], C.mu_engine_close)
      local shape = ffi.new("int64_t[2]", { 2, 2 })
      local w, g = ffi.new("float[4]", { 1, 2, 3, 4 }), ffi.new("float[4]", { 1, 1, 1, 1 })
      assert.equal(0, C.mu_engine_add_param(e, "w", C.MU_F32, 2, shape, w, g))
      assert.equal(E.ELUA, C.mu_engine_step(e))
      local msg = ffi.string(C.mu_engine_error(e))
      assert.equal("mu_engine_step: post_update_fn: " .. (trusted and (path .. ":2: ") or "") .. WANT,
        msg:match("^[^\n]*"))
      assert.is_nil(msg:find("muon/[%w_/]+%.lua:%d"), msg)
      C.mu_engine_close(ffi.gc(e, nil))
    end
  end)

  it("in a user's script run by the CLI (a C host): the script's line", function()
    local cli = H.root .. "/" .. (os.getenv("MUON_BUILD") or "build") .. "/muon"
    local path = dir .. "/script.lua"
    H.write_file(path, "local T = require('muon').tensor\n\nT.from({ { { 1 }, { 2 } }, { { 1 }, { 2, 3 } } })\n")
    local p = io.popen(("%q run %q 2>&1"):format(cli, path))
    local out = p:read("*a")
    p:close()
    assert.equal("muon: " .. path .. ":3: ragged nested table at dim 3", out:match("^[^\n]*"))
  end)
end)

describe("the Lua sources", function()
  -- level + 1 threaded through calls; a position pattern (":%d+: ")
  -- matched or stripped; error(msg, N) blaming a fixed frame
  local function offending(line)
    local code = line:gsub("^%s*%-%-.*$", "")
    return code:find("level%s*%+%s*%d") or code:find(":%%d%+:", 1) or code:find("[^%w_.:]error%(.*,%s*[1-9]%)")
      or code:find("^error%(.*,%s*[1-9]%)") or code:find("debug%.getinfo%(%s*level%s*%+") or false
  end

  it("the check finds what it looks for", function()
    for _, line in ipairs({ "  error(msg, level + 1)", "check(rc, what, level+1)",
                            [[  return (tostring(e):gsub("^[^:]*:%d+: ", ""))]], [[msg:find("^[%w_/]*%.lua:%d+: ")]],
                            "error(('x %d'):format(n), 2)", "if bad then error(msg, 3) end",
                            "local info = debug.getinfo(level + 1, 'Sl')" }) do
      assert.truthy(offending(line), line)
    end
    for _, line in ipairs({ "error(msg, 0)", "E.blame(E.EINVAL, 'x %d', 2)", "-- error(msg, 2) in a comment",
                            "local top_level = 1" }) do
      assert.is_false(offending(line), line)
    end
  end)

  it("count no error levels and strip no positions (errors are blamed by frame, lua/muon/errors.lua)", function()
    local p = io.popen("cd " .. H.root .. " && find lua -name '*.lua' | sort")
    local files = {}
    for f in p:lines() do files[#files + 1] = f end
    p:close()
    assert.truthy(#files > 15, #files)
    local bad = {}
    for _, f in ipairs(files) do
      local n = 0
      for line in io.lines(H.root .. "/" .. f) do
        n = n + 1
        if offending(line) then bad[#bad + 1] = f .. ":" .. n .. ": " .. line end
      end
    end
    assert.same({}, bad)
  end)
end)
