-- Loading config files. A config is a Lua chunk returning a table; it runs
-- in a restricted environment unless the caller trusts it: no os.execute,
-- io, ffi, debug, bytecode, or require of anything but muon's own modules.
-- Whatever muon module a sandboxed config requires is a facade, and every
-- value crossing between the config and the host goes through the membrane
-- of lua/muon/sandbox.lua: the config sees tensor proxies, never FFI cdata,
-- so it cannot reach raw pointers (tensor:ptr(), tensor.data), write files
-- (tensor:save, safetensors) or get at the FFI library (muon.core).
local sandbox = require("muon.sandbox")
local config = {}

local TOP_KEYS = { groups = true, schedule = true, hooks = true, dist = true, name = true, seed = true }
config.TOP_KEYS = TOP_KEYS

local HOW_TO_ALLOW = sandbox.HOW_TO_ALLOW

local function blocked(what, path)
  return function()
    error(("config '%s': %s is blocked in sandboxed configs; to allow it load the config with %s")
      :format(path, what, HOW_TO_ALLOW), 2)
  end
end

-- A read-only proxy of lib that raises for any member not in allowed.
local function guarded(libname, lib, allowed, path)
  local t = {}
  for _, k in ipairs(allowed) do t[k] = lib[k] end
  return setmetatable(t, {
    __index = function(_, k) blocked(libname .. "." .. tostring(k), path)() end,
  })
end

local function copy(lib)
  local t = {}
  for k, v in pairs(lib) do t[k] = v end
  return t
end

function config.sandbox(path)
  local env = {
    assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, pcall = pcall,
    select = select, tonumber = tonumber, tostring = tostring, type = type, unpack = unpack,
    xpcall = xpcall, print = print, setmetatable = setmetatable,
    -- only tables' metatables: the string metatable is shared with the host
    getmetatable = function(x) if type(x) == "table" then return getmetatable(x) end return nil end,
    rawget = rawget, rawset = rawset, rawequal = rawequal,
    math = copy(math), string = copy(string), table = copy(table), bit = copy(bit),
    os = guarded("os", os, { "time", "clock", "date", "getenv", "difftime" }, path),
    io = guarded("io", {}, {}, path),
    debug = guarded("debug", {}, {}, path),
    ffi = guarded("ffi", {}, {}, path),
    package = guarded("package", {}, {}, path),
    jit = guarded("jit", {}, {}, path),
    dofile = blocked("dofile", path), loadfile = blocked("loadfile", path),
    loadstring = blocked("loadstring", path), collectgarbage = blocked("collectgarbage", path),
    module = blocked("module", path), setfenv = blocked("setfenv", path), getfenv = blocked("getfenv", path),
  }
  env.string.dump = blocked("string.dump", path)
  -- load of source text only, in this same sandbox.
  env.load = function(chunk, name, mode, e)
    if mode ~= nil and mode ~= "t" or (type(chunk) == "string" and chunk:byte(1) == 27) then
      blocked("load of bytecode", path)()
    end
    if type(chunk) ~= "string" then blocked("load of a reader function", path)() end
    return load(chunk, name, "t", e or env)
  end
  env.require = sandbox.new_require(path)
  env._G = env
  return env
end

-- VM instructions a sandboxed config may run while it loads (its hooks,
-- called later, are not bounded). About a second of interpreted Lua.
config.LOAD_BUDGET = 1e9

-- Run a sandboxed chunk with an instruction budget: interpreted (count
-- hooks do not fire in JIT traces), in its own coroutine. LuaJIT has one
-- hook per VM, so when the host already runs a hook (a profiler, a
-- debugger, a coverage tool) it is left alone and the load is not bounded.
function config.run_bounded(chunk)
  local co = coroutine.create(chunk)
  if debug.gethook() ~= nil then
    local ok, result = coroutine.resume(co)
    if ok and coroutine.status(co) ~= "dead" then ok, result = false, "coroutine.yield is not allowed in a config" end
    return ok, result
  end
  jit.off(chunk, true)
  debug.sethook(co, function()
    error(("exceeded the load budget of %.0f Lua instructions (endless loop?)"):format(config.LOAD_BUDGET), 0)
  end, "", config.LOAD_BUDGET)
  local ok, result = coroutine.resume(co)
  debug.sethook(co)
  jit.on(chunk, true)
  if ok and coroutine.status(co) ~= "dead" then
    ok, result = false, "coroutine.yield is not allowed in a config"
  end
  return ok, result
end

-- Load a config: a path (string) or an already-built table. Returns the
-- table; raises with the path and the reason.
function config.load(src, trusted)
  if type(src) == "table" then return src, "(table)" end
  if type(src) ~= "string" then error("config must be a file path or a table, got " .. type(src), 2) end
  local f = io.open(src, "rb")
  if not f then error(("config '%s': cannot open the file"):format(src), 2) end
  local text = f:read("*a")
  f:close()
  if text:byte(1) == 27 then error(("config '%s': precompiled bytecode configs are not accepted"):format(src), 2) end
  local env = trusted and setmetatable({}, { __index = _G }) or config.sandbox(src)
  local chunk, err = load(text, "@" .. src, "t", env)
  if not chunk then error(("config '%s': syntax error: %s"):format(src, err), 2) end
  local ok, result
  if trusted then
    ok, result = pcall(chunk)
  else
    ok, result = config.run_bounded(chunk)
  end
  if not ok then error(("config '%s': error while running: %s"):format(src, tostring(result)), 2) end
  if type(result) ~= "table" then
    error(("config '%s' must return a table, got %s"):format(src, type(result)), 2)
  end
  if not trusted then
    -- hooks, schedules and match functions run behind the membrane
    local okx, exported = pcall(sandbox.export, result)
    if not okx then error(("config '%s': %s"):format(src, tostring(exported)), 2) end
    result = exported
  end
  return result, src
end

return config
