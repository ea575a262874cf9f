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
--   read-only view (muon.readonly: a
--     hook's ctx) -> a view of its
--     fields imported, its checks shared
--   plain table -> deep copy            plain table -> deep copy (metatable dropped)
--   host function -> wrapper            sandbox function -> wrapper
--     (exports args, imports results)     (imports args, exports results)
--   other cdata/userdata -> error       numbers, strings, booleans: as is
--
-- Errors cross too, both ways, wherever a call crosses
-- (lua/muon/sandbox/errors.lua). A tensor proxy is a Lua table with a
-- protected metatable whose methods are the safe subset of muon.tensor's
-- (no :ptr, :save, raw fields); the real tensor lives in a private weak
-- table the sandbox cannot reach. The config file's result is exported
-- before the engine sees it, so every hook, schedule and match function
-- runs behind the membrane, each call a bounded run
-- (lua/muon/sandbox/runs.lua) with the sandbox's string methods while
-- config code runs and the host's while a host function runs
-- (lua/muon/sandbox/strings.lua).
--
-- Error values: what a config raises is turned into a message without
-- running its metamethods (E.message: a string, a number, a raw `msg`
-- field); sandbox-made tables leave the sandbox only as raw copies, so the
-- host never runs a config's __tostring, __index, __concat, __eq. (__gc on
-- tables is not run by LuaJIT in Lua 5.1 mode; the sandbox has no
-- newproxy, ffi or collectgarbage.)
local T = require("muon.tensor")
local E = require("muon.errors")
local B = require("muon.sandbox.budget")
local N = require("muon.sandbox.nesting")
local St = require("muon.sandbox.strings")
local R = require("muon.sandbox.runs")
local SE = require("muon.sandbox.errors")
local C = require("muon.sandbox.costs")
local RO = require("muon.readonly")

local M = {}

local sformat, ssub = string.format, string.sub -- (called as functions: the sandbox's string methods may be on)
local set_strings = St.set_strings
local enter = N.enter

local REAL = setmetatable({}, { __mode = "k" })        -- proxy -> host value
local PROXY = setmetatable({}, { __mode = "kv" })      -- host value -> proxy
local EXPORTED = setmetatable({}, { __mode = "k" })    -- host wrapper -> sandbox function
local IMPORTED = setmetatable({}, { __mode = "k" })    -- sandbox wrapper -> host function
local IMPORT_OF = setmetatable({}, { __mode = "kv" })  -- host function -> sandbox wrapper

local import, export

local function map_all(f, box, n, ...)
  if n == 0 then return end
  local t = { ... }
  for i = 1, n do t[i] = f(t[i], nil, box) end
  return unpack(t, 1, n)
end
local function import_all(...) return map_all(import, nil, select("#", ...), ...) end
-- (box: the sandbox whose functions these are; see R.new_box)
local function export_all(box, ...) return map_all(export, box, select("#", ...), ...) end

-- ------------------------------------------------------------------ calls

local function imported_results(prev, d, host, t0, ok, ...)
  set_strings(prev)
  N.leave(d)
  B.set_host(host)
  B.after_host(t0, C.HOST_RATE)
  if ok then return import_all(...) end
  local err, tb = E.caught((...))
  error(SE.import_error(err, tb), 0)
end

local function exported_results(prev, d, host, prev_box, box, ok, ...)
  set_strings(prev)
  N.leave(d)
  B.set_host(host)
  R.set_box(prev_box)
  if ok then return export_all(box, ...) end
  local caught = ...
  local err, tb = E.caught(caught)
  if R.exhausted(caught) then error(err, 0) end
  error(SE.export_error(err, tb), 0)
end

-- The config calls host function f: arguments exported, results and
-- errors imported; the host's string methods while f runs.
-- (The arguments are converted before the switch: a conversion error
-- must not leave the strings switched.)
local function call_host_args(f, ...)
  local d = enter("a call into muon")
  local prev = set_strings(St.HOST_STRING)
  local host = B.set_host(true)
  local t0 = B.in_budget() and os.clock()
  return imported_results(prev, d, host, t0, xpcall(f, R.capture, ...))
end
local function call_host(f, ...)
  return call_host_args(f, export_all(R.current_box(), ...))
end
M.call_host = call_host

local function spent() B.raise_spent() end

-- The host calls config function f (of the sandbox `box`): arguments
-- imported, results and errors exported; the sandbox's string methods
-- while f runs.
local function call_config_args(f, box, ...)
  local d = enter("a call into the config")
  local prev = set_strings(St.SAFE_STRING)
  local host, prev_box = B.set_host(false), R.set_box(box)
  if B.spent() then f = spent end -- (the run's limit was exceeded in a host call)
  return exported_results(prev, d, host, prev_box, box, xpcall(f, R.capture, ...))
end
local function call_config_now(f, box, ...)
  return call_config_args(f, box, import_all(...))
end
-- (a call from the host outside any bounded run, at step time: one run
-- under the box's limits)
local function call_config(f, box, ...)
  if B.unbounded() then return call_config_now(f, box, ...) end
  return R.call_bounded(R.limits_of(box), call_config_now, f, box, ...)
end

local DEFAULT_BOX = R.new_box()

-- ------------------------------------------------------------ tensor proxy

-- Methods a sandboxed config may call on a tensor (all bounds-checked).
-- The maths (add, mul_, where, sum, matmul, ...: T.math_names) check every
-- argument's type in Lua before any FFI call.
local SAFE_METHODS = { "size", "stride", "numel", "dim", "dtype", "is_contiguous", "shares_storage", "view",
  "reshape", "transpose", "narrow", "select", "squeeze", "unsqueeze", "contiguous", "clone", "to", "copy",
  "fill", "zero", "fill_", "zero_", "copy_", "all_finite", "get", "set", "totable", "flat" }
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
local TENSOR_ARG = { copy = true, copy_ = true, shares_storage = true }
-- Methods charged a matmul's estimate first.
local MATMULS = { matmul = true, mm = true, bmm = true }
M.MATMULS = MATMULS

local tensor_methods = {}
for _, name in ipairs(SAFE_METHODS) do
  local m = T.methods[name]
  tensor_methods[name] = function(self, ...)
    local real = REAL[self]
    if real == nil or not T.is_tensor(real) then
      E.blame(E.EINVAL, "tensor:%s called on %s, not a tensor", name, type(self))
    end
    if TENSOR_ARG[name] then
      local other = REAL[(...)]
      if other == nil or not T.is_tensor(other) then E.blame(E.EINVAL, "tensor:%s: argument is not a tensor", name) end
    end
    if MATMULS[name] then B.charge_host(C.matmul_cost(real, REAL[(...)])) end
    return call_host(m, real, ...)
  end
end

local tensor_mt = {
  __metatable = "muon.tensor (sandboxed)",
  __index = function(_, k)
    local m = tensor_methods[k]
    if m then return m end
    if BLOCKED_MEMBERS[k] then SE.blocked_error(BLOCKED_MEMBERS[k]) end
    if T.methods[k] then SE.blocked_error("tensor:" .. tostring(k)) end -- (an unknown name raises there)
  end,
  __newindex = function(_, k)
    E.blame(E.EINVAL, "cannot set field '%s' of a tensor in a sandboxed config", tostring(k))
  end,
  __tostring = function(self) return tostring(REAL[self]) end,
  __eq = function(a, b) return REAL[a] == REAL[b] end,
}
-- Operators: the real tensors' own (the FFI metatype's __add, ...), on the
-- exported operands; a plain table or a config's own cdata is rejected there.
-- (Through call_host: the host's string methods and the time charge.)
local function add(a, b) return a + b end
local function sub(a, b) return a - b end
local function mul(a, b) return a * b end
local function div(a, b) return a / b end
local function unm(a) return -a end
local function pow(a, b) return a ^ b end
tensor_mt.__add = function(a, b) return call_host(add, a, b) end
tensor_mt.__sub = function(a, b) return call_host(sub, a, b) end
tensor_mt.__mul = function(a, b) return call_host(mul, a, b) end
tensor_mt.__div = function(a, b) return call_host(div, a, b) end
tensor_mt.__unm = function(a) return call_host(unm, a) end
tensor_mt.__pow = function(a, b) return call_host(pow, a, b) end

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
    local real = REAL[self]
    local v = real[k]
    if type(k) == "string" and (ssub(k, 1, 1) == "_" or (type(v) == "function" and not OBJECT_METHODS[k])) then
      SE.blocked_error(sformat("object member '%s' %s", k, OBJECT_BLOCKED[k] or "(internal)"))
    end
    local cost = k == "step" and C.STEP_COST[real]
    if cost then
      local step = import(v)
      return function(...)
        B.charge_host(cost)
        return step(...)
      end
    end
    return import(v)
  end,
  __newindex = function(_, k)
    E.blame(E.EINVAL, "cannot set field '%s' of a host object in a sandboxed config", tostring(k))
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

local function copy_table(t, f, seen, box)
  local c = seen[t]
  if c then return c end
  c = {}
  seen[t] = c
  for k, v in pairs(t) do
    c[f(k, seen, box)] = f(v, seen, box)
  end
  return c
end

function import(v, seen)
  local tv = type(v)
  if tv == "nil" or tv == "number" or tv == "string" or tv == "boolean" then return v end
  if tv == "cdata" then
    if T.is_tensor(v) then return proxy_of(v, tensor_mt) end
    E.raise(E.EINVAL, SE.blocked_message("passing an FFI value (" .. tostring(v) .. ") into the config"))
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
    if RO.is_view(v) then return RO.import(v, function(x) return import(x, seen) end) end
    if getmetatable(v) ~= nil then return proxy_of(v, object_mt) end
    return copy_table(v, import, seen or {})
  end
  E.raise(E.EINVAL, SE.blocked_message("passing a " .. tv .. " into the config"))
end

-- (box: the sandbox v comes from; its functions get wrappers that call
-- them under its limits)
function export(v, seen, box)
  local tv = type(v)
  if tv == "nil" or tv == "number" or tv == "string" or tv == "boolean" then return v end
  if tv == "table" then
    local real = REAL[v]
    if real ~= nil then return real end
    return copy_table(v, export, seen or {}, box)
  end
  if tv == "function" then
    local orig = IMPORTED[v]
    if orig then return orig end -- a host function going back
    box = box or DEFAULT_BOX
    local w = box.exported[v]
    if w == nil then
      w = function(...) return call_config(v, box, ...) end
      EXPORTED[w] = v
      box.exported[v] = w
    end
    return w
  end
  if tv == "cdata" then return v end -- value cdata made by the config itself (1LL): no pointers reach it
  E.raise(E.EINVAL, "a sandboxed config returned a %s, which cannot leave the sandbox", tv)
end

M.import = import
-- v (a value of the sandbox `box`, R.new_box; default: the default hook
-- budget's limits) as the host sees it.
function M.export(v, box) return export(v, nil, box) end

function M.is_proxy(v) return REAL[v] ~= nil end

-- The host value behind a proxy, or nil.
function M.real(v) return REAL[v] end

return M
