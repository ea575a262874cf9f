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

-- A function, or a table or userdata with a __call metamethod.
function U.callable(f)
  if type(f) == "function" then return true end
  local mt = (type(f) == "table" or type(f) == "userdata") and getmetatable(f)
  return type(mt) == "table" and mt.__call ~= nil
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

-- The standalone classes run on one process: the seed's hsdp_replica_count
-- is accepted when it says so (nil or 1); more replicas need a mesh.
function U.check_one_process(kind, g, where, level)
  local n = kind.replica_count and kind.replica_count(g.hsdp_replica_count, level + 1) or 1
  if n > 1 then
    error(("%s: hsdp_replica_count = %d needs %d replicas, and this optimizer runs on one process: use "
      .. "muon.engine with a config holding dist = { mesh = { { \"replicate\", %d }, { \"shard\", <ranks / %d> } } } "
      .. "(parameters placed { \"R\", \"S(1)\" }) under mpirun"):format(where, n, n, n, n), level + 1)
  end
end

-- A one-process optimizer class over the step protocol for one kind:
-- returns { class = the methods table, new = function(params, opts, level) }.
-- The object: param_groups (torch-like: params, step, options), state
-- (param -> its state table), stats, defaults; methods step(closure),
-- params(), add_param_group(g), state_dict(), load_state_dict(d), save(path), load(path, opts).
function U.optimizer_class(kind, what)
  local class = {}
  class.__index = class

  local function new(params, opts, level)
    level = level or 2
    local defaults, groups = O.build_groups({ what = what, defaults = kind.DEFAULTS, allowed = kind.OPTIONS,
      resolve = kind.resolve, check_param = kind.check_param }, params, opts, level)
    for gi, g in ipairs(groups) do U.check_one_process(kind, g, ("%s param group %d"):format(what, gi), level + 1) end
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
  -- loss and gradients). Returns the closure's value (nil without one) and
  -- whether it stepped: false when no parameter has a grad, and then
  -- nothing changed (parameters, state, group steps).
  function class:step(closure)
    local loss
    if closure ~= nil then
      if not U.callable(closure) then E.raise(E.EINVAL, "step: closure must be a function or nil, got %s", type(closure)) end
      loss = closure()
    end
    local ok, stepped = pcall(self._stepper.step, self._stepper)
    if not ok then E.reraise(stepped, E.ELUA) end
    return loss, stepped
  end

  -- Add a group { params = {...}, <option overrides> } as torch does: the
  -- options are checked as the constructor checks them, the others are the
  -- optimizer's defaults; a parameter already in a group is an error.
  function class:add_param_group(group)
    local ok, err = pcall(function()
      if type(group) ~= "table" or type(group.params) ~= "table" then
        error(what .. ".add_param_group: expected a table { params = {...}, <options> }", 0)
      end
      local gi = #self.param_groups + 1
      local where = ("%s param group %d"):format(what, gi)
      local seen = {}
      for _, g in ipairs(self.param_groups) do
        for _, p in ipairs(g.params) do seen[p] = true; seen[p.name] = true end
      end
      for _, p in ipairs(group.params) do
        if seen[p] or (type(p) == "table" and seen[p.name]) then
          error(("%s: some parameters appear in more than one parameter group ('%s')"):format(where, tostring(p.name)), 0)
        end
      end
      local defaults = {}
      for k, v in pairs(self.defaults) do
        if kind.OPTIONS[k] then defaults[k] = v end
      end
      local _, groups = O.build_groups({ what = what, defaults = defaults, allowed = kind.OPTIONS,
        resolve = kind.resolve, check_param = kind.check_param, first = gi }, { group }, {}, 1)
      local g = groups[1]
      U.check_one_process(kind, g, where, 1)
      local st = self._stepper
      st.groups[gi] = { kind = kind, options = g, label = ("param group %d"):format(gi) }
      for _, p in ipairs(g.params) do st:add(gi, p) end
      self.param_groups[gi] = g
    end)
    if not ok then E.reraise(err, E.EINVAL) end
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
  -- opts: { checksum = false } for a file written in Python (see muon.optim.state)
  function class:load(path, opts)
    local ok, err = pcall(S.load, self._stepper, path, { { prefix = "", kind = kind.name, hyper = "restore" } }, nil, opts)
    if not ok then E.reraise(err, E.EFORMAT) end
  end

  return { class = class, new = new }
end

return U
