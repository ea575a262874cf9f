-- The membrane between a sandboxed config and the host (lua/muon/config.lua).
--
-- Tensors are FFI cdata (mu_tensor*): whoever holds one can read its raw
-- fields (t.data, t.dims[i] without bounds checks) and write them, which is
-- arbitrary memory access. So a sandboxed config never holds a tensor, a
-- pointer or a host object: every value crossing into the sandbox is
-- "imported" and every value coming out is "exported":
--
--   host -> sandbox (import)           sandbox -> host (export)
--   tensor cdata -> tensor proxy        tensor proxy -> the same cdata
--   object (table with a metatable,     object proxy -> the object
--     e.g. muon.param, an optimizer)
--     -> read-only object proxy
--   plain table -> deep copy            plain table -> deep copy (metatable dropped)
--   host function -> wrapper            sandbox function -> wrapper
--     (exports args, imports results)     (imports args, exports results)
--   other cdata/userdata -> error       numbers, strings, booleans: as is
--
-- Errors cross too, both ways, wherever a call crosses (see "errors"
-- below): strings stay strings; a muon error object (lua/muon/errors.lua)
-- keeps its code and message; anything else a config raises (a table, a
-- proxy, nil...) reaches the host as an MU_ELUA error object with its `msg`
-- field or "(error object is a <type> value)", never as the config's own
-- value with the config's metamethods.
--
-- A tensor proxy is a Lua table with a protected metatable whose methods are
-- the safe subset of muon.tensor's (no :ptr, :save, raw fields); the real
-- tensor lives in a private weak table the sandbox cannot reach. The config
-- file's result is exported before the engine sees it, so every hook,
-- schedule and match function runs behind the membrane.
local T = require("muon.tensor")
local E = require("muon.errors")

local S = {}

S.HOW_TO_ALLOW = "trusted = true (muon run --trust SCRIPT / muon check --trust CONFIG, "
  .. "engine.new(path, { trusted = true }) in Lua, or mu_engine_opts.trusted = 1 with mu_engine_open_ex in C)"

function S.blocked_error(what, level)
  error(("%s is blocked in sandboxed configs; to allow it load the config with %s"):format(what, S.HOW_TO_ALLOW),
    (level or 1) + 1)
end

local REAL = setmetatable({}, { __mode = "k" })        -- proxy -> host value
local PROXY = setmetatable({}, { __mode = "kv" })      -- host value -> proxy
local EXPORTED = setmetatable({}, { __mode = "k" })    -- host wrapper -> sandbox function
local IMPORTED = setmetatable({}, { __mode = "k" })    -- sandbox wrapper -> host function
local EXPORT_OF = setmetatable({}, { __mode = "kv" })  -- sandbox function -> host wrapper
local IMPORT_OF = setmetatable({}, { __mode = "kv" })  -- host function -> sandbox wrapper

local import, export

local function map_all(f, n, ...)
  if n == 0 then return end
  local t = { ... }
  for i = 1, n do t[i] = f(t[i]) end
  return unpack(t, 1, n)
end
local function import_all(...) return map_all(import, select("#", ...), ...) end
local function export_all(...) return map_all(export, select("#", ...), ...) end

-- ------------------------------------------------------------------ errors

-- Calls across the membrane run under xpcall with E.capture, which keeps
-- the traceback of the first raise (on error objects, and on the side for
-- strings), so that what the C embedding shows still reaches down to the
-- config's lines.
local function with_tb(obj, tb)
  if rawget(obj, "tb") == nil then obj.tb = tb end
  return obj
end

-- Host error objects handed to the config (as copies: the config may
-- change a copy's fields) -> the original, given back when the copy leaves.
local ORIGINAL = setmetatable({}, { __mode = "k" })

-- A host function raised err inside a call from the config: a string as it
-- is; a muon error object as a copy (code and message; its metatable is
-- protected, so the config cannot reach or change it); another host value,
-- which might hold host objects, as its message (with its code if it names
-- one).
local function import_error(err, tb)
  if type(err) == "string" then return err end
  local obj = E.is(err) and err or E.wrap(err)
  if not E.is(obj) then return obj end -- a message
  with_tb(obj, tb)
  local copy = E.new(obj.code, obj.msg)
  ORIGINAL[copy] = obj
  return copy
end

-- The config raised err, or let a host error through: strings and numbers
-- as they are; a host error object as the original (code, message and
-- traceback as the host raised them, whatever the config did to its copy);
-- anything else becomes an MU_ELUA object with the value's `msg` field or
-- "(error object is a <type> value)": the config cannot choose the status
-- code, and the host never calls the config's metamethods.
local function export_error(err, tb)
  local t = type(err)
  if t == "string" or t == "number" then return err end
  local orig = t == "table" and ORIGINAL[err]
  if orig then return orig end
  return E.new(E.ELUA, E.message(err), tb)
end

local function imported_results(ok, ...)
  if ok then return import_all(...) end
  local caught = ...
  error(import_error(caught[1], caught[2]), 0)
end

local function exported_results(ok, ...)
  if ok then return export_all(...) end
  local caught = ...
  error(export_error(caught[1], caught[2]), 0)
end

-- The config calls host function f: arguments exported, results and
-- errors imported.
local function call_host(f, ...)
  return imported_results(xpcall(f, E.capture, export_all(...)))
end

-- The host calls config function f: arguments imported, results and errors
-- exported.
local function call_config(f, ...)
  return exported_results(xpcall(f, E.capture, import_all(...)))
end

-- ------------------------------------------------------------ tensor proxy

-- Methods a sandboxed config may call on a tensor (all bounds-checked).
-- The maths (add, mul_, where, sum, matmul, ...: T.math_names) check every
-- argument's type in Lua before any FFI call.
local SAFE_METHODS = { "size", "stride", "numel", "dim", "dtype", "is_contiguous", "shares_storage", "view",
  "reshape", "transpose", "narrow", "select", "squeeze", "unsqueeze", "contiguous", "clone", "to", "copy",
  "fill", "zero", "all_finite", "get", "set", "totable", "flat" }
for _, name in ipairs(T.math_names) do SAFE_METHODS[#SAFE_METHODS + 1] = name end
-- Members that exist on real tensors but not behind the membrane.
local BLOCKED_MEMBERS = {
  ptr = "tensor:ptr() (raw FFI pointer)", save = "tensor:save() (file write)",
  data = "tensor.data (raw FFI field)", storage = "tensor.storage (raw FFI field)",
  offset = "tensor.offset (raw FFI field)", scalar = "tensor.scalar (raw FFI field; use :dtype())",
  ndim = "tensor.ndim (raw FFI field; use :dim())", dims = "tensor.dims (raw FFI field; use :size())",
  strides = "tensor.strides (raw FFI field; use :stride())",
}

-- Methods whose first argument must be a tensor (checked here: an FFI call
-- would turn a plain table into a temporary struct).
local TENSOR_ARG = { copy = true, shares_storage = true }

local tensor_methods = {}
for _, name in ipairs(SAFE_METHODS) do
  local m = T.methods[name]
  tensor_methods[name] = function(self, ...)
    local real = REAL[self]
    if real == nil or not T.is_tensor(real) then
      error(("tensor:%s called on %s, not a tensor"):format(name, type(self)), 2)
    end
    if TENSOR_ARG[name] then
      local other = REAL[(...)]
      if other == nil or not T.is_tensor(other) then error(("tensor:%s: argument is not a tensor"):format(name), 2) end
    end
    return call_host(m, real, ...)
  end
end

local tensor_mt = {
  __metatable = "muon.tensor (sandboxed)",
  __index = function(_, k)
    local m = tensor_methods[k]
    if m then return m end
    if BLOCKED_MEMBERS[k] then S.blocked_error(BLOCKED_MEMBERS[k], 2) end
    return nil
  end,
  __newindex = function(_, k)
    error(("cannot set field '%s' of a tensor in a sandboxed config"):format(tostring(k)), 2)
  end,
  __tostring = function(self) return tostring(REAL[self]) end,
  __eq = function(a, b) return REAL[a] == REAL[b] end,
}
-- Operators: the real tensors' own (the FFI metatype's __add, ...), on the
-- exported operands; a plain table or a config's own cdata is rejected there.
tensor_mt.__add = function(a, b) return import(export(a) + export(b)) end
tensor_mt.__sub = function(a, b) return import(export(a) - export(b)) end
tensor_mt.__mul = function(a, b) return import(export(a) * export(b)) end
tensor_mt.__div = function(a, b) return import(export(a) / export(b)) end
tensor_mt.__unm = function(a) return import(-export(a)) end

-- ------------------------------------------------------------ object proxy

-- Methods of host objects (optimizers made by the config) a config may
-- call; everything else that is a function, and every "_" member, is
-- blocked (opt:save/opt:load write and read files; the internal phases
-- take forged plans).
local OBJECT_METHODS = { step = true, params = true, state_dict = true, load_state_dict = true }
local OBJECT_BLOCKED = { save = "(file write)", load = "(file read)" }

local object_mt = {
  __metatable = "muon object (sandboxed)",
  __index = function(self, k)
    local v = REAL[self][k]
    if type(k) == "string" and (k:sub(1, 1) == "_" or (type(v) == "function" and not OBJECT_METHODS[k])) then
      S.blocked_error(("object member '%s' %s"):format(k, OBJECT_BLOCKED[k] or "(internal)"), 2)
    end
    return import(v)
  end,
  __newindex = function(_, k)
    error(("cannot set field '%s' of a host object in a sandboxed config"):format(tostring(k)), 2)
  end,
  __call = function(self, ...) return call_host(REAL[self], ...) end,
  __tostring = function(self) return tostring(REAL[self]) end,
  __len = function(self) return #REAL[self] end,
}

local function proxy_of(v, mt)
  local p = PROXY[v]
  if p == nil then
    p = setmetatable({}, mt)
    REAL[p] = v
    PROXY[v] = p
  end
  return p
end

local function copy_table(t, f, seen)
  local c = seen[t]
  if c then return c end
  c = {}
  seen[t] = c
  for k, v in pairs(t) do
    c[f(k, seen)] = f(v, seen)
  end
  return c
end

function import(v, seen)
  local tv = type(v)
  if tv == "nil" or tv == "number" or tv == "string" or tv == "boolean" then return v end
  if tv == "cdata" then
    if T.is_tensor(v) then return proxy_of(v, tensor_mt) end
    S.blocked_error("passing an FFI value (" .. tostring(v) .. ") into the config", 3)
  end
  if tv == "function" then
    local orig = EXPORTED[v]
    if orig then return orig end -- a sandbox function coming back
    local w = IMPORT_OF[v]
    if w == nil then
      w = function(...) return call_host(v, ...) end
      IMPORTED[w] = v
      IMPORT_OF[v] = w
    end
    return w
  end
  if tv == "table" then
    if REAL[v] ~= nil then return v end -- already a proxy
    if getmetatable(v) ~= nil then return proxy_of(v, object_mt) end
    return copy_table(v, import, seen or {})
  end
  S.blocked_error("passing a " .. tv .. " into the config", 3)
end

function export(v, seen)
  local tv = type(v)
  if tv == "nil" or tv == "number" or tv == "string" or tv == "boolean" then return v end
  if tv == "table" then
    local real = REAL[v]
    if real ~= nil then return real end
    return copy_table(v, export, seen or {})
  end
  if tv == "function" then
    local orig = IMPORTED[v]
    if orig then return orig end -- a host function going back
    local w = EXPORT_OF[v]
    if w == nil then
      w = function(...) return call_config(v, ...) end
      EXPORTED[w] = v
      EXPORT_OF[v] = w
    end
    return w
  end
  if tv == "cdata" then return v end -- value cdata made by the config itself (1LL): no pointers reach it
  error(("a sandboxed config returned a %s, which cannot leave the sandbox"):format(tv), 3)
end

S.import, S.export = import, export

function S.is_proxy(v) return REAL[v] ~= nil end

-- ------------------------------------------------------------------ facade

-- Imported copies of the listed fields of a host module.
local function pick(mod, names)
  local t = {}
  for _, k in ipairs(names) do t[k] = import(mod[k]) end
  return t
end

local function facade_of(fields, blocked_prefix, blocked_names)
  return setmetatable(fields, {
    __metatable = "muon module (sandboxed)",
    __index = function(_, k)
      if blocked_names[k] then S.blocked_error(blocked_prefix .. tostring(k) .. " " .. blocked_names[k], 2) end
      return nil
    end,
  })
end

-- The modules a sandboxed config may require, built lazily per sandbox so
-- that one config cannot change what another sees.
local BUILDERS = {}

BUILDERS["muon.tensor"] = function()
  local names = { "zeros", "from", "randn" }
  for _, name in ipairs(T.math_names) do names[#names + 1] = name end
  local Tf = pick(T, names)
  Tf.is_tensor = function(x) return REAL[x] ~= nil and T.is_tensor(REAL[x]) end
  return facade_of(Tf, "muon.tensor.", { wrap = "(wraps a raw pointer)", load = "(file read)",
    adopt = "(raw FFI handle)", methods = "(the shared FFI method table)" })
end

BUILDERS["muon.ns"] = function()
  local ns = require("muon.ns")
  local f = pick(ns, { "zeropower", "coefficients", "validate", "VARIANTS", "DEFAULT_STEPS",
    "DEFAULT_VARIANT", "DEFAULT_EPS" })
  local zp = f.zeropower
  f.zeropower = function(x, opts)
    if type(opts) == "table" and opts.workspace ~= nil then S.blocked_error("muon.ns.zeropower's workspace option", 2) end
    return zp(x, opts)
  end
  return facade_of(f, "muon.ns.", { workspace = "(raw workspace handle)",
    zeropower_into = "(takes raw workspace handles)", resolve = "(returns raw FFI options)" })
end

BUILDERS["muon.foreach"] = function()
  return facade_of(pick(require("muon.foreach"), { "momentum", "apply", "scale", "adamw", "all_finite",
    "pack", "unpack", "numel" }), "muon.foreach.", {})
end

-- Pure functions of numbers: safe to hand out as they are.
BUILDERS["muon.schedules"] = function()
  return pick(require("muon.schedules"), { "warmup_cosine", "warmup_constant" })
end

BUILDERS["muon.param"] = function()
  local P = require("muon.param")
  local f = { new = import(P.new), is_param = function(x) return P.is_param(REAL[x]) end,
    shape_string = import(P.shape_string), same_shape = import(P.same_shape) }
  return setmetatable(f, { __metatable = "muon module (sandboxed)",
    __call = function(_, ...) return f.new(...) end })
end

local function optim_facade(name, mod)
  local f = { new = function(params, opts) return call_host(mod.new, params, opts, 2) end,
    DEFAULTS = import(mod.DEFAULTS), OPTIONS = import(mod.OPTIONS) }
  return setmetatable(f, { __metatable = "muon." .. name .. " (sandboxed)",
    __call = function(_, ...) return f.new(...) end })
end

BUILDERS["muon.optim.muon"] = function() return optim_facade("optim.muon", require("muon.optim.muon")) end
BUILDERS["muon.optim.adamw"] = function() return optim_facade("optim.adamw", require("muon.optim.adamw")) end
BUILDERS["muon.optim.options"] = function() return pick(require("muon.optim.options"), { "is_finite" }) end

BUILDERS["muon.optim"] = function(get)
  return { Muon = get("muon.optim.muon"), AdamW = get("muon.optim.adamw") }
end

BUILDERS["muon"] = function(get)
  local muon = require("muon")
  local f = { _VERSION = muon._VERSION, tensor = get("muon.tensor"), ns = get("muon.ns"),
    param = get("muon.param"), optim = get("muon.optim"), foreach = get("muon.foreach"),
    blas_info = import(muon.blas_info) }
  return facade_of(f, "muon.", { core = "(raw FFI library)", safetensors = "(file reads and writes)",
    comm = "(MPI communicators)", host = "(script host)", config = "(config loader)",
    engine = "(engine; open engines from the host program)", dist = "(distributed planner)",
    check = "(muon check)", optim_state = "(checkpoint files)" })
end

function S.new_require(path)
  local loaded = {}
  local req
  local function get(name)
    local m = loaded[name]
    if m == nil then
      m = BUILDERS[name](get)
      loaded[name] = m
    end
    return m
  end
  req = function(name)
    if type(name) == "string" and BUILDERS[name] then return get(name) end
    error(("config '%s': require('%s') is blocked in sandboxed configs (allowed: muon, muon.tensor, muon.ns, "
      .. "muon.param, muon.optim, muon.foreach, muon.schedules); to allow it load the config with %s")
      :format(path, tostring(name), S.HOW_TO_ALLOW), 2)
  end
  return req
end

return S
