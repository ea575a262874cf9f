-- Option checking shared by the optimizers: defaults, unknown keys, types.
local O = {}

-- Sorted list of the keys of t missing from allowed.
function O.unknown_keys(t, allowed)
  local bad = {}
  for k in pairs(t) do
    if allowed[k] == nil then bad[#bad + 1] = tostring(k) end
  end
  table.sort(bad)
  return bad
end

-- Copy defaults, then overrides (already checked for unknown keys).
function O.merge(defaults, overrides)
  local r = {}
  for k, v in pairs(defaults) do r[k] = v end
  for k, v in pairs(overrides or {}) do r[k] = v end
  return r
end

local function is_finite(x)
  return type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge
end
O.is_finite = is_finite

function O.number(name, v, min, level)
  if not is_finite(v) then
    error(("%s must be a finite number, got %s"):format(name, tostring(v)), level + 1)
  end
  if min and v < min then
    error(("%s must be >= %s, got %s"):format(name, tostring(min), tostring(v)), level + 1)
  end
end

function O.boolean(name, v, level)
  if type(v) ~= "boolean" then
    error(("%s must be a boolean, got %s"):format(name, tostring(v)), level + 1)
  end
end

function O.integer(name, v, min, level)
  if type(v) ~= "number" or v ~= math.floor(v) or v < min then
    error(("%s must be an integer >= %d, got %s"):format(name, min, tostring(v)), level + 1)
  end
end

function O.fn(name, v, level)
  if v ~= nil and type(v) ~= "function" and not (type(v) == "table" and getmetatable(v) and getmetatable(v).__call) then
    error(("%s must be a function or nil, got %s"):format(name, type(v)), level + 1)
  end
end

function O.oneof(name, v, choices, level)
  for _, c in ipairs(choices) do
    if v == c then return end
  end
  local quoted = {}
  for i, c in ipairs(choices) do quoted[i] = "'" .. c .. "'" end
  error(("%s must be %s, got %s"):format(name, table.concat(quoted, " or "),
    type(v) == "string" and ("'" .. v .. "'") or tostring(v)), level + 1)
end

return O
