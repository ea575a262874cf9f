-- The muon modules a sandboxed config may require, as facades behind the
-- membrane (lua/muon/sandbox/membrane.lua): imported copies of the safe
-- functions and values of each, everything else blocked by name, the host
-- work of the big calls charged at load time (lua/muon/sandbox/costs.lua).
local T = require("muon.tensor")
local E = require("muon.errors")
local B = require("muon.sandbox.budget")
local M = require("muon.sandbox.membrane")
local SE = require("muon.sandbox.errors")
local C = require("muon.sandbox.costs")

local F = {}

local sformat = string.format -- (called as a function: the sandbox's string methods may be on)
local import, real_of, call_host = M.import, M.real, M.call_host

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
      if blocked_names[k] then SE.blocked_error(blocked_prefix .. tostring(k) .. " " .. blocked_names[k]) end
      return nil
    end,
  })
end

-- The modules a sandboxed config may require, built lazily per sandbox so
-- that one config cannot change what another sees.
local BUILDERS = {}

BUILDERS["muon.tensor"] = function()
  local names = {}
  for _, list in ipairs({ T.function_names, T.math_names }) do
    for _, name in ipairs(list) do names[#names + 1] = name end
  end
  local Tf = pick(T, names)
  Tf.is_tensor = function(x) return real_of(x) ~= nil and T.is_tensor(real_of(x)) end
  for name in pairs(M.MATMULS) do
    local f = Tf[name]
    Tf[name] = function(a, b, ...)
      B.charge_host(C.matmul_cost(real_of(a), real_of(b)))
      return f(a, b, ...)
    end
  end
  return facade_of(Tf, "muon.tensor.", { wrap = "(wraps a raw pointer)", load = "(file read)",
    adopt = "(raw FFI handle)", methods = "(the shared FFI method table)" })
end

BUILDERS["muon.ns"] = function()
  local ns = require("muon.ns")
  local f = pick(ns, { "zeropower", "coefficients", "validate", "VARIANTS", "DEFAULT_STEPS",
    "DEFAULT_VARIANT", "DEFAULT_EPS" })
  local zp = f.zeropower
  f.zeropower = function(x, opts)
    if type(opts) == "table" and opts.workspace ~= nil then SE.blocked_error("muon.ns.zeropower's workspace option") end
    B.charge_host(C.ns_cost(real_of(x), opts))
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
  return pick(require("muon.schedules"), { "warmup_cosine", "warmup_constant", "wsd" })
end

BUILDERS["muon.param"] = function()
  local P = require("muon.param")
  local f = { new = import(P.new), is_param = function(x) return P.is_param(real_of(x)) end,
    shape_string = import(P.shape_string), same_shape = import(P.same_shape) }
  return setmetatable(f, { __metatable = "muon module (sandboxed)",
    __call = function(_, ...) return f.new(...) end })
end

local function optim_facade(name, mod)
  local function new(params, opts)
    local o = call_host(mod.new, params, opts)
    local real = real_of(o)
    if real ~= nil then
      local ok, cost = pcall(C.step_cost, M.export(params), type(opts) == "table" and M.export(opts) or nil)
      C.STEP_COST[real] = ok and cost or nil
    end
    return o
  end
  local f = { new = new,
    DEFAULTS = import(mod.DEFAULTS), OPTIONS = import(mod.OPTIONS) }
  return setmetatable(f, { __metatable = "muon." .. name .. " (sandboxed)",
    __call = function(_, ...) return f.new(...) end })
end

-- Every optimizer kind (the list: muon.optim.kind) as its module and as
-- muon.optim.<class>.
local KINDS = require("muon.optim.kind").KINDS
for _, k in ipairs(KINDS) do
  BUILDERS[k.module] = function() return optim_facade(k.module:sub(6), require(k.module)) end
end
BUILDERS["muon.optim.options"] = function() return pick(require("muon.optim.options"), { "is_finite" }) end

BUILDERS["muon.optim"] = function(get)
  local f = {}
  for _, k in ipairs(KINDS) do f[k.class] = get(k.module) end
  return f
end

BUILDERS["muon"] = function(get)
  local muon = require("muon")
  local f = { _VERSION = muon._VERSION, tensor = get("muon.tensor"), ns = get("muon.ns"),
    param = get("muon.param"), optim = get("muon.optim"), foreach = get("muon.foreach"),
    blas_info = import(muon.blas_info), world = import(muon.world), clock = import(muon.clock) }
  return facade_of(f, "muon.", { core = "(raw FFI library)", safetensors = "(file reads and writes)",
    comm = "(MPI communicators)", host = "(script host)", config = "(config loader)",
    engine = "(engine; open engines from the host program)", dist = "(distributed planner)",
    check = "(muon check)", checkpoint = "(checkpoint files)", plot = "(writes files)" })
end

function F.new_require(path)
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
    E.blame(E.EINVAL, sformat("config '%s': require('%s') is blocked in sandboxed configs (allowed: muon, muon.tensor, "
      .. "muon.ns, muon.param, muon.optim, muon.foreach, muon.schedules); to allow it load the config with %s",
      path, tostring(name), SE.HOW_TO_ALLOW))
  end
  return req
end

return F
