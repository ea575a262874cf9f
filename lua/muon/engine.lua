-- The config-driven engine: routes named parameters to the config's groups
-- (Muon or AdamW), applies the per-step schedule, steps both optimizers
-- atomically together, and saves/loads one checkpoint for both.
--
--   local eng = require("muon.engine").new("configs/muon.lua")
--   eng:add_param("layers.0.w", value, grad)
--   eng:step()
local config = require("muon.config")
local T = require("muon.tensor")
local P = require("muon.param")
local O = require("muon.optim.options")
local Muon = require("muon.optim.muon")
local AdamW = require("muon.optim.adamw")
local S = require("muon.optim.state")
local st = require("muon.safetensors")

local engine = {}
local Engine = {}
Engine.__index = Engine

local OPTIMIZERS = { muon = Muon, adamw = AdamW }
local ROUTING_KEYS = { name = true, optimizer = true, match = true, exclude = true, min_dim = true, max_dim = true }
local HOOK_NAMES = { reshape_fn = true, ns_transform_fn = true, post_update_fn = true, zeropower_fn = true,
  momentum_update_fn = true }
-- Values a schedule may set per step, by optimizer.
local SCHEDULABLE = {
  muon = { lr = true, weight_decay = true, momentum = true, matched_adamw_rms = true },
  adamw = { lr = true, weight_decay = true, betas = true, eps = true },
}
local OPEN_KEYS = { trusted = true }

local function as_list(v, what, level)
  if v == nil then return {} end
  if type(v) == "string" then return { v } end
  if type(v) == "function" then return { v } end
  -- level 0: the message already names the config (no position prefix)
  local lv = level > 0 and level + 1 or 0
  if type(v) ~= "table" then error(what .. " must be a pattern, a list of patterns or a function", lv) end
  for i, p in ipairs(v) do
    if type(p) ~= "string" and type(p) ~= "function" then
      error(("%s[%d] must be a Lua pattern or a function"):format(what, i), lv)
    end
  end
  return v
end

local function matches_any(list, name, shape)
  for _, m in ipairs(list) do
    if type(m) == "function" then
      if m(name, shape) then return true end
    elseif name:find(m) then
      return true
    end
  end
  return false
end

-- Check the config table and build the group routing records.
local function resolve_config(cfg, where)
  local unknown = O.unknown_keys(cfg, config.TOP_KEYS)
  if #unknown > 0 then
    error(("config %s: unknown top-level key(s): %s"):format(where, table.concat(unknown, ", ")), 0)
  end
  if type(cfg.groups) ~= "table" or #cfg.groups == 0 then
    error(("config %s: 'groups' must be a non-empty list of groups"):format(where), 0)
  end
  if cfg.schedule ~= nil and type(cfg.schedule) ~= "function" then
    error(("config %s: 'schedule' must be a function(step, group)"):format(where), 0)
  end
  local hooks = cfg.hooks or {}
  if type(hooks) ~= "table" then error(("config %s: 'hooks' must be a table"):format(where), 0) end
  for k, v in pairs(hooks) do
    if not HOOK_NAMES[k] then error(("config %s: unknown hook '%s'"):format(where, tostring(k)), 0) end
    if type(v) ~= "function" then error(("config %s: hook '%s' must be a function"):format(where, k), 0) end
  end
  local groups = {}
  for gi, g in ipairs(cfg.groups) do
    if type(g) ~= "table" then error(("config %s: group %d must be a table"):format(where, gi), 0) end
    local label = ("group %d%s"):format(gi, g.name and (" ('" .. tostring(g.name) .. "')") or "")
    local kind = g.optimizer or "muon"
    local optim = OPTIMIZERS[kind]
    if not optim then
      error(("config %s: %s: optimizer must be 'muon' or 'adamw', got %s"):format(where, label, tostring(kind)), 0)
    end
    local opts, bad = {}, {}
    for k, v in pairs(g) do
      if not ROUTING_KEYS[k] then
        if optim.OPTIONS[k] then opts[k] = v else bad[#bad + 1] = tostring(k) end
      end
    end
    table.sort(bad)
    if #bad > 0 then
      error(("config %s: %s (%s): unknown option(s): %s"):format(where, label, kind, table.concat(bad, ", ")), 0)
    end
    if kind == "muon" then
      for k, v in pairs(hooks) do
        if opts[k] == nil then opts[k] = v end
      end
    end
    for _, k in ipairs({ "min_dim", "max_dim" }) do
      if g[k] ~= nil and (type(g[k]) ~= "number" or g[k] < 0) then
        error(("config %s: %s: %s must be a non-negative number"):format(where, label, k), 0)
      end
    end
    -- Validate the options now by building a throwaway optimizer.
    local ok, err = pcall(optim.new, {}, opts, 1)
    if not ok then error(("config %s: %s (%s): %s"):format(where, label, kind, tostring(err)), 0) end
    groups[gi] = {
      index = gi, name = g.name, kind = kind, options = opts,
      match = as_list(g.match or ".*", ("config %s: %s.match"):format(where, label), 0),
      exclude = as_list(g.exclude, ("config %s: %s.exclude"):format(where, label), 0),
      min_dim = g.min_dim, max_dim = g.max_dim, params = {},
      base = O.merge(optim.DEFAULTS, opts),
    }
  end
  return groups
end

function engine.new(cfg_src, opts)
  opts = opts or {}
  local unknown = O.unknown_keys(opts, OPEN_KEYS)
  if #unknown > 0 then error("engine.new: unknown option(s): " .. table.concat(unknown, ", "), 2) end
  local ok, cfg, where = pcall(config.load, cfg_src, opts.trusted)
  if not ok then error(cfg, 2) end
  local ok2, groups = pcall(resolve_config, cfg, where == "(table)" and "(table)" or ("'" .. where .. "'"))
  if not ok2 then error(groups, 2) end
  local self = setmetatable({
    config = cfg, source = where, groups = groups, params = {}, by_name = {},
    lr_scale = 1.0, step_count = 0, optimizers = {},
  }, Engine)
  -- One optimizer per kind, over the groups of that kind (in config order).
  for kind, optim in pairs(OPTIMIZERS) do
    local list = {}
    for _, g in ipairs(groups) do
      if g.kind == kind then
        local spec = O.merge(g.options, { params = g.params, name = g.name })
        list[#list + 1] = spec
        g.slot = #list
      end
    end
    if #list > 0 then
      self.optimizers[kind] = optim.new(list, {}, 2)
      for _, g in ipairs(groups) do
        if g.kind == kind then g.group = self.optimizers[kind].param_groups[g.slot] end
      end
    end
  end
  if cfg.dist ~= nil then
    local okd, dist = pcall(require, "muon.optim.dist_step")
    if not okd then error("config " .. where .. ": 'dist' needs muon.optim.dist_step: " .. tostring(dist), 2) end
    self.dist = dist.attach(self, cfg.dist)
  end
  return self
end

-- The first group whose patterns match (name, shape), or nil.
function Engine:route(name, shape)
  for _, g in ipairs(self.groups) do
    local nd = #shape
    if (g.min_dim == nil or nd >= g.min_dim) and (g.max_dim == nil or nd <= g.max_dim)
      and matches_any(g.match, name, shape) and not matches_any(g.exclude, name, shape) then
      return g
    end
  end
  return nil
end

-- Register a parameter (value/grad tensors; grad may be nil). placement is
-- for distributed configs (see muon.dist).
function Engine:add_param(name, value, grad, placement)
  if type(name) ~= "string" or name == "" then error("add_param: name must be a non-empty string", 2) end
  if self.by_name[name] then error(("add_param: parameter '%s' is already registered"):format(name), 2) end
  if not T.is_tensor(value) then error(("add_param: parameter '%s': value must be a tensor"):format(name), 2) end
  if grad ~= nil and (not T.is_tensor(grad) or not P.same_shape(grad, value)) then
    error(("add_param: parameter '%s': grad must be a tensor of the value's shape %s"):format(name, P.shape_string(value)), 2)
  end
  local logical = value:size()
  if self.dist then logical = self.dist:logical_shape(name, value, placement) end
  local g = self:route(name, logical)
  if not g then error(("parameter '%s' (shape %s) matches no group in config %s"):format(name, table.concat(logical, "x"), self.source), 2) end
  if g.kind == "muon" and #logical < 2 then
    error(("parameter '%s' is %d-D but matched Muon group %d%s: 1D parameters are not supported in Muon (route them to an AdamW group)")
      :format(name, #logical, g.index, g.name and (" ('" .. g.name .. "')") or ""), 2)
  end
  local p = P(name, value, grad)
  p.logical_shape = logical
  if self.dist then self.dist:register(p, placement) end
  g.params[#g.params + 1] = p
  self.params[#self.params + 1] = { param = p, group = g }
  self.by_name[name] = p
  return p
end

function Engine:param(name) return self.by_name[name] end

-- Per-step values from the config's schedule, times lr_scale.
function Engine:_scheduled(step)
  local values = {}
  for _, g in ipairs(self.groups) do
    local v = { lr = g.base.lr }
    local sched = self.config.schedule
    if sched then
      local r = sched(step, { index = g.index, name = g.name, optimizer = g.kind, base_lr = g.base.lr, base = g.base })
      if type(r) == "number" then
        v.lr = r
      elseif type(r) == "table" then
        for k, x in pairs(r) do
          if not SCHEDULABLE[g.kind][k] then
            error(("schedule returned '%s' for group %d (%s), which cannot change per step"):format(tostring(k), g.index, g.kind), 0)
          end
          v[k] = x
        end
      elseif r ~= nil then
        error(("schedule must return a number (lr), a table or nil, got %s"):format(type(r)), 0)
      end
    end
    if not O.is_finite(v.lr) or v.lr < 0 then
      error(("schedule gave group %d an invalid lr %s"):format(g.index, tostring(v.lr)), 0)
    end
    v.lr = v.lr * self.lr_scale
    values[g.index] = v
  end
  return values
end

local function kinds(self)
  local list = {}
  for _, kind in ipairs({ "muon", "adamw" }) do
    if self.optimizers[kind] then list[#list + 1] = self.optimizers[kind] end
  end
  return list
end

-- One step of every optimizer; atomic across all of them.
function Engine:step()
  local step = self.step_count + 1
  local saved = {}
  local ok, err = pcall(function()
    local values = self:_scheduled(step)
    for _, g in ipairs(self.groups) do
      saved[g.index] = {}
      for k, v in pairs(values[g.index]) do
        saved[g.index][k] = g.group[k]
        g.group[k] = v
      end
    end
    if self.dist then return self.dist:step() end
    local plans = {}
    for i, opt in ipairs(kinds(self)) do plans[i] = opt:prepare() end
    return plans
  end)
  if not ok then
    for gi, vals in pairs(saved) do
      for k, v in pairs(vals) do self.groups[gi].group[k] = v end
    end
    error(err, 2)
  end
  self.step_count = step
  if self.dist then return end
  local plans = err
  local opts = kinds(self)
  for i, opt in ipairs(opts) do opt:commit(plans[i]) end
  for i, opt in ipairs(opts) do opt:finish(plans[i]) end
end

local SETTABLE = { lr_scale = true }

function Engine:set(key, value)
  if not SETTABLE[key] then error(("set: unknown key '%s' (settable: lr_scale)"):format(tostring(key)), 2) end
  if not O.is_finite(value) or value < 0 then error(("set: %s must be a finite number >= 0"):format(key), 2) end
  self[key] = value
end

function Engine:get(key)
  if key == "lr_scale" then return self.lr_scale end
  if key == "step" then return self.step_count end
  if key == "lr" then return self.groups[1].group.lr end
  if type(key) == "string" then
    local which = key:match("^lr:(.+)$")
    if which then
      for _, g in ipairs(self.groups) do
        if tostring(g.index) == which or g.name == which then return g.group.lr end
      end
      error(("get: no group '%s'"):format(which), 2)
    end
  end
  error(("get: unknown key '%s' (known: lr, lr:<group>, step, lr_scale)"):format(tostring(key)), 2)
end

-- Rows for `muon check` and humans: which parameter went where.
function Engine:describe()
  local rows = {}
  for _, e in ipairs(self.params) do
    local g = e.group
    local options = {}
    for k, v in pairs(g.base) do
      if type(v) ~= "function" then options[k] = v end
    end
    rows[#rows + 1] = { name = e.param.name, shape = e.param.logical_shape, group = g.index, group_name = g.name,
      optimizer = g.kind, options = options }
  end
  return rows
end

function Engine:stats()
  local s = { steps = self.step_count }
  for kind, opt in pairs(self.optimizers) do
    s[kind] = { steps = opt.stats.steps, skipped_nonfinite = opt.stats.skipped_nonfinite }
  end
  if self.dist then s.comm = self.dist:comm_stats() end
  return s
end

function Engine:comm_stats()
  return self.dist and self.dist:comm_stats() or {}
end

local function engine_meta(self)
  return { ["muon.engine.step"] = tostring(self.step_count), ["muon.engine.lr_scale"] = ("%.17g"):format(self.lr_scale) }
end

function Engine:save(path)
  if type(path) ~= "string" then error("save: path must be a string", 2) end
  if self.dist then return self.dist:save(path) end
  local dicts = {}
  for _, kind in ipairs({ "muon", "adamw" }) do
    if self.optimizers[kind] then dicts[#dicts + 1] = { prefix = kind .. "/", dict = S.state_dict(self.optimizers[kind]) } end
  end
  local entries, meta = S.encode(dicts, engine_meta(self))
  local ok, err = pcall(st.save, path, entries, meta)
  if not ok then error(err, 2) end
end

-- Load a checkpoint saved by save(); checks everything before changing anything.
function Engine:load(path)
  if type(path) ~= "string" then error("load: path must be a string", 2) end
  if self.dist then return self.dist:load(path) end
  local ok, err = pcall(function()
    local file = st.load(path)
    local dicts = S.decode(file, path)
    local by_prefix = {}
    for _, d in ipairs(dicts) do by_prefix[d.prefix] = d.dict end
    local problems = {}
    for _, kind in ipairs({ "muon", "adamw" }) do
      local opt, d = self.optimizers[kind], by_prefix[kind .. "/"]
      if opt and not d then
        problems[#problems + 1] = ("the checkpoint has no %s state"):format(kind)
      elseif d and not opt then
        problems[#problems + 1] = ("the checkpoint has %s state but this config has no %s group"):format(kind, kind)
      elseif opt then
        for _, m in ipairs(S.mismatches(opt, d)) do problems[#problems + 1] = m end
      end
    end
    if #problems > 0 then
      error(("checkpoint '%s' does not match this engine:\n  %s"):format(path, table.concat(problems, "\n  ")), 0)
    end
    for _, kind in ipairs({ "muon", "adamw" }) do
      if self.optimizers[kind] then S.load_state_dict(self.optimizers[kind], by_prefix[kind .. "/"]) end
    end
    self.step_count = tonumber(file.metadata["muon.engine.step"]) or self.step_count
    self.lr_scale = tonumber(file.metadata["muon.engine.lr_scale"]) or self.lr_scale
  end)
  if not ok then error(err, 2) end
end

-- Dry run for `muon check`: route every {name=, shape=} and collect problems
-- instead of raising. Returns rows (as describe()) and a list of problems.
function engine.check(cfg_src, shapes, opts)
  local ok, eng = pcall(engine.new, cfg_src, opts)
  if not ok then return {}, { tostring(eng) } end
  local problems = {}
  for i, s in ipairs(shapes or {}) do
    local okp, err = pcall(function()
      if type(s.name) ~= "string" or type(s.shape) ~= "table" then
        error(("shapes[%d] must be {name = string, shape = {...}}"):format(i), 0)
      end
      local v = T.zeros(s.shape)
      eng:add_param(s.name, v, T.zeros(s.shape))
    end)
    if not okp then problems[#problems + 1] = tostring(err):gsub("^[^:]*:%d+: ", "") end
  end
  return eng:describe(), problems
end

engine.Engine = Engine
return engine
