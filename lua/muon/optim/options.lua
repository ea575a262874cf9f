-- Option checking shared by the optimizers: defaults, unknown keys, types.
local P = require("muon.param")
local E = require("muon.errors")

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

-- Keys a param group may hold besides the optimizer's options.
local GROUP_KEYS = { params = true, name = true, step = true }

-- Validate the constructor arguments of an optimizer and build its groups,
-- following torch: params is a list of muon.param, or a list of groups
-- { params = {...}, <option overrides> }. spec = { what = "Muon", defaults,
-- allowed, resolve = function(group, level), check_param = function(p, where, level),
-- first = the number of the first group in messages (1) }.
-- Returns the resolved defaults and the list of groups.
function O.build_groups(spec, params, opts, level)
  opts = opts or {}
  if type(opts) ~= "table" then error(spec.what .. ": options must be a table", level + 1) end
  local unknown = O.unknown_keys(opts, spec.allowed)
  if #unknown > 0 then
    error(spec.what .. ": " .. E.unknown("option", unknown, spec.allowed), level + 1)
  end
  if type(params) ~= "table" then error(spec.what .. ": params must be a table", level + 1) end
  local defaults = O.merge(spec.defaults, opts)
  spec.resolve(defaults, level + 1)
  local list = params
  if #params == 0 or P.is_param(params[1]) then list = { { params = params } } end
  local groups, seen = {}, {}
  for gi, g in ipairs(list) do
    local where = ("%s param group %d"):format(spec.what, gi + (spec.first or 1) - 1)
    if type(g) ~= "table" or type(g.params) ~= "table" then
      error(where .. " must be a table with a params list", level + 1)
    end
    local bad, valid = {}, {}
    for k in pairs(g) do
      if not GROUP_KEYS[k] and not spec.allowed[k] then bad[#bad + 1] = tostring(k) end
    end
    table.sort(bad)
    if #bad > 0 then
      for k in pairs(GROUP_KEYS) do valid[k] = true end
      for k in pairs(spec.allowed) do valid[k] = true end
      error(where .. ": " .. E.unknown("key", bad, valid), level + 1)
    end
    for i, p in ipairs(g.params) do
      if not P.is_param(p) then
        error(("%s: params[%d] is not a muon.param (use muon.param(name, value, grad))"):format(where, i), level + 1)
      end
      local ok, err = pcall(P.check, p.name, p.value, p.grad)
      if not ok then error(E.wrap(err, where .. ": ", E.EINVAL), 0) end
      if seen[p.name] then
        E.raise(E.EINVAL, "%s: parameter '%s' appears twice (%s)", where, p.name,
          seen[p.name] == p and "the same muon.param" or "two parameters with one name")
      end
      seen[p.name] = p
      if spec.check_param then spec.check_param(p, level + 1) end
    end
    local group = O.merge(defaults, g)
    spec.resolve(group, level + 1)
    group.step = g.step or 0
    groups[gi] = group
  end
  return defaults, groups
end

return O
