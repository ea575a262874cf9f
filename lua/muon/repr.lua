-- What tostring prints for an optimizer, an engine and a param group: the
-- seed's repr, which is torch.optim.Optimizer's:
--
--   Muon (
--   Parameter Group 0
--       lr: 0.02
--       momentum: 0.95
--       ...
--   )
--
-- every option of each group but params, sorted by name, values as Python
-- prints them (True, None, 1e-08, (0.9, 0.999), {'s': 'matrix'}).
local Rp = {}

local function number(v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  if v == math.floor(v) and math.abs(v) < 1e15 then return ("%d"):format(v) end
  for digits = 15, 17 do -- the shortest text that reads back as v (Python's repr)
    local s = ("%." .. digits .. "g"):format(v)
    if tonumber(s) == v then return s end
  end
  return ("%.17g"):format(v)
end

-- A value as Python prints it inside a container (strings quoted) or at
-- the top (top: as str() prints it, strings bare).
function Rp.value(v, top)
  local t = type(v)
  if t == "nil" then return "None" end
  if t == "boolean" then return v and "True" or "False" end
  if t == "number" then return number(v) end
  if t == "string" then return top and v or ("'" .. v .. "'") end
  if t == "function" then return "<function>" end
  if t == "table" and getmetatable(v) == nil then
    local n, count = #v, 0
    for _ in pairs(v) do count = count + 1 end
    local parts = {}
    if count == n and n > 0 then
      for i = 1, n do parts[i] = Rp.value(v[i]) end
      return "(" .. table.concat(parts, ", ") .. (n == 1 and ",)" or ")")
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for i, k in ipairs(keys) do parts[i] = Rp.value(k) .. ": " .. Rp.value(v[k]) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return tostring(v)
end

-- "Parameter Group <i>" and its options (every key but params and the
-- derived "_" ones), four spaces in.
function Rp.group(index, options)
  local keys = {}
  for k in pairs(options) do
    if type(k) == "string" and k ~= "params" and k:sub(1, 1) ~= "_" then keys[#keys + 1] = k end
  end
  table.sort(keys)
  local out = { ("Parameter Group %d"):format(index) }
  for _, k in ipairs(keys) do out[#out + 1] = ("    %s: %s"):format(k, Rp.value(options[k], true)) end
  return table.concat(out, "\n")
end

-- "<name> (<note>\n<group 0>\n<group 1>\n)" for a list of groups'
-- options (note: nil, or text after the parenthesis).
function Rp.optimizer(name, groups, note)
  local out = { name .. " (" .. (note or "") }
  for i, g in ipairs(groups) do out[#out + 1] = Rp.group(i - 1, g) end
  return table.concat(out, "\n") .. "\n)"
end

-- t (a param group handed out as data) made printable: tostring(t) is
-- Rp.group(index, options_of(t)) (options_of default: t itself).
function Rp.printable_group(t, index, options_of)
  return setmetatable(t, { __tostring = function(g) return Rp.group(index, options_of and options_of(g) or g) end })
end

return Rp
