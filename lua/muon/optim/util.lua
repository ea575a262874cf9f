-- Small helpers the optimizers share around the fused C ops, which take
-- one dtype per call.
local foreach = require("muon.foreach")

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


-- Index of the first tensor holding NaN/Inf, or nil.
function U.first_nonfinite(xs)
  for i = 2, #xs do
    if xs[i]:dtype() ~= xs[1]:dtype() then
      for j, x in ipairs(xs) do
        if not x:all_finite() then return j end
      end
      return nil
    end
  end
  if #xs == 0 then return nil end
  local ok, bad = foreach.all_finite(xs)
  if ok then return nil end
  return bad
end

return U
