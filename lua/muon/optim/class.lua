-- The one-process optimizer class of a kind (muon.optim.Muon, AdamW, Lion):
-- torch-like param groups over the step protocol (muon.step), through the
-- Stepper's documented methods only. Each kind's file returns
-- M.module(kind): its module table, callable as the class's constructor.
--
-- The object: param_groups (torch-like: params, step, options), state
-- (param -> its state table), stats, defaults; methods step(closure),
-- params(), add_param_group(g), memory(), zero_grad(), clip_grad_norm(max_norm)
-- (torch.nn.utils.clip_grad_norm_; returns the norm), state_dict(),
-- load_state_dict(d), save(path), load(path, opts).
local O = require("muon.optim.options")
local E = require("muon.errors")
local K = require("muon.optim.kind")
local Step = require("muon.step")
local S = require("muon.checkpoint")
local G = require("muon.grads")
local Rp = require("muon.repr")

local M = {}

-- A function, or a table or userdata with a __call metamethod.
local function callable(f)
  if type(f) == "function" then return true end
  local mt = (type(f) == "table" or type(f) == "userdata") and getmetatable(f)
  return type(mt) == "table" and mt.__call ~= nil
end

-- A step's optional closure (torch's): nil, or a callable called first,
-- its value returned; anything else is EINVAL ("step: closure must be
-- ..."). The engine's step takes it the same way.
function M.run_closure(closure)
  if closure == nil then return nil end
  if not callable(closure) then E.raise(E.EINVAL, "step: closure must be a function or nil, got %s", type(closure)) end
  return (closure())
end

-- The standalone classes run on one process: the seed's hsdp_replica_count
-- is accepted when it says so (nil or 1); more replicas need a mesh.
local function check_one_process(kind, g, where, blame)
  if not kind.replica_count then return end
  local n = kind.replica_count(g.hsdp_replica_count)
  if n > 1 then
    local raise = blame and E.blame or E.raise
    raise(E.EINVAL, "%s: hsdp_replica_count = %d needs %d replicas, and this optimizer runs on one process: use "
      .. "muon.engine with a config holding dist = { mesh = { { \"replicate\", %d }, { \"shard\", <ranks / %d> } } } "
      .. "(parameters placed { \"R\", \"S(1)\" }) under mpirun", where, n, n, n, n)
  end
end

local function group_spec(kind, what, defaults, first, blame)
  return { what = what, defaults = defaults, allowed = kind.OPTIONS, first = first, blame = blame,
    resolve = function(g) K.validate(kind, g) end, check_param = kind.check_param }
end

-- { class = the methods table, new = function(params, opts) } for a kind.
function M.make(kind)
  local what = kind.class
  local class = {}
  class.__index = class

  local function new(params, opts)
    local defaults, groups = O.build_groups(group_spec(kind, what, kind.DEFAULTS, 1, true), params, opts)
    for gi, g in ipairs(groups) do check_one_process(kind, g, ("%s param group %d"):format(what, gi), true) end
    local specs = {}
    for gi, g in ipairs(groups) do specs[gi] = { kind = kind, options = g, label = ("param group %d"):format(gi) } end
    local stepper = Step.new({ groups = specs })
    for gi, g in ipairs(groups) do
      for _, p in ipairs(g.params) do stepper:add(gi, p) end
      Rp.printable_group(g, gi - 1)
    end
    return setmetatable({
      defaults = defaults,
      param_groups = groups,
      state = stepper:state_table(),
      stats = stepper:stats().kinds[kind.name],
      _stepper = stepper,
    }, class)
  end

  -- One step; with a closure, calls it first (torch: it recomputes the
  -- loss and gradients). Returns the closure's value (nil without one) and
  -- whether it stepped: false when no parameter has a grad, and then
  -- nothing changed (parameters, state, group steps).
  function class:step(closure)
    local loss = M.run_closure(closure)
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
        E.raise(E.EINVAL, "%s.add_param_group: expected a table { params = {...}, <options> }", what)
      end
      local gi = #self.param_groups + 1
      local where = ("%s param group %d"):format(what, gi)
      local seen = {}
      for _, g in ipairs(self.param_groups) do
        for _, p in ipairs(g.params) do seen[p] = true; seen[p.name] = true end
      end
      for _, p in ipairs(group.params) do
        if seen[p] or (type(p) == "table" and seen[p.name]) then
          E.raise(E.EINVAL, "%s: some parameters appear in more than one parameter group ('%s')", where, tostring(p.name))
        end
      end
      local defaults = {}
      for k, v in pairs(self.defaults) do
        if kind.OPTIONS[k] then defaults[k] = v end
      end
      local _, groups = O.build_groups(group_spec(kind, what, defaults, gi, false), { group }, {})
      local g = groups[1]
      check_one_process(kind, g, where, false)
      local st = self._stepper
      st:check_buffers(g.params) -- (before anything is added)
      st:add_group({ kind = kind, options = g, label = ("param group %d"):format(gi) })
      for _, p in ipairs(g.params) do st:add(gi, p) end
      self.param_groups[gi] = Rp.printable_group(g, gi - 1)
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

  -- torch.optim's repr (the seed's __repr__): "Muon (\nParameter Group 0\n    lr: 0.02 ...)".
  function class:__tostring() return Rp.optimizer(what, self.param_groups) end

  -- Set every parameter's grad to 0, in place (those without one skipped).
  function class:zero_grad() G.zero(self._stepper) end

  -- torch.nn.utils.clip_grad_norm_ over every parameter's grad: returns
  -- the total L2 norm before clipping (muon.grads).
  function class:clip_grad_norm(max_norm)
    local ok, norm = pcall(G.clip, self._stepper, max_norm, what .. ".clip_grad_norm")
    if not ok then E.reraise(norm, E.EINVAL) end
    return norm
  end

  function class:state_dict() return S.state_dict(self._stepper, kind.name) end
  function class:load_state_dict(d)
    local ok, err = pcall(S.load_state_dict, self._stepper, kind.name, d, "state dict")
    if not ok then E.reraise(err, E.EFORMAT) end
  end
  function class:save(path)
    local ok, err = pcall(S.save, self._stepper, path, { { prefix = "", kind = kind.name } })
    if not ok then E.reraise(err, E.EIO) end
  end
  -- opts: { checksum = false } for a file written in Python (see muon.checkpoint)
  function class:load(path, opts)
    local ok, err = pcall(S.load, self._stepper, path, { { prefix = "", kind = kind.name, hyper = "restore" } }, nil, opts)
    if not ok then E.reraise(err, E.EFORMAT) end
  end

  return { class = class, new = new }
end

-- A kind's module table (kind: registered, K.register): { new =
-- function(params, opts), <class> = the methods table, kind, DEFAULTS,
-- OPTIONS, ...extra }, callable as <class>(params, opts).
function M.module(kind, extra)
  local make = M.make(kind)
  local mod = { new = make.new, [kind.class] = make.class, kind = kind, DEFAULTS = kind.DEFAULTS, OPTIONS = kind.OPTIONS }
  for k, v in pairs(extra or {}) do mod[k] = v end
  return setmetatable(mod, { __call = function(_, params, opts) return make.new(params, opts) end })
end

return M
