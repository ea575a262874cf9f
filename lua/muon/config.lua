-- Loading config files. A config is a Lua chunk returning a table; it runs
-- in a restricted environment unless the caller trusts it: no os.execute,
-- io, ffi, debug, bytecode, or require of anything but muon's own modules.
local config = {}

local TOP_KEYS = { groups = true, schedule = true, hooks = true, dist = true, name = true, seed = true }
config.TOP_KEYS = TOP_KEYS

local HOW_TO_ALLOW = "trusted = true (muon run --trust, or mu_engine_open_ex's trusted flag)"

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
    xpcall = xpcall, print = print, setmetatable = setmetatable, getmetatable = getmetatable,
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
  env.require = function(name)
    if name == "muon" or (type(name) == "string" and name:match("^muon%.[%w_.]+$")) then
      return require(name)
    end
    blocked("require('" .. tostring(name) .. "')", path)()
  end
  env._G = env
  return env
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
  local ok, result = pcall(chunk)
  if not ok then error(("config '%s': error while running: %s"):format(src, tostring(result)), 2) end
  if type(result) ~= "table" then
    error(("config '%s' must return a table, got %s"):format(src, type(result)), 2)
  end
  return result, src
end

return config
