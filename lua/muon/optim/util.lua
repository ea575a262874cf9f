-- What the kinds and the step protocol share: per-dtype splitting for the
-- fused C ops, callables, a step's closure, and the first non-finite
-- tensor of a list.
local foreach = require("muon.foreach")
local E = require("muon.errors")

local U = {}

-- Call fn(sublists...) once per dtype: the fused C ops take one dtype per call.
function U.per_dtype(fn, lists)
  local first = lists[1]
  local mixed = false
  for i = 2, #first do
    if first[i]:dtype() ~= first[1]:dtype() then mixed = true break end
  end
  if not mixed then return fn(unpack(lists)) end
  local parts, order = {}, {}
  for i = 1, #first do
    local dt = first[i]:dtype()
    if not parts[dt] then
      parts[dt] = {}
      for j = 1, #lists do parts[dt][j] = {} end
      order[#order + 1] = dt
    end
    for j = 1, #lists do
      local l = parts[dt][j]
      l[#l + 1] = lists[j][i]
    end
  end
  for _, dt in ipairs(order) do fn(unpack(parts[dt])) end
end

-- The pairs (as[i], bs[i]) split by the dtype of as[i]: a list of
-- { as_part, bs_part } (one entry when all share a dtype; none when empty).
function U.split_dtype(as, bs)
  local n = #as
  if n == 0 then return {} end
  local dt = as[1].scalar
  local mixed = false
  for i = 2, n do
    if as[i].scalar ~= dt then mixed = true break end
  end
  if not mixed then return { { as, bs } } end
  local parts, by = {}, {}
  for i = 1, n do
    local d = as[i].scalar
    local part = by[d]
    if not part then
      part = { {}, {} }
      by[d] = part
      parts[#parts + 1] = part
    end
    part[1][#part[1] + 1], part[2][#part[2] + 1] = as[i], bs[i]
  end
  return parts
end

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

-- Index of the first tensor holding NaN/Inf, or nil.
function U.first_nonfinite(xs)
  if #xs == 0 then return nil end
  for i = 2, #xs do
    if xs[i]:dtype() ~= xs[1]:dtype() then
      for j, x in ipairs(xs) do
        if not x:all_finite() then return j end
      end
      return nil
    end
  end
  local ok, bad = foreach.all_finite(xs)
  if ok then return nil end
  return bad
end

return U
