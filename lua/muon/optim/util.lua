-- Small helpers the optimizers share around the fused C ops, which take
-- one dtype per call.
local foreach = require("muon.foreach")
local P = require("muon.param")

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

-- The parameters of group gi that take a step (those with a grad), after
-- checking grad shapes (and check_param, if given) and finiteness. Returns
-- params, skipped: skipped is true when a NaN/Inf gradient meets the
-- group's nonfinite = "skip" policy; with "error" it raises naming the param.
function U.stepping_params(gi, group, check_param)
  local params, grads = {}, {}
  for _, p in ipairs(group.params) do
    if p.grad ~= nil then
      if not P.same_shape(p.grad, p.value) then
        error(("parameter '%s': grad shape %s does not match value shape %s")
          :format(p.name, P.shape_string(p.grad), P.shape_string(p.value)), 0)
      end
      if check_param then check_param(p) end
      params[#params + 1] = p
      grads[#grads + 1] = p.grad
    end
  end
  local bad = U.first_nonfinite(grads)
  if bad then
    if group.nonfinite == "skip" then return params, true end
    error(("parameter '%s': gradient holds NaN or Inf (param group %d)"):format(params[bad].name, gi), 0)
  end
  return params, false
end

-- Methods both optimizers share, on top of their prepare/commit/finish:
-- step() (atomic: prepare may raise, commit cannot fail), params(), and the
-- state/checkpoint methods.
function U.install_common(class)
  function class:step()
    local ok, plans = pcall(self.prepare, self)
    if not ok then error(plans, 2) end
    self:commit(plans)
    self:finish(plans)
  end

  -- Every parameter of every group, in order.
  function class:params()
    local list = {}
    for _, g in ipairs(self.param_groups) do
      for _, p in ipairs(g.params) do list[#list + 1] = p end
    end
    return list
  end

  require("muon.optim.state").install(class)
end

return U
