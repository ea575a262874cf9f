-- What the optimizer classes and the engine share: callables and a step's
-- closure. (The per-dtype helpers of the fused calls are in muon.foreach.)
local E = require("muon.errors")

local U = {}

-- A function, or a table or userdata with a __call metamethod.
function U.callable(f)
  if type(f) == "function" then return true end
  local mt = (type(f) == "table" or type(f) == "userdata") and getmetatable(f)
  return type(mt) == "table" and mt.__call ~= nil
end

-- A step's optional closure (torch's): nil, or a callable called first,
-- its value returned; anything else is EINVAL ("step: closure must be ...").
function U.run_closure(closure)
  if closure == nil then return nil end
  if not U.callable(closure) then E.raise(E.EINVAL, "step: closure must be a function or nil, got %s", type(closure)) end
  return (closure())
end

return U
