-- The optimizer kinds, loaded: every kind of muon.optim.kind's list
-- (K.KINDS), each from its own file (which registers it, K.register), in
-- checkpoint order. The engine, `muon check` and checkpoints' callers look
-- kinds up here; muon.optim.kind itself loads none.
--
--   local kinds = require("muon.optim.kinds")
--   kinds.names()      --> { "muon", "adamw", "lion" }
--   kinds.get("adamw") --> the AdamW kind (nil for a name not in the list)
--   kinds.module(name) --> its module (muon.optim.<name>: new, the class, kind, DEFAULTS, OPTIONS)
--   kinds.DEFAULT      --> the kind of a config group without `optimizer`
local K = require("muon.optim.kind")

local kinds = { DEFAULT = K.DEFAULT }

local MODULES, NAMES = {}, {}
for i, e in ipairs(K.KINDS) do
  local mod = require(e.module)
  if mod.kind ~= nil and mod.kind.name ~= e.name then
    error(("%s registers kind '%s', muon.optim.kind's list says '%s'"):format(e.module, tostring(mod.kind.name), e.name))
  end
  MODULES[e.name], NAMES[i] = mod, e.name
end

function kinds.names()
  local list = {}
  for i, n in ipairs(NAMES) do list[i] = n end
  return list
end

function kinds.get(name)
  local mod = MODULES[name]
  return mod and mod.kind or nil
end

function kinds.module(name) return MODULES[name] end

return kinds
