-- What the optimizers share: per-dtype splitting for the fused C ops, the
-- first non-finite tensor of a list, and the one-process optimizer class
-- (muon.optim.Muon / AdamW) built on the step protocol (muon.step).
local foreach = require("muon.foreach")
local O = require("muon.optim.options")
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

-- A one-process optimizer class over the step protocol for one kind:
-- returns { class = the methods table, new = function(params, opts, level) }.
-- The object: param_groups (torch-like: params, step, options), state
-- (param -> its state table), stats, defaults; methods step(closure),
-- params(), state_dict(), load_state_dict(d), save(path), load(path).
function U.optimizer_class(kind, what)
  local class = {}
  class.__index = class

  local function new(params, opts, level)
    level = level or 2
    local defaults, groups = O.build_groups({ what = what, defaults = kind.DEFAULTS, allowed = kind.OPTIONS,
      resolve = kind.resolve, check_param = kind.check_param }, params, opts, level)
    local specs = {}
    for gi, g in ipairs(groups) do specs[gi] = { kind = kind, options = g, label = ("param group %d"):format(gi) } end
    local stepper = require("muon.step").new({ groups = specs })
    for gi, g in ipairs(groups) do
      for _, p in ipairs(g.params) do stepper:add(gi, p) end
    end
    return setmetatable({
      defaults = defaults,
      param_groups = groups,
      state = stepper.state,
      stats = stepper.stats.kinds[kind.name],
      _stepper = stepper,
    }, class)
  end

  -- One step; with a closure, calls it first (torch: it recomputes the
  -- loss and gradients) and returns its value.
  function class:step(closure)
    local loss
    if closure ~= nil then
      if type(closure) ~= "function" then E.raise(E.EINVAL, "step: closure must be a function or nil, got %s", type(closure)) end
      loss = closure()
    end
    local ok, err = pcall(self._stepper.step, self._stepper)
    if not ok then E.reraise(err, E.ELUA) end
    return loss
  end

  -- Every parameter of every group, in order.
  function class:params()
    local list = {}
    for _, g in ipairs(self.param_groups) do
      for _, p in ipairs(g.params) do list[#list + 1] = p end
    end
    return list
  end

  function class:memory() return self._stepper:memory() end

  local S = require("muon.optim.state")
  function class:state_dict() return S.state_dict(self._stepper, kind.name) end
  function class:load_state_dict(d)
    local ok, err = pcall(S.load_state_dict, self._stepper, kind.name, d, "state dict")
    if not ok then E.reraise(err, E.EFORMAT) end
  end
  function class:save(path)
    local ok, err = pcall(S.save, self._stepper, path, { { prefix = "", kind = kind.name } })
    if not ok then E.reraise(err, E.EIO) end
  end
  function class:load(path)
    local ok, err = pcall(S.load, self._stepper, path, { { prefix = "", kind = kind.name } })
    if not ok then E.reraise(err, E.EFORMAT) end
  end

  return { class = class, new = new }
end

return U
