-- Loading config files. A config is a Lua chunk returning a table; it runs
-- in a restricted environment unless the caller trusts it: no os.execute,
-- io, ffi, debug, bytecode, or require of anything but muon's own modules.
-- Whatever muon module a sandboxed config requires is a facade, and every
-- value crossing between the config and the host goes through the membrane
-- of lua/muon/sandbox.lua: the config sees tensor proxies, never FFI cdata,
-- so it cannot reach raw pointers (tensor:ptr(), tensor.data), write files
-- (tensor:save, safetensors) or get at the FFI library (muon.core).
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")
local sandbox = require("muon.sandbox")
local config = {}

local HOW_TO_ALLOW = sandbox.HOW_TO_ALLOW

local function blocked(what, path)
  return function()
    E.blame(E.EINVAL, "config '%s': %s is blocked in sandboxed configs; to allow it load the config with %s",
      path, what, HOW_TO_ALLOW)
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

-- The environment of a sandboxed config; box (sandbox.new_box()): where
-- the limits of its calls at step time go.
local BOX = setmetatable({}, { __mode = "k" }) -- env -> its box

function config.sandbox(path)
  local env = {
    assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs,
    select = select, tonumber = tonumber, type = type,
    -- (these and pcall, xpcall, string.gsub, string.format, table.sort count
    -- how deep library calls nest: lua/muon/sandbox.lua)
    tostring = sandbox.tostring, print = sandbox.print,
    setmetatable = setmetatable,
    -- pcall/xpcall that never catch the load budget's error; unpack charged
    pcall = sandbox.pcall, xpcall = sandbox.xpcall, unpack = sandbox.unpack,
    -- only tables' metatables: the string metatable is shared with the host
    getmetatable = function(x) if type(x) == "table" then return getmetatable(x) end return nil end,
    rawget = rawget, rawset = rawset, rawequal = rawequal,
    math = copy(math), string = copy(sandbox.SAFE_STRING), table = sandbox.safe_table(), bit = copy(bit),
    os = guarded("os", { time = sandbox.os_time, clock = os.clock, date = os.date, getenv = os.getenv,
      difftime = os.difftime }, { "time", "clock", "date", "getenv", "difftime" }, path),
    io = guarded("io", {}, {}, path),
    debug = guarded("debug", {}, {}, path),
    ffi = guarded("ffi", {}, {}, path),
    package = guarded("package", {}, {}, path),
    jit = guarded("jit", {}, {}, path),
    coroutine = guarded("coroutine", {}, {}, path),
    dofile = blocked("dofile", path), loadfile = blocked("loadfile", path),
    loadstring = blocked("loadstring", path), collectgarbage = blocked("collectgarbage", path),
    module = blocked("module", path), setfenv = blocked("setfenv", path), getfenv = blocked("getfenv", path),
    newproxy = blocked("newproxy", path),
  }
  env.string.dump = blocked("string.dump", path)
  -- load of source text only, in this same sandbox, never JIT-compiled
  env.load = sandbox.text_load(env, function(what) blocked(what, path)() end)
  env.require = sandbox.new_require(path)
  env._G = env
  BOX[env] = sandbox.new_box()
  return env
end

-- VM instructions a sandboxed config may run while it loads (about a
-- second of interpreted Lua), at most LOAD_SECONDS of CPU time and
-- LOAD_MEMORY bytes of Lua heap growth. Its calls at step time have their
-- own limits, the config's hook_budget (config.hook_limits).
config.LOAD_BUDGET = 1e9
config.LOAD_SECONDS = 10
config.LOAD_MEMORY = 2 ^ 31

-- Run a sandboxed chunk with the load budget (lua/muon/sandbox.lua,
-- S.run_bounded: interpreted, in its own coroutine, the budget cannot be
-- caught). LuaJIT has one hook per VM, so when the host already runs a hook
-- (a profiler, a debugger, a coverage tool) it is left alone and the load
-- is not bounded. Returns ok, result; or false, message, code (MU_ENOMEM
-- when memory or stack ran out, else nil).
function config.run_bounded(chunk)
  return sandbox.run_bounded(chunk, { instructions = config.LOAD_BUDGET, seconds = config.LOAD_SECONDS,
    memory = config.LOAD_MEMORY, what = "load" }, BOX[getfenv(chunk)])
end

local fail = E.raise

-- The text of a config or script file: only a regular file (a directory, a
-- FIFO, a device is refused without blocking), or an EIO error object
-- "<what> '<path>' (resolved <absolute path>): <OS reason>".
function config.read_file(path, what)
  local resolved = ffi.new("char[?]", 4096)
  if core.C.mu_file_check(path, resolved, 4096) ~= 0 then
    fail(E.EIO, "%s '%s' (resolved %s): %s", what, path, ffi.string(resolved), ffi.string(core.C.mu_last_error()))
  end
  local f, err = io.open(path, "rb")
  if not f then fail(E.EIO, "%s '%s' (resolved %s): %s", what, path, ffi.string(resolved), tostring(err)) end
  local text, rerr = f:read("*a")
  f:close()
  if type(text) ~= "string" then
    fail(E.EIO, "%s '%s' (resolved %s): %s", what, path, ffi.string(resolved), tostring(rerr))
  end
  return text
end

-- Compile source text (never bytecode: LuaJIT would parse a precompiled
-- chunk before anything refused it, and a malformed one crashes the VM).
-- name: the file as messages show it. Raises an EFORMAT error object.
function config.compile(text, name, env, what)
  if sandbox.is_bytecode(text) then
    fail(E.EFORMAT, "%s '%s': precompiled bytecode is not accepted (source text only)", what, name)
  end
  local chunk, err
  if env then chunk, err = load(text, "@" .. name, "t", env) else chunk, err = load(text, "@" .. name, "t") end
  if not chunk then fail(E.EFORMAT, "%s '%s': syntax error: %s", what, name, tostring(err)) end
  return chunk
end

-- The limits of one call of a config function at step time (hook,
-- schedule, match function), from the config's top-level hook_budget =
-- { instructions = n, seconds = s, memory = bytes }: each a number > 0
-- (math.huge: no limit); a missing one takes its default,
-- sandbox.HOOK_BUDGET (10^10 instructions, 300 CPU seconds, 1 GiB of Lua
-- heap). Sandboxed configs always run with them (and with the nesting
-- limit, sandbox.MAX_NESTING); trusted ones only when they set hook_budget.
-- Returns the limits, or nil (trusted, none set); raises EINVAL naming a
-- bad key or value.
local BUDGET_KEYS = { instructions = true, seconds = true, memory = true }
function config.hook_limits(budget, trusted, where)
  if budget == nil and trusted then return nil end
  if budget ~= nil and type(budget) ~= "table" then
    fail(E.EINVAL, "config %s: hook_budget must be a table { instructions = n, seconds = s, memory = bytes }, got %s",
      where, type(budget))
  end
  budget = budget or {}
  E.check_keys(budget, BUDGET_KEYS, "hook_budget key", ("config %s: hook_budget"):format(where))
  local limits = { what = "hook" }
  for k, v in pairs(sandbox.HOOK_BUDGET) do limits[k] = v end
  for k, v in pairs(budget) do
    if type(v) ~= "number" or v ~= v or v <= 0 then
      fail(E.EINVAL, "config %s: hook_budget.%s must be a number > 0 (math.huge: no limit), got %s", where, k, tostring(v))
    end
    limits[k] = v
  end
  return limits
end

-- A trusted config's functions under limits: every function in its plain
-- tables (groups, hooks, schedule, match lists; not in tables with a
-- metatable) replaced by one that calls it as one bounded run, never
-- JIT-compiled (compiled code does not see the instruction count). The
-- tables are copied (the caller's stay as they are).
local function bound_functions(v, limits, seen)
  if type(v) == "function" then
    jit.off(v, true)
    return function(...) return sandbox.call_bounded(limits, v, ...) end
  end
  if type(v) ~= "table" or getmetatable(v) ~= nil then return v end
  if seen[v] then return seen[v] end
  local c = {}
  seen[v] = c
  for k, x in pairs(v) do c[k] = bound_functions(x, limits, seen) end
  return c
end

-- Load a config: a path (string) or an already-built table; with text (a
-- string), src only names the config and text is its source (a host's
-- config given as a string). Returns the table; raises an error object
-- (EIO: the file cannot be read; EFORMAT: syntax error or bytecode; else
-- the code of what the config raised, or EINVAL) naming the path and the
-- reason.
function config.load(src, trusted, text)
  if type(src) == "table" then
    -- (built by the host: trusted)
    local limits = config.hook_limits(src.hook_budget, true, "(table)")
    if limits then src = bound_functions(src, limits, {}) end
    return src, "(table)"
  end
  if type(src) ~= "string" then E.blame(E.EINVAL, "config must be a file path or a table, got %s", type(src)) end
  if text ~= nil and type(text) ~= "string" then E.blame(E.EINVAL, "config source must be a string, got %s", type(text)) end
  text = text or config.read_file(src, "config")
  local env = trusted and setmetatable({}, { __index = _G }) or config.sandbox(src)
  local chunk = config.compile(text, src, env, "config")
  local ok, result, code
  if trusted then
    ok, result = xpcall(chunk, E.capture)
    if not ok then
      result = E.caught(result)
      code = E.code(result)
      if type(result) ~= "string" and not E.is(result) then
        local okm, m = pcall(tostring, result) -- a trusted config's own error value
        result = okm and type(m) == "string" and m or E.message(result)
      end
    end
  else
    -- (a message: nothing of the config's runs once it has returned)
    ok, result, code = config.run_bounded(chunk)
  end
  if not ok then fail(code or E.EINVAL, "config '%s': error while running: %s", src, E.message(result)) end
  if type(result) ~= "table" then
    fail(E.EINVAL, "config '%s' must return a table, got %s", src, type(result))
  end
  local where = "'" .. src .. "'"
  if not trusted then
    -- hooks, schedules and match functions run behind the membrane, under
    -- the limits of the config's hook_budget
    local box = BOX[env]
    local okx, exported = pcall(sandbox.export, result, box)
    if not okx then fail(E.code(exported) or E.EINVAL, "config '%s': %s", src, E.message(exported)) end
    result = exported
    box.limits = config.hook_limits(result.hook_budget, false, where)
  else
    local limits = config.hook_limits(result.hook_budget, true, where)
    if limits then result = bound_functions(result, limits, {}) end
  end
  return result, src
end

return config
