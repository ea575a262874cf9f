-- Configs: loading them, their own keys (CONFIG_KEYS, GROUP_KEYS,
-- DIST_KEYS) and a loaded config's groups (config.resolve: each group's
-- kind, checked options and routing rules; the engine routes parameters by
-- them). Loading: a config is a Lua chunk returning a table; it runs
-- in a restricted environment unless the caller trusts it: no os.execute,
-- io, ffi, debug, bytecode, or require of anything but muon's own modules.
-- Whatever muon module a sandboxed config requires is a facade, and every
-- value crossing between the config and the host goes through the membrane
-- of lua/muon/sandbox/membrane.lua: the config sees tensor proxies, never FFI cdata,
-- so it cannot reach raw pointers (tensor:ptr(), tensor.data), write files
-- (tensor:save, safetensors) or get at the FFI library (muon.core).
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")
local sandbox = require("muon.sandbox")
local D = require("muon.dist")
local commlib = require("muon.comm")
local O = require("muon.optim.options")
local K = require("muon.optim.kind")
local kinds = require("muon.optim.kinds")
local Rt = require("muon.routing")
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
    -- how deep library calls nest: lua/muon/sandbox/nesting.lua)
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

-- Run a sandboxed chunk with the load budget (lua/muon/sandbox/runs.lua,
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
-- sandbox.HOOK_BUDGET. Sandboxed configs always run with them (and with
-- the nesting limit, sandbox.MAX_NESTING); trusted ones only when they set
-- hook_budget.
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
  local limits = { what = "hook", trusted = trusted or nil } -- (trusted code's own pcall could catch a limit)
  for k, v in pairs(sandbox.HOOK_BUDGET) do limits[k] = v end
  for k, v in pairs(budget) do
    if type(v) ~= "number" or v ~= v or v <= 0 then
      fail(E.EINVAL, "config %s: hook_budget.%s must be a number > 0 (math.huge: no limit), got %s", where, k, E.value(v))
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

------------------------------------------- the config's keys and groups

local function config_fail(fmt, ...) E.raise(E.EINVAL, fmt, ...) end

-- A config's top-level keys, the keys of a group besides its kind's
-- options (they route parameters to it), and the keys of its dist section:
-- { name, doc, check = function(v, name, t) (raises; run when the key is
-- set, or always when required; t: the whole table) }. config.resolve checks them (config.check_keys)
-- in this order; groups, hooks and dist have more checks there.
config.CONFIG_KEYS = {
  { "groups", "a non-empty list of groups, each { name, optimizer, match, ..., options }", required = true,
    check = function(v)
      if type(v) ~= "table" or #v == 0 then config_fail("'groups' must be a non-empty list of groups") end
    end },
  { "schedule", "function(step, group) -> an lr or a table of schedulable values ({}: the config's)",
    check = function(v)
      if type(v) ~= "function" then config_fail("'schedule' must be a function(step, group)") end
    end },
  { "hooks", "hooks for every group whose kind takes hooks (muon.optim.kind.HOOKS)",
    check = function(v)
      if type(v) ~= "table" then config_fail("'hooks' must be a table") end
    end },
  { "dist", "{ mesh, balance, max_batch_numel, check_replicas, split_ns, comm } (the distributed layout: config.DIST_KEYS), or "
    .. "{ independent = true }: under mpirun each rank steps its own model on purpose" },
  { "name", "a label for the config (a string; `muon check` prints it)",
    check = function(v)
      if type(v) ~= "string" then config_fail("'name' must be a string (a label), got %s", type(v)) end
    end },
  { "nil_grad_warning", "steps (default 1; 0: never): a parameter without a grad for its first that many steps "
    .. "gets one warning naming it",
    check = function(v)
      if type(v) ~= "number" or v < 0 or v ~= math.floor(v) then
        config_fail("'nil_grad_warning' must be an integer >= 0 (steps; 0: never warn), got %s", E.value(v))
      end
    end },
  { "hook_budget", "{ instructions, seconds, memory }: the limits of one hook call (config.hook_limits)" },
  { "log", "{ level = 'error' | 'warn' | 'info' | 'debug', every = N, file = path, format = 'csv' | 'jsonl' }: "
    .. "messages at a level (MUON_LOG overrides it) and every N steps a row of eng:stats() (muon.log)" },
}
config.GROUP_KEYS = {
  { "name", "the group's name (messages, get('lr:<name>'), schedules' group.name)" },
  { "optimizer", "the kind (muon.optim.kind.KINDS; default its DEFAULT)" },
  { "match", "Lua pattern(s) or function(s) of (name, shape)" },
  { "exclude", "Lua pattern(s) or function(s) of (name, shape)" },
  { "min_dim", "a parameter's dims >= min_dim" },
  { "max_dim", "a parameter's dims <= max_dim" },
}
config.DIST_KEYS = {
  { "mesh", "{ { axis name, size }, ... }",
    check = function(v)
      local ok, err = pcall(D.mesh, v)
      if not ok then E.raise(E.code(err) or E.EINVAL, "%s", E.message(err)) end
    end },
  { "balance", "'flops' or 'numel': how owners are balanced",
    check = function(v)
      if v ~= "flops" and v ~= "numel" then config_fail("balance must be 'flops' or 'numel', got %s", tostring(v)) end
    end },
  { "max_batch_numel", "elements per Newton-Schulz batch",
    check = function(v)
      if type(v) ~= "number" or v < 1 then config_fail("max_batch_numel must be a number >= 1, got %s", E.value(v)) end
    end },
  { "check_replicas", "'off' (default), 'grads' or 'params': compare a hash of every box over its replicas "
    .. "before the step (gradients) or after it (values); a difference fails on every rank, naming the parameter",
    check = function(v)
      if v ~= "off" and v ~= "grads" and v ~= "params" then
        config_fail("check_replicas must be 'off', 'grads' or 'params', got %s", tostring(v))
      end
    end },
  { "split_ns", "'auto' (default), 'off' or { max_group = n, imbalance = x }: Newton-Schulz of the largest "
    .. "matrices over a group of ranks (muon.dist.plan)",
    check = function(v)
      local ok, err = pcall(D.split_options, v)
      if not ok then E.raise(E.code(err) or E.EINVAL, "%s", E.message(err)) end
    end },
  { "comm", "a muon.comm communicator (default: the world)",
    check = function(v)
      if not commlib.is_comm(v) then config_fail("comm must be a muon.comm communicator") end
    end },
  { "independent", "true: under mpirun every rank steps its own model, on purpose (no mesh: the engine is one "
    .. "process's on each rank); without it, an engine without a mesh refuses to step on a world of several ranks",
    check = function(v, _, d)
      if v ~= true then config_fail("independent must be true (or left out), got %s", E.value(v)) end
      local other = {}
      for k in pairs(d) do if k ~= "independent" then other[#other + 1] = tostring(k) end end
      table.sort(other)
      if #other > 0 then
        config_fail("independent ranks take no other dist key (got %s): a mesh makes the ranks one run",
          table.concat(other, ", "))
      end
    end },
}

-- A list of { name, ... } as a set.
local function key_set(list)
  local s = {}
  for _, e in ipairs(list) do s[e[1]] = true end
  return s
end

-- Check table t against a key list (config.CONFIG_KEYS, DIST_KEYS):
-- unknown keys (E.check_keys: what, where), then each entry's check in
-- order; errors are EINVAL objects "<where>: <message>".
function config.check_keys(t, list, what, where)
  E.check_keys(t, key_set(list), what, where)
  for _, e in ipairs(list) do
    local v = t[e[1]]
    if e.check and (v ~= nil or e.required) then
      local ok, err = pcall(e.check, v, e[1], t)
      if not ok then E.raise(E.code(err) or E.EINVAL, "%s: %s", where, E.message(err)) end
    end
  end
end

local ROUTING_KEYS = key_set(config.GROUP_KEYS)

-- The kinds that take hooks, and their class names ("Muon"): hook options
-- (K.HOOK_KEYS) on another group would silently do nothing, so they are
-- refused by name.
local function hook_kinds()
  local classes = {}
  for _, name in ipairs(kinds.names()) do
    local kind = kinds.get(name)
    if #kind.HOOKS > 0 then classes[#classes + 1] = kind.class end
  end
  return table.concat(classes, ", ")
end

local function as_list(v, what)
  if v == nil then return {} end
  if type(v) == "string" then return { v } end
  if type(v) == "function" then return { v } end
  if type(v) ~= "table" then E.raise(E.EINVAL, "%s must be a pattern, a list of patterns or a function", what) end
  for i, p in ipairs(v) do
    if type(p) ~= "string" and type(p) ~= "function" then
      E.raise(E.EINVAL, "%s[%d] must be a Lua pattern or a function", what, i)
    end
  end
  return v
end

-- A group's match or exclude list (as_list's) whose patterns Lua reads as
-- the config means them: regex syntax and malformed patterns are EINVAL
-- naming the group, the pattern and its Lua spelling (muon.routing).
local function check_patterns(list, what, given)
  for i, m in ipairs(list) do
    local why = type(m) == "string" and Rt.pattern_problem(m)
    if why then
      E.raise(E.EINVAL, "%s%s = %q %s", what, type(given) == "table" and ("[" .. i .. "]") or "", m, why)
    end
  end
  return list
end

local function group_label(gi, name)
  return ("group %d%s"):format(gi, name and (" ('" .. tostring(name) .. "')") or "")
end

-- The dist section: mesh, balance, max_batch_numel, comm (a muon.comm).
local function resolve_dist(dcfg, where)
  if type(dcfg) ~= "table" then E.raise(E.EINVAL, "config %s: 'dist' must be a table { mesh = {...} }", where) end
  config.check_keys(dcfg, config.DIST_KEYS, "dist key", ("config %s: dist"):format(where))
  local d = {}
  for k, v in pairs(dcfg) do d[k] = v end
  return d
end

-- Check the config table and build the groups (option tables of the kinds,
-- torch-like: params, step, options) and their routing rules.
local function resolve_config(cfg, where)
  config.check_keys(cfg, config.CONFIG_KEYS, "top-level key", "config " .. where)
  local hooks = cfg.hooks or {}
  E.check_keys(hooks, K.HOOK_NAMES, "hook", ("config %s: hooks"):format(where))
  for k, v in pairs(hooks) do
    if type(v) ~= "function" then E.raise(E.EINVAL, "config %s: hook '%s' must be a function", where, k) end
  end
  local groups = {}
  local takes_hooks = false
  for _, g in ipairs(cfg.groups) do
    local kind = type(g) == "table" and kinds.get(g.optimizer or kinds.DEFAULT)
    if kind and #kind.HOOKS > 0 then takes_hooks = true end
  end
  if not takes_hooks and next(hooks) ~= nil then
    local names = {}
    for k in pairs(hooks) do names[#names + 1] = k end
    table.sort(names)
    E.raise(E.EINVAL, "config %s: hook(s) %s would never be called: hooks run in %s groups only and the config has none",
      where, table.concat(names, ", "), hook_kinds())
  end
  for gi, g in ipairs(cfg.groups) do
    if type(g) ~= "table" then E.raise(E.EINVAL, "config %s: group %d must be a table", where, gi) end
    local label = group_label(gi, g.name)
    local kname = g.optimizer or kinds.DEFAULT
    local kind = kinds.get(kname)
    if not kind then
      E.raise(E.EINVAL, "config %s: %s: %s", where, label, E.unknown("optimizer", kname, kinds.names()))
    end
    local opts, valid = {}, {}
    for k in pairs(ROUTING_KEYS) do valid[k] = true end
    for k in pairs(kind.OPTIONS) do valid[k] = true end
    local never = {}
    for k in pairs(g) do
      if not valid[k] and K.HOOK_KEYS[k] then never[#never + 1] = tostring(k) end
    end
    table.sort(never)
    if #never > 0 then
      local classes = hook_kinds()
      E.raise(E.EINVAL, "config %s: %s (%s): hook '%s' would never be called: hooks run in %s groups only "
        .. "(move it to a %s group or remove it)", where, label, kname, never[1], classes, classes)
    end
    local bad = O.unknown_keys(g, valid)
    if #bad > 0 then -- (the seed's sentence first, then the suggestions)
      E.raise(E.EINVAL, "config %s: %s: %s", where, label, E.unexpected(kind.class, bad, valid))
    end
    for k, v in pairs(g) do
      if not ROUTING_KEYS[k] then opts[k] = v end
    end
    for k, v in pairs(hooks) do
      if kind.OPTIONS[k] and opts[k] == nil then opts[k] = v end
    end
    for _, k in ipairs({ "min_dim", "max_dim" }) do
      if g[k] ~= nil and (type(g[k]) ~= "number" or g[k] < 0) then
        E.raise(E.EINVAL, "config %s: %s: %s must be a non-negative number", where, label, k)
      end
    end
    local options = O.merge(kind.DEFAULTS, opts)
    local ok, err = pcall(K.validate, kind, options)
    if not ok then E.raise(E.EINVAL, "config %s: %s (%s): %s", where, label, kname, E.message(err)) end
    options.params, options.name, options.step = {}, g.name, 0
    groups[gi] = {
      index = gi, name = g.name, kind = kind, label = label, options = options,
      -- (no match: every name, without a pattern to run on it)
      match = g.match and check_patterns(as_list(g.match, ("config %s: %s.match"):format(where, label)),
        ("config %s: %s: match"):format(where, label), g.match) or nil,
      exclude = check_patterns(as_list(g.exclude, ("config %s: %s.exclude"):format(where, label)),
        ("config %s: %s: exclude"):format(where, label), g.exclude),
      min_dim = g.min_dim, max_dim = g.max_dim,
      base = O.merge(kind.DEFAULTS, opts),
    }
  end
  return groups
end

-- The seed's hsdp_replica_count (a Muon option) is the size of the mesh's
-- replicate axes here (axes named "replicate..."; their product): a group
-- that sets it must agree with dist.mesh, else the message shows the mesh
-- that says the same.
local function check_hsdp(groups, dist, where)
  local mesh = dist and dist.mesh
  local have, names = 1, {}
  for _, ax in ipairs(mesh or {}) do
    if type(ax[1]) == "string" and ax[1]:lower():find("^replicate") then
      have = have * ax[2]
      names[#names + 1] = ax[1]
    end
  end
  for _, g in ipairs(groups) do
    local n = g.kind.replica_count and g.kind.replica_count(g.options.hsdp_replica_count) or 1
    if g.options.hsdp_replica_count ~= nil and n ~= have then
      E.raise(E.EINVAL, "config %s: %s: hsdp_replica_count = %d, but %s: replication comes from the mesh here; "
        .. "the equivalent config has dist = { mesh = { { \"replicate\", %d }, { \"shard\", <ranks / %d> } } } "
        .. "and places parameters { \"R\", \"S(1)\" }", where, g.label, n,
        mesh == nil and "the config has no dist section (one process, no replicas)"
          or ("the mesh's replicate axes (%s) have %d ranks"):format(#names > 0 and table.concat(names, ", ") or "none", have),
        n, n)
    end
  end
end

-- A loaded config's groups and dist section, checked (where: the config
-- as messages name it): groups = list of { index, name, kind, label,
-- options (the kind's option table, torch-like: params, step, options),
-- match, exclude, min_dim, max_dim, base (the options the schedule starts
-- from) }; dist = a copy of the dist section, or nil (none, or
-- independent ranks); independent = true for dist = { independent = true }.
-- trusted: the config ran with full Lua (its log file may be anywhere).
-- Raises EINVAL error objects naming the key or option.
function config.resolve(cfg, where, trusted)
  local groups = resolve_config(cfg, where)
  if cfg.log ~= nil then
    local ok, err = pcall(require("muon.log").check, cfg.log, trusted)
    if not ok then E.raise(E.code(err) or E.EINVAL, "config %s: %s", where, E.message(err)) end
  end
  local dist
  if cfg.dist ~= nil then dist = resolve_dist(cfg.dist, where) end
  local independent = dist ~= nil and dist.independent or nil
  if independent then dist = nil end
  check_hsdp(groups, dist, where)
  return groups, dist, independent
end

return config
