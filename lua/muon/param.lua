-- muon.param(name, value, grad): a named parameter and its gradient.
local T = require("muon.tensor")

local Param = {}
Param.__index = Param
Param.__tostring = function(p)
  return ("param(%s, %s)"):format(p.name, table.concat(p.value:size(), "x"))
end

local function same_shape(a, b)
  if a:dim() ~= b:dim() then return false end
  for d = 1, a:dim() do
    if a:size(d) ~= b:size(d) then return false end
  end
  return true
end

local function new(name, value, grad)
  if type(name) ~= "string" or name == "" then error("param: name must be a non-empty string", 2) end
  if not T.is_tensor(value) then error(("param '%s': value must be a tensor"):format(name), 2) end
  if grad ~= nil and not T.is_tensor(grad) then
    error(("param '%s': grad must be a tensor or nil"):format(name), 2)
  end
  return setmetatable({ name = name, value = value, grad = grad }, Param)
end

local M = setmetatable({ new = new, Param = Param, same_shape = same_shape }, {
  __call = function(_, ...) return new(...) end,
})

function M.is_param(x) return getmetatable(x) == Param end

function M.shape_string(t)
  return table.concat(t:size(), "x")
end

return M
