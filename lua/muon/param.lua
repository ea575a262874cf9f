-- muon.param(name, value, grad): a named parameter and its gradient.
--[[ reference muon.param
    A named parameter: its value tensor and its gradient.
muon.param.new(name, value, grad)
    muon.param(name, value, grad) is the same: a parameter { name, value,
    grad }, checked where it is made: name a non-empty string, value a
    contiguous tensor (updated in place), grad nil (skipped by steps) or a
    tensor of the value's dtype and shape that does not share its memory.
muon.param.shape_only(name, value)
    A parameter that only stands for a shape (muon check's zero-stride
    views): never stepped, so not checked.
muon.param.check(name, value, grad)
    The checks of new, raising EINVAL / EDTYPE / ESHAPE naming the
    parameter.
muon.param.check_name(name, who)
    A parameter name as checkpoints store it: a non-empty string of valid
    UTF-8, at most muon.param.MAX_NAME bytes; else EINVAL (who: the call,
    first in the message, which shows its first 60 bytes, those above
    0x7E and control characters as \xNN).
muon.param.MAX_NAME
    The longest name, in bytes: 65536 (MU_MAX_NAME of muon.h).
muon.param.is_param(x)
    Whether x is a parameter.
muon.param.same_shape(a, b)
    Whether tensors a and b have the same sizes.
muon.param.shape_string(t)
    muon.tensor.shape_string, here too: "[256, 128]".
muon.param.Param
    The parameters' metatable (tostring: "param(name, [256, 128])").
Param.name
Param.value
Param.grad
    The fields of a parameter: its name, value tensor and grad tensor (or
    nil).
]]
local ffi = require("ffi")
local T = require("muon.tensor")
local E = require("muon.errors")
local st = require("muon.safetensors")
local C = require("muon.core").C

local Param = {}
Param.__index = Param
Param.__tostring = function(p)
  return ("param(%s, %s)"):format(p.name, T.shape_string(p.value))
end

local function same_shape(a, b)
  if a:dim() ~= b:dim() then return false end
  for d = 1, a:dim() do
    if a:size(d) ~= b:size(d) then return false end
  end
  return true
end

local shape_string = T.shape_string

-- Whether the memory of grad (contiguous) and value overlaps.
local function overlap(grad, value)
  local n = value:numel()
  if n == 0 or not grad:is_contiguous() then return false end
  local es = T.DTYPE_SIZES[value:dtype()]
  local a = tonumber(ffi.cast("uintptr_t", value:ptr()))
  local b = tonumber(ffi.cast("uintptr_t", grad:ptr()))
  return a < b + n * es and b < a + n * es
end

local MAX_NAME = tonumber(C.MU_MAX_NAME)

-- A refused name in a message: its first 60 bytes, control characters and
-- bytes >= 0x80 as \xNN, and its length when cut.
local function shown(name)
  local s = name:sub(1, 60):gsub("[%z\1-\31\127-\255]", function(c) return ("\\x%02X"):format(c:byte()) end)
  return #name > 60 and ("%s...' (%d bytes)"):format(s, #name) or s .. "'"
end

-- (Its contract: the reference block at the top.)
local function check_name(name, who)
  local at = who and (who .. ": ") or ""
  if type(name) ~= "string" or name == "" then
    E.raise(E.EINVAL, "%sparameter name must be a non-empty string, got %s", at,
      type(name) == "string" and "''" or tostring(name))
  end
  if #name > MAX_NAME then
    E.raise(E.EINVAL, "%sparameter name '%s is longer than %d bytes (MU_MAX_NAME)", at, shown(name), MAX_NAME)
  end
  local ok, bad = st.valid_utf8(name)
  if not ok then
    E.raise(E.EINVAL, "%sparameter name '%s is not valid UTF-8 (byte %d is 0x%02X): checkpoints store names as "
      .. "UTF-8 text", at, shown(name), bad, name:byte(bad))
  end
end

-- Check a parameter's tensors where it is registered, so that a mismatch
-- is reported naming the parameter instead of failing in a later step:
-- value a contiguous tensor (the optimizer updates it in place), grad nil
-- or a tensor of the value's dtype and shape that does not share its memory.
local function check(name, value, grad)
  check_name(name)
  if not T.is_tensor(value) then E.raise(E.EINVAL, "parameter '%s': value must be a tensor, got %s", name, type(value)) end
  if not value:is_contiguous() then
    E.raise(E.EINVAL, "parameter '%s': value (shape %s, strides %s) is not contiguous; the optimizer updates it in place, so pass a contiguous tensor",
      name, shape_string(value), shape_string(value:stride()))
  end
  if grad == nil then return end
  if not T.is_tensor(grad) then E.raise(E.EINVAL, "parameter '%s': grad must be a tensor or nil, got %s", name, type(grad)) end
  if grad:dtype() ~= value:dtype() then
    E.raise(E.EDTYPE, "parameter '%s': grad is %s but the value is %s (they must have the same dtype)", name,
      grad:dtype(), value:dtype())
  end
  if not same_shape(grad, value) then
    E.raise(E.ESHAPE, "parameter '%s': grad has shape %s but the value has shape %s", name, shape_string(grad), shape_string(value))
  end
  if overlap(grad, value) then
    E.raise(E.EINVAL, "parameter '%s': grad shares memory with the value (give it its own buffer)", name)
  end
end

local function new(name, value, grad)
  check(name, value, grad)
  return setmetatable({ name = name, value = value, grad = grad }, Param)
end

-- A parameter whose tensors only stand for a shape (`muon check`'s
-- zero-stride views over one element): never stepped, so not checked.
local function shape_only(name, value)
  return setmetatable({ name = name, value = value, stand_in = true }, Param)
end

local M = setmetatable({ new = new, shape_only = shape_only, Param = Param, same_shape = same_shape, check = check,
  check_name = check_name, MAX_NAME = MAX_NAME, shape_string = shape_string }, {
  __call = function(_, ...) return new(...) end,
})

function M.is_param(x) return getmetatable(x) == Param end

return M
