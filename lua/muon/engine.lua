-- The config-driven engine: routes named parameters to the config's groups
-- (each of an optimizer kind: muon.optim.kind), computes each step's
-- scheduled values, and runs the step protocol (muon.step) over all groups
-- at once: atomic across every group, and across ranks when the config has
-- a dist section. One checkpoint holds every group's state.
--
--   local eng = require("muon.engine").new("configs/muon.lua")
--   eng:add_param("layers.0.w", value, grad)
--   eng:zero_grad()                    -- every registered grad := 0
--   eng:reduce_grads({ op = "mean" })  -- on a mesh: average grads over replicas first
--   local norm = eng:clip_grad_norm(1.0) -- torch.nn.utils.clip_grad_norm_
--   eng:set_lr("hidden", 0.01)         -- a group's base lr (by name or index)
--   eng:step()
--[[ reference muon.engine
    The config-driven engine (what mu_engine_* run): parameters routed by
    name to the config's groups, each step's values from the schedule, one
    atomic step over every group (and every rank of a mesh), one checkpoint
    of every group's state. A config returns a table with the keys groups
    (required: a list of { name, optimizer = "muon" | "adamw" | "lion",
    match, exclude, min_dim, max_dim, <the optimizer's options> }; the first
    group that matches takes a parameter), schedule (function(step, group)
    -> an lr or a table of schedulable values), hooks (for every group
    whose kind takes hooks), dist ({ mesh, balance, max_batch_numel,
    check_replicas = "off" | "grads" | "params", comm }),
    name, nil_grad_warning (steps, default 1) and
    hook_budget ({ instructions, seconds, memory }). Unknown keys are
    errors.
muon.engine.new(config, opts)
    An engine on a config file path (run sandboxed) or a config table.
    opts.trusted = false: true runs a config file with full Lua. A missing
    or unreadable file is EIO, a syntax error EFORMAT, a bad config EINVAL
    (the message names the key or option).
muon.engine.check(config, shapes, opts)
    Dry run (muon check): route { {name =, shape =}, ... } without
    allocating the parameters; returns the rows of describe() and a list
    of problems (never raises for a bad config: it is a problem).
muon.engine.Engine
    The engines' metatable.
Engine:add_param(name, value, grad, placement)
    Register a parameter (tensors; grad may be nil: skipped by steps),
    routed by name and shape. A name already registered, no matching group,
    a 1-D parameter in a Muon group, or a value or grad whose memory
    overlaps one already registered (tied weights are one parameter) is
    EINVAL naming it (and the other). placement (a
    config with dist only): one entry per mesh axis ("R", "S(d)") with
    shape = the global shape; value and grad then hold this rank's shard.
Engine:step(closure)
    One atomic step of every group: on failure nothing changed (parameters,
    state, step count). Calls closure() first when given; returns its value
    and whether it stepped (false when no parameter has a grad: the step
    count, hence the schedule, stays).
Engine:zero_grad()
    Set every registered grad to 0 in place (NaN too; parameters without a
    grad are skipped): torch's zero_grad(set_to_none=False), the buffers being the
    trainer's.
Engine:reduce_grads(opts)
    On a mesh: every registered grad becomes the mean (opts.op = "mean",
    the default) or sum ("sum") of that grad over the ranks holding the
    same box (the replicate axes of its placement), in place, added in
    rank order ((g_0 + g_1 + ...) / n): every replica gets the same bits.
    Collective; its bytes count in comm_stats().data. A grad missing on
    some ranks of a box is EINVAL on every rank naming the parameter and
    the ranks (no grad changed). Without dist: nothing changes. Returns the
    number of grads reduced on this rank.
Engine:clip_grad_norm(max_norm)
    torch.nn.utils.clip_grad_norm_ over the registered grads: returns the
    total L2 norm before clipping and, when max_norm / (norm + 1e-6) < 1,
    multiplies every grad by it (not when the norm is NaN or Inf). Exact
    (one rounding), so the same bits on any mesh, where it is a collective
    over the whole parameters, each piece counted once (replicas must hold
    the same grads: reduce them first). max_norm: a finite number >= 0
    (EINVAL otherwise, nothing changed).
Engine:set_lr(group, lr)
    Set a group's lr (group: its index or name; lr a finite number >= 0):
    it replaces the config's lr from the next step on. A schedule that
    returns an lr still overrides it (it sees it as base_lr), and lr_scale
    multiplies the result; get("lr:<group>") shows it until the next step.
    On a mesh every rank sets the same value. An unknown group is EINVAL
    listing the groups.
Engine:set(key, v)
    Set "lr_scale" (a finite number >= 0, multiplies every group's lr).
Engine:get(key)
    "lr" (group 1's), "lr:<group name or index>", "step", "stepped" (1 if
    the last step stepped), "lr_scale", "state_bytes", "scratch_bytes". An
    unknown key or group is EINVAL listing the valid ones.
Engine:set_signal(name, values)
    Per-step values (a list of finite numbers) for the hooks, read as
    ctx.signals[name]; kept until set again. On a mesh every rank sets the
    same values.
Engine:param(name)
    The registered muon.param of that name, or nil.
Engine:state(name)
    The parameter's optimizer state on this rank (nil before its first
    step, or when another replica holds it).
Engine:memory()
    { state_bytes = n, scratch_bytes = n } this rank holds.
Engine:stats()
    { steps = n, <kind> = { steps, skipped_nonfinite }, comm = ... (with
    dist) }.
Engine:comm_stats()
    Bytes and seconds per communicator of a distributed engine ({}
    without dist).
Engine:save(path)
    One safetensors checkpoint of every group's state, the step count and
    lr_scale (atomic write, checksummed).
Engine:load(path, opts)
    Load a checkpoint of save(): everything is checked before anything
    changes. State, step counts and lr_scale are the checkpoint's; options
    the config keeps stay the config's; every saved value that differs is a
    note on stderr. opts.checksum = true: false loads a file without (or
    with stale) checksums, written in Python.
Engine:describe()
    Rows { name, shape, group, group_name, optimizer, options, defaults,
    hooks, order, ns_opts (the group's resolved muon.ns options, nil
    without Newton-Schulz) } per parameter: what muon check prints.
Engine:route(name, shape)
    The group a parameter of that name and shape would go to, or nil.
Engine:set_comm(c)
    Use communicator c (a muon.comm) instead of the world; a config with
    dist only, before the first add_param (ESTATE otherwise).
Engine:local_shape_of(name, shape, placement)
    This rank's shard shape of a parameter of global shape and placement.
]]
local config = require("muon.config")
local sandbox = require("muon.sandbox")
local T = require("muon.tensor")
local P = require("muon.param")
local O = require("muon.optim.options")
local E = require("muon.errors")
local D = require("muon.dist")
local K = require("muon.optim.kind")
local S = require("muon.optim.state")
local commlib = require("muon.comm")
local U = require("muon.optim.util")
local G = require("muon.grads")

local engine = {}
local Engine = {}
Engine.__index = Engine

local ROUTING_KEYS = K.set(K.GROUP_KEYS)
local OPEN_KEYS = { trusted = true }

-- The kinds that take hooks, and their class names ("Muon"): hook options
-- (K.HOOK_KEYS) on another group would silently do nothing, so they are
-- refused by name.
local function hook_kinds()
  local classes = {}
  for _, name in ipairs(K.names()) do
    local kind = K.get(name)
    if #kind.HOOKS > 0 then classes[#classes + 1] = kind.class end
  end
  return table.concat(classes, ", ")
end

local function as_list(v, what)
  if v == nil then return {} end
  if type(v) == "string" then return { v } end
  if type(v) == "function" then return { v } end
  if type(v) ~= "table" then E.raise(E.EINVAL, "%s must be a pattern, a list of patterns or a function", what) end
  for i, p in ipairs(v) do
    if type(p) ~= "string" and type(p) ~= "function" then
      E.raise(E.EINVAL, "%s[%d] must be a Lua pattern or a function", what, i)
    end
  end
  return v
end

local function matches_any(list, name, shape)
  for _, m in ipairs(list) do
    if type(m) == "function" then
      if E.call_hook_on("parameter '" .. name .. "'", "match function", m, name, shape) then return true end
    elseif sandbox.bounded_find(name, m, "match") then -- (a backtracking pattern is refused, not run)
      return true
    end
  end
  return false
end

local function group_label(gi, name)
  return ("group %d%s"):format(gi, name and (" ('" .. tostring(name) .. "')") or "")
end

-- The dist section: mesh, balance, max_batch_numel, comm (a muon.comm).
local function resolve_dist(dcfg, where)
  if type(dcfg) ~= "table" then E.raise(E.EINVAL, "config %s: 'dist' must be a table { mesh = {...} }", where) end
  K.check_keys(dcfg, K.DIST_KEYS, "dist key", ("config %s: dist"):format(where))
  local d = {}
  for k, v in pairs(dcfg) do d[k] = v end
  return d
end

-- Check the config table and build the groups (option tables of the kinds,
-- torch-like: params, step, options) and their routing rules.
local function resolve_config(cfg, where)
  K.check_keys(cfg, K.CONFIG_KEYS, "top-level key", "config " .. where)
  local hooks = cfg.hooks or {}
  E.check_keys(hooks, K.HOOK_NAMES, "hook", ("config %s: hooks"):format(where))
  for k, v in pairs(hooks) do
    if type(v) ~= "function" then E.raise(E.EINVAL, "config %s: hook '%s' must be a function", where, k) end
  end
  local groups = {}
  local takes_hooks = false
  for _, g in ipairs(cfg.groups) do
    local kind = type(g) == "table" and K.get(g.optimizer or K.DEFAULT)
    if kind and #kind.HOOKS > 0 then takes_hooks = true end
  end
  if not takes_hooks and next(hooks) ~= nil then
    local names = {}
    for k in pairs(hooks) do names[#names + 1] = k end
    table.sort(names)
    E.raise(E.EINVAL, "config %s: hook(s) %s would never be called: hooks run in %s groups only and the config has none",
      where, table.concat(names, ", "), hook_kinds())
  end
  for gi, g in ipairs(cfg.groups) do
    if type(g) ~= "table" then E.raise(E.EINVAL, "config %s: group %d must be a table", where, gi) end
    local label = group_label(gi, g.name)
    local kname = g.optimizer or K.DEFAULT
    local kind = K.get(kname)
    if not kind then
      E.raise(E.EINVAL, "config %s: %s: %s", where, label, E.unknown("optimizer", kname, K.names()))
    end
    local opts, valid = {}, {}
    for k in pairs(ROUTING_KEYS) do valid[k] = true end
    for k in pairs(kind.OPTIONS) do valid[k] = true end
    local never = {}
    for k in pairs(g) do
      if not valid[k] and K.HOOK_KEYS[k] then never[#never + 1] = tostring(k) end
    end
    table.sort(never)
    if #never > 0 then
      local classes = hook_kinds()
      E.raise(E.EINVAL, "config %s: %s (%s): hook '%s' would never be called: hooks run in %s groups only "
        .. "(move it to a %s group or remove it)", where, label, kname, never[1], classes, classes)
    end
    E.check_keys(g, valid, kname .. " option", ("config %s: %s"):format(where, label))
    for k, v in pairs(g) do
      if not ROUTING_KEYS[k] then opts[k] = v end
    end
    for k, v in pairs(hooks) do
      if kind.OPTIONS[k] and opts[k] == nil then opts[k] = v end
    end
    for _, k in ipairs({ "min_dim", "max_dim" }) do
      if g[k] ~= nil and (type(g[k]) ~= "number" or g[k] < 0) then
        E.raise(E.EINVAL, "config %s: %s: %s must be a non-negative number", where, label, k)
      end
    end
    local options = O.merge(kind.DEFAULTS, opts)
    local ok, err = pcall(K.validate, kind, options)
    if not ok then E.raise(E.EINVAL, "config %s: %s (%s): %s", where, label, kname, E.message(err)) end
    options.params, options.name, options.step = {}, g.name, 0
    groups[gi] = {
      index = gi, name = g.name, kind = kind, label = label, options = options,
      match = as_list(g.match or ".*", ("config %s: %s.match"):format(where, label)),
      exclude = as_list(g.exclude, ("config %s: %s.exclude"):format(where, label)),
      min_dim = g.min_dim, max_dim = g.max_dim,
      base = O.merge(kind.DEFAULTS, opts),
    }
  end
  return groups
end

-- The seed's hsdp_replica_count (a Muon option) is the size of the mesh's
-- replicate axes here (axes named "replicate..."; their product): a group
-- that sets it must agree with dist.mesh, else the message shows the mesh
-- that says the same.
local function check_replicas(groups, dist, where)
  local mesh = dist and dist.mesh
  local have, names = 1, {}
  for _, ax in ipairs(mesh or {}) do
    if type(ax[1]) == "string" and ax[1]:lower():find("^replicate") then
      have = have * ax[2]
      names[#names + 1] = ax[1]
    end
  end
  for _, g in ipairs(groups) do
    local n = g.kind.replica_count and g.kind.replica_count(g.options.hsdp_replica_count) or 1
    if g.options.hsdp_replica_count ~= nil and n ~= have then
      E.raise(E.EINVAL, "config %s: %s: hsdp_replica_count = %d, but %s: replication comes from the mesh here; "
        .. "the equivalent config has dist = { mesh = { { \"replicate\", %d }, { \"shard\", <ranks / %d> } } } "
        .. "and places parameters { \"R\", \"S(1)\" }", where, g.label, n,
        mesh == nil and "the config has no dist section (one process, no replicas)"
          or ("the mesh's replicate axes (%s) have %d ranks"):format(#names > 0 and table.concat(names, ", ") or "none", have),
        n, n)
    end
  end
end

function engine.new(cfg_src, opts)
  opts = opts or {}
  if type(opts) ~= "table" then E.raise(E.EINVAL, "engine.new: options must be a table, got %s", type(opts)) end
  E.check_keys(opts, OPEN_KEYS, "option", "engine.new")
  local ok, cfg, where = pcall(config.load, cfg_src, opts.trusted)
  if not ok then E.reraise(cfg, E.EINVAL) end
  local label = where == "(table)" and "(table)" or ("'" .. where .. "'")
  local ok2, groups = pcall(resolve_config, cfg, label)
  if not ok2 then E.reraise(groups, E.EINVAL) end
  local dist
  if cfg.dist ~= nil then
    local ok3, d = pcall(resolve_dist, cfg.dist, label)
    if not ok3 then E.reraise(d, E.EINVAL) end
    dist = d
  end
  local ok4, err4 = pcall(check_replicas, groups, dist, label)
  if not ok4 then E.reraise(err4, E.EINVAL) end
  return setmetatable({
    config = cfg, source = where, groups = groups, params = {}, by_name = {},
    lr_scale = 1.0, step_count = 0, dist = dist, signals = {},
  }, Engine)
end

-- The step protocol over every group, made on first use (after set_comm).
function Engine:_stepper()
  if self.stepper then return self.stepper end
  local comm, mesh = commlib.self(), nil
  local d = self.dist
  if d then
    comm = d.comm or (commlib.world_size() > 1 and commlib.world() or commlib.self())
    local ok, m = pcall(D.mesh, d.mesh or { { "world", comm:size() } }, comm:size())
    if not ok then E.raise(E.EINVAL, "config: dist: %s", E.message(m)) end
    mesh = m
  end
  local specs = {}
  for gi, g in ipairs(self.groups) do specs[gi] = { kind = g.kind, options = g.options, label = g.label } end
  self.stepper = require("muon.step").new({ groups = specs, comm = comm, mesh = mesh,
    balance = d and d.balance, max_batch_numel = d and d.max_batch_numel, check_replicas = d and d.check_replicas,
    nil_grad_warning = self.config.nil_grad_warning })
  return self.stepper
end

-- Use this communicator (a muon.comm) instead of the world; only before the
-- first parameter is registered (mu_engine_set_comm).
function Engine:set_comm(c)
  if not self.dist then E.raise(E.ESTATE, "set_comm: the config has no dist section") end
  if not commlib.is_comm(c) then E.raise(E.EINVAL, "set_comm: expected a muon.comm communicator") end
  if self.stepper then E.raise(E.ESTATE, "set_comm: the engine already uses its communicator (call it before add_param)") end
  self.dist.comm = c
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

local function shape_str(s) return "{" .. table.concat(s, ",") .. "}" end

-- Split an add_param placement argument into (global shape or nil, per-axis
-- spec): nil (replicated), a list of per-axis entries with an optional
-- .shape field, or { shape = {...}, placement = {...} }.
local function split_spec(spec)
  if spec == nil then return nil, nil end
  if type(spec) ~= "table" then E.raise(E.EINVAL, "placement must be a table") end
  if spec.placement ~= nil then return spec.shape, spec.placement end
  local list = {}
  for i, v in ipairs(spec) do list[i] = v end
  if #list == 0 and spec.shape ~= nil then return spec.shape, nil end
  if #list == 0 then
    local map = {}
    for k, v in pairs(spec) do if k ~= "shape" then map[k] = v end end
    return spec.shape, next(map) and map or nil
  end
  return spec.shape, list
end

-- Global shape and normalized placement of a parameter whose local part is
-- value (placement: as add_param takes it).
function Engine:_placement(name, value, placement)
  local st = self:_stepper()
  local shape, plspec = split_spec(placement)
  if shape ~= nil and (type(shape) ~= "table" or #shape ~= value:dim()) then
    E.raise(E.EINVAL, "add_param '%s': shape must list the global size of each of the value's %d dims", name, value:dim())
  end
  local mesh, me = st:mesh(), st:rank()
  local ok, pl = pcall(D.placement, plspec, mesh, shape and #shape or value:dim())
  if not ok then E.raise(E.EINVAL, "add_param '%s': %s", name, E.message(pl)) end
  if shape == nil then
    for a, p in ipairs(pl) do
      if p.kind == "S" and mesh.sizes[a] > 1 then
        E.raise(E.EINVAL, "add_param '%s': placement %s shards the parameter: give its global shape as placement.shape",
          name, D.placement_string(pl))
      end
    end
    shape = value:size()
  end
  local box = D.local_box(shape, pl, mesh, me)
  local vs = value:size()
  for d = 1, #shape do
    if vs[d] ~= box.len[d] then
      E.raise(E.EINVAL, "add_param '%s': rank %d holds a local shard of shape %s, but global shape %s with placement %s on mesh %s gives %s",
        name, me, shape_str(vs), shape_str(shape), D.placement_string(pl), mesh:describe(), shape_str(box.len))
    end
  end
  return shape, pl
end

-- The local shard shape of a parameter (global shape + placement spec as
-- add_param takes them) on this rank.
function Engine:local_shape_of(name, shape, placement)
  local st = self:_stepper()
  local _, plspec = split_spec(placement)
  local ok, pl = pcall(D.placement, plspec, st:mesh(), #shape)
  if not ok then E.raise(E.EINVAL, "add_param '%s': %s", name, E.message(pl)) end
  return D.local_box(shape, pl, st:mesh(), st:rank()).len
end

-- Register a parameter (value/grad tensors; grad may be nil). placement is
-- for distributed configs: one entry per mesh axis ("R", "S(d)", ...) and
-- shape = the global shape.
function Engine:add_param(name, value, grad, placement)
  local ok, err = pcall(function()
    if type(name) ~= "string" or name == "" then E.raise(E.EINVAL, "add_param: name must be a non-empty string") end
    if self.by_name[name] then E.raise(E.EINVAL, "add_param: parameter '%s' is already registered", name) end
    -- (check() registers zero-stride stand-ins: only their shapes matter)
    if not self._shape_only then P.check(name, value, grad) end
    if placement ~= nil and not self.dist then
      E.raise(E.EINVAL, "add_param '%s': a placement needs a config with a dist section", name)
    end
    local logical, pl = self:_placement(name, value, placement)
    local g = self:route(name, logical)
    if not g then
      E.raise(E.EINVAL, "parameter '%s' (shape %s) matches no group in config %s", name, table.concat(logical, "x"), self.source)
    end
    if g.kind.ns and #logical < 2 then
      E.raise(E.EINVAL, "parameter '%s' is %d-D but matched Muon group %d%s: 1D parameters are not supported in Muon (route them to an AdamW group)",
        name, #logical, g.index, g.name and (" ('" .. g.name .. "')") or "")
    end
    local p = self._shape_only and P.shape_only(name, value) or P(name, value, grad)
    p.logical_shape = logical
    self.stepper:add(g.index, p, pl)
    g.options.params[#g.options.params + 1] = p
    self.params[#self.params + 1] = { param = p, group = g }
    self.by_name[name] = p
    return p
  end)
  if not ok then E.reraise(err, E.EINVAL) end
  return err
end

function Engine:param(name) return self.by_name[name] end

-- The optimizer state of a parameter on this rank ({ momentum_buffer } or
-- { step, exp_avg, exp_avg_sq }), nil before its first step or when
-- another replica holds it.
function Engine:state(name)
  local p = self.by_name[name]
  if not p then E.raise(E.EINVAL, "state: no parameter '%s'", tostring(name)) end
  if self.stepper then self.stepper:check_idle("state") end -- (the live buffers: not while a step runs)
  return self.stepper and self.stepper:state_of(p)
end

-- This step's values per group: every schedulable option (the kind's
-- schema) from the config, the group's value unless the schedule returns
-- one for this step; the lr times lr_scale (default: the engine's).
function Engine:_scheduled(step, lr_scale)
  local values = {}
  local sched = self.config.schedule
  for _, g in ipairs(self.groups) do
    local v = {}
    for _, k in ipairs(g.kind.SCHEDULE_ORDER) do v[k] = g.base[k] end
    if sched then
      local r = E.call_hook_on(g.label, "schedule", sched, step,
        { index = g.index, name = g.name, optimizer = g.kind.name, base_lr = g.base.lr, base = g.base })
      if type(r) == "number" then
        v.lr = r
      elseif type(r) == "table" then
        for k, x in pairs(r) do
          if not g.kind.SCHEDULABLE[k] then
            E.raise(E.EINVAL, "schedule returned '%s' for %s (%s), which cannot change per step", tostring(k), g.label, g.kind.name)
          end
          v[k] = x
        end
      elseif r == nil then
        E.raise(E.EINVAL, "schedule returned nil for %s at step %d: return the lr (a number) or a table of "
          .. "per-step values ({} keeps the config's)", g.label, step)
      else
        E.raise(E.EINVAL, "schedule must return a number (lr) or a table, got %s", type(r))
      end
    end
    if type(v.lr) == "number" then v.lr = v.lr * (lr_scale or self.lr_scale) end
    values[g.index] = v
  end
  return values
end

-- One step of every group; atomic across all of them (and across ranks):
-- a step that fails (a post_update_fn too) changes nothing.
-- closure (optional, as torch's): called first (it may compute the
-- gradients); its value is returned. Returns (closure value, stepped):
-- stepped is false when no parameter has a grad, and then nothing changed
-- (parameters, state, the step count and so the schedule).
function Engine:step(closure)
  local loss = U.run_closure(closure)
  local st = self:_stepper()
  local step = self.step_count + 1
  local okv, values = pcall(self._scheduled, self, step)
  local before = st:stats().steps
  local ok, stepped = pcall(st.step, st, okv and values or nil, not okv and values or nil)
  if st:stats().steps > before then self.step_count = step end
  if not ok then E.reraise(stepped, E.ELUA) end
  self.last_stepped = stepped
  return loss, stepped
end

-- Average (opts.op = "mean", the default) or sum ("sum") every registered
-- gradient over the ranks holding the same box (the replicate axes of its
-- placement), in place and in a fixed order (every replica gets the same
-- bits): what an HSDP trainer does after its backward pass and before
-- step. Collective on a mesh; without a dist section nothing changes.
-- Returns the number of gradients reduced on this rank.
function Engine:reduce_grads(opts)
  -- (a bad argument on one rank fails every rank: the stepper's gate)
  local op, err = nil, nil
  opts = opts == nil and {} or opts
  if type(opts) ~= "table" then
    err = E.new(E.EINVAL, ("reduce_grads: opts must be a table ({ op = 'mean' | 'sum' }), got %s"):format(type(opts)))
  else
    for k in pairs(opts) do
      if k ~= "op" then err = E.new(E.EINVAL, ("reduce_grads: unknown option '%s' (known: op)"):format(tostring(k))) end
    end
    op = opts.op == nil and "mean" or opts.op
  end
  if not self.dist then
    if err == nil and op ~= "mean" and op ~= "sum" then
      err = E.new(E.EINVAL, ("reduce_grads: op must be 'mean' or 'sum', got %s"):format(tostring(op)))
    end
    if err ~= nil then error(err, 0) end
    return 0
  end
  return self:_stepper():reduce_grads(op, err)
end

-- Per-step values from the trainer for the config's hooks, which read them
-- as ctx.signals[name] (a list of numbers); kept until set again. On a mesh
-- every rank must set the same values (they are agreed like the schedule).
function Engine:set_signal(name, values)
  if type(name) ~= "string" or name == "" then E.raise(E.EINVAL, "set_signal: name must be a non-empty string") end
  if type(values) ~= "table" then E.raise(E.EINVAL, "set_signal '%s': values must be a list of numbers", name) end
  local n = #values
  for k in pairs(values) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
      E.raise(E.EINVAL, "set_signal '%s': values must be a list of numbers (key %s)", name, tostring(k))
    end
  end
  for i = 1, n do
    if not O.is_finite(values[i]) then
      E.raise(E.EINVAL, "set_signal '%s': values[%d] = %s is not a finite number", name, i, tostring(values[i]))
    end
  end
  self:_stepper():set_signal(name, values)
end

-- Set every registered grad to 0, in place (parameters registered without
-- a grad are skipped): torch's zero_grad(set_to_none=False), since the
-- buffers are the trainer's.
function Engine:zero_grad()
  G.zero(self:_stepper())
end

-- Clip the registered grads by their global L2 norm, as
-- torch.nn.utils.clip_grad_norm_(params, max_norm): returns the total norm
-- before clipping; the grads are multiplied by max_norm / (norm + 1e-6)
-- when that is < 1. Exact, so the same bits on any mesh; there it is a
-- collective over the whole parameters (muon.grads).
function Engine:clip_grad_norm(max_norm)
  local ok, norm = pcall(G.clip, self:_stepper(), max_norm, "clip_grad_norm")
  if not ok then E.reraise(norm, E.EINVAL) end
  return norm
end

-- The group of a name or index (a number or its string), or an error
-- listing the groups.
function Engine:_group(which, who)
  for _, g in ipairs(self.groups) do
    if tostring(g.index) == tostring(which) or (g.name ~= nil and g.name == which) then return g end
  end
  local names = {}
  for _, g in ipairs(self.groups) do names[#names + 1] = g.name or tostring(g.index) end
  E.raise(E.EINVAL, "%s: %s", who, E.unknown("group", tostring(which), names))
end

-- Set the lr of a group (its index or its name): it replaces the config's
-- lr (the group's base value) from the next step on. A schedule still runs
-- on top of it: one that returns an lr overrides it (the schedule sees it
-- as base_lr), and lr_scale multiplies the result. eng:get("lr:<group>")
-- shows it until the next step. On a mesh every rank sets the same value.
function Engine:set_lr(group, lr)
  local g = self:_group(group, "set_lr")
  if not O.is_finite(lr) or lr < 0 then
    E.raise(E.EINVAL, "set_lr: %s: lr must be a finite number >= 0, got %s", g.label, tostring(lr))
  end
  g.base.lr = lr
  g.options.lr = lr
end

local SETTABLE = { lr_scale = true }
local GETTABLE = { "lr", "lr:<group>", "step", "stepped", "lr_scale", "state_bytes", "scratch_bytes" }

function Engine:set(key, value)
  if not SETTABLE[key] then
    local msg = E.unknown("key", tostring(key), SETTABLE)
    if key == "lr" or key == "step" then msg = msg .. " ('" .. key .. "' can be read with get; scale lrs with lr_scale)" end
    E.raise(E.EINVAL, "set: %s", msg)
  end
  if not O.is_finite(value) or value < 0 then E.raise(E.EINVAL, "set: %s must be a finite number >= 0, got %s", key, tostring(value)) end
  if self.stepper then self.stepper:check_idle("set") end
  self[key] = value
end

function Engine:get(key)
  if key == "lr_scale" then return self.lr_scale end
  if key == "step" then return self.step_count end
  if key == "stepped" then return self.last_stepped and 1 or 0 end -- did the last step() step?
  if key == "lr" then return self.groups[1].options.lr end
  if key == "state_bytes" or key == "scratch_bytes" then return self:memory()[key] end
  if type(key) == "string" then
    local which = key:match("^lr:(.+)$")
    if which then return self:_group(which, "get").options.lr end
  end
  E.raise(E.EINVAL, "get: %s", E.unknown("key", tostring(key), GETTABLE))
end

-- { state_bytes, scratch_bytes } this rank holds.
function Engine:memory() return self:_stepper():memory() end

-- Rows for `muon check` and humans: which parameter went where.
function Engine:describe()
  local rows = {}
  for _, e in ipairs(self.params) do
    local g = e.group
    local options, hooks = {}, {}
    for k, v in pairs(g.base) do
      if type(v) ~= "function" then options[k] = v end
    end
    for _, h in ipairs(g.kind.HOOKS) do
      if g.options[h] ~= nil then hooks[#hooks + 1] = h end
    end
    rows[#rows + 1] = { name = e.param.name, shape = e.param.logical_shape, group = g.index, group_name = g.name,
      optimizer = g.kind.name, options = options, defaults = g.kind.DEFAULTS, hooks = hooks, order = g.kind.DISPLAY,
      ns_opts = g.options._ns }
  end
  return rows
end

function Engine:stats()
  local st = self:_stepper()
  local s = { steps = self.step_count }
  for kind, ks in pairs(st:stats().kinds) do
    s[kind] = { steps = ks.steps, skipped_nonfinite = ks.skipped_nonfinite }
  end
  if self.dist then s.comm = st:comm_stats() end
  return s
end

function Engine:comm_stats()
  return self.dist and self:_stepper():comm_stats() or {}
end

-- The kinds the config uses, as checkpoint parts (prefix per kind, in
-- K.KINDS order).
local function parts(self)
  local seen, list = {}, {}
  for _, kind in ipairs(K.names()) do
    for _, g in ipairs(self.groups) do
      if g.kind.name == kind and not seen[kind] then
        seen[kind] = true
        list[#list + 1] = { prefix = kind .. "/", kind = kind, hyper = "config" }
      end
    end
  end
  return list
end

-- A bad path fails on every rank of a mesh (the call's gate, muon.step).
local function path_error(fn, path)
  if type(path) ~= "string" then return E.new(E.EINVAL, ("%s: path must be a string, got %s"):format(fn, type(path))) end
  if path == "" then return E.new(E.EINVAL, fn .. ": path is empty") end
end

function Engine:save(path)
  local ok, err = pcall(S.save, self:_stepper(), path, parts(self),
    { ["muon.engine.step"] = tostring(self.step_count), ["muon.engine.lr_scale"] = ("%.17g"):format(self.lr_scale) },
    path_error("save", path))
  if not ok then E.reraise(err, E.EIO) end
end

-- A C host's argument error in a collective call (mu_engine_save, _load):
-- on a mesh it fails that call on every rank, not on this one only.
function Engine:_fail_collective(op, err)
  if self.dist == nil then error(err, 0) end
  local st = self:_stepper()
  if op == "save" then S.save(st, nil, parts(self), nil, err) else S.load(st, nil, parts(self), nil, nil, err) end
end

-- The engine's values in a checkpoint's metadata, checked like config values.
local function engine_meta(meta)
  local step_s, scale_s = meta["muon.engine.step"], meta["muon.engine.lr_scale"]
  local step, scale = tonumber(step_s), tonumber(scale_s)
  if step_s == nil or step == nil or step ~= math.floor(step) or step < 0 or step >= 2 ^ 53 then
    E.raise(E.EFORMAT, "checkpoint metadata muon.engine.step = %s is not an integer >= 0", tostring(step_s))
  end
  if scale_s == nil or not O.is_finite(scale) or scale < 0 then
    E.raise(E.EFORMAT, "checkpoint metadata muon.engine.lr_scale = %s is not a finite number >= 0", tostring(scale_s))
  end
  return step, scale
end

-- Load a checkpoint saved by save(); checks everything before changing anything.
-- opts: { checksum = false } accepts a file without checksums (or with stale
-- ones), e.g. written or edited in Python; everything else is still checked.
-- What a load restores and what the config keeps (one rule, from the
-- kinds' schemas, kind.LOAD): the state, the step counts and lr_scale are
-- the checkpoint's; an option the config keeps ("config") stays the
-- config's; a schedulable one ("restore") is the checkpoint's (the value
-- its last step used) until the next step computes it from the config.
-- Every saved value that differs from the config's (for a schedulable one:
-- what the config gives at the checkpoint's step) is a note on stderr.
function Engine:load(path, opts)
  local values
  local ps = parts(self)
  local ok, err = pcall(S.load, self:_stepper(), path, ps, function(meta)
    values = { engine_meta(meta) }
    -- the config's values at the checkpoint's step, per kind's groups
    local okv, sched = false, nil
    if values[1] > 0 then okv, sched = pcall(self._scheduled, self, values[1], values[2]) end
    for _, part in ipairs(ps) do
      part.expected = nil
      if okv then
        part.expected = { step = values[1] }
        for _, g in ipairs(self.groups) do
          if g.kind.name == part.kind then part.expected[#part.expected + 1] = sched[g.index] end
        end
      end
    end
  end, opts, path_error("load", path))
  if not ok then E.reraise(err, E.EFORMAT) end
  self.step_count, self.lr_scale = values[1], values[2]
end

-- Dry run for `muon check`: route every {name=, shape=} and collect problems
-- instead of raising. Returns rows (as describe()) and a list of problems.
-- Nothing of a parameter's size is allocated: each one is registered as a
-- view of the declared shape whose strides are all 0 over one shared
-- element (routing and the checks read shapes only; nothing steps).
function engine.check(cfg_src, shapes, opts)
  local ok, eng = pcall(engine.new, cfg_src, opts)
  if not ok then return {}, { tostring(eng) } end
  local problems = {}
  local cell = T.zeros({ 1 })
  eng.check_cell = cell -- the views point into it: it lives as long as eng
  eng._shape_only = true
  for i, s in ipairs(shapes or {}) do
    local okp, err = pcall(function()
      if type(s.name) ~= "string" or type(s.shape) ~= "table" then
        error(("shapes[%d] must be {name = string, shape = {...}}"):format(i), 0)
      end
      local zero = {}
      for d = 1, #s.shape do zero[d] = 0 end
      local v = T.wrap(cell.data, s.shape, "float32", zero)
      eng:add_param(s.name, v, v)
    end)
    if not okp then problems[#problems + 1] = E.message(err) end
  end
  return eng:describe(), problems
end

engine.Engine = Engine
return engine
