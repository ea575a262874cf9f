-- The config-driven engine (its reference block below), over the step
-- protocol (muon.step) and the optimizer kinds (muon.optim.kind).
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
    check_replicas = "off" | "grads" | "params", split_ns, comm }, or {
    independent = true }), name, nil_grad_warning (steps, default 1) and
    hook_budget ({ instructions, seconds, memory }). Unknown keys are
    errors. Under mpirun (a world of several ranks) an engine without a
    mesh fails its collective calls (step, reduce_grads, clip_grad_norm,
    save, load) on every rank, naming the fix, unless its config says the
    ranks are independent on purpose: dist = { independent = true }.
muon.engine.new(config, opts)
    An engine on a config file path (run sandboxed) or a config table.
    opts.trusted = false: true runs a config file with full Lua.
    opts.source: the config's Lua source text, run as a file would be;
    config is then only its name in messages. A missing or unreadable file
    is EIO, a syntax error EFORMAT, a bad config EINVAL (the message names
    the key or option).
    opts.dry_run = nil: true or { world = N, rank = R, mesh = {{name,
    size}, ...} } opens a dry run, muon check's: add_param takes stand-ins
    (any tensor of the parameter's shape: only shapes are read) and the
    engine routes and plans but never steps, saves or loads (ESTATE). On a
    mesh (the config's dist, or a world) this process stands for rank R
    (default 0) of N ranks (default: the mesh's size) on a virtual
    communicator (muon.comm.virtual); mesh replaces the config's dist.mesh
    (default, without one: {{"world", N}}).
muon.engine.check(config, shapes, opts)
    The dry run of muon check and muon check --world: an engine opened
    with opts (engine.new's; dry_run = true unless given), each { name,
    shape, placement } of shapes registered as a stand-in (a view of its
    shape with strides 0 over one element: nothing of its size is
    allocated). On a mesh a parameter is placed by its placement, else
    "S(1)" on the axes whose name starts with "shard" and "R" on the
    others (a 0-D parameter is replicated), and the stand-in has this
    rank's shard shape. Returns the rows of describe(), the problems (one
    per parameter that could not be registered; a broken config is one
    problem, and then no engine) and the engine (eng:plan() is its plan).
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
Engine:set_grads(changes)
    Re-point registered parameters' grads between steps, all at once (a
    host whose framework reallocates gradients): changes is a list of
    { name, grad }, grad a tensor of the value's dtype and shape (on a
    mesh: this rank's shard) or nil (no gradient: steps skip the
    parameter). The old grads of those parameters are let go first, then
    the new ones must overlap no registered value or grad. EINVAL / EDTYPE
    / ESHAPE naming the parameter, and nothing changes, otherwise.
Engine:param_groups()
    The groups as plain data: a list of { index, name, optimizer, step,
    options (the group's values, the config's with set_lr applied; no
    functions), hooks (the names of the hooks it runs), params (the names
    of its parameters, in registration order) }; tostring of one prints it
    as torch.optim does ("Parameter Group 0\n    lr: 0.02 ..."), and
    tostring(eng) all of them (the seed's repr).
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
    Collective: every rank passes the same op (else EINVAL on every rank,
    naming both, nothing changed); its bytes count in comm_stats().data. A grad missing on
    some ranks of a box is EINVAL on every rank naming the parameter and
    the ranks (no grad changed). Without dist: nothing changes. Returns the
    number of grads reduced on this rank.
Engine:clip_grad_norm(max_norm)
    torch.nn.utils.clip_grad_norm_ over the registered grads: returns the
    total L2 norm before clipping and, when max_norm / (norm + 1e-6) < 1,
    multiplies every grad by it (not when the norm is NaN or Inf). Exact
    (one rounding), so the same bits on any mesh, where it is a collective
    over the whole parameters, each piece counted once (replicas must hold
    the same grads: reduce them first). max_norm: a finite number >= 0,
    the same on every rank (EINVAL otherwise, nothing changed).
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
    the last step stepped), "lr_scale", "state_bytes", "scratch_bytes", and
    "stats.<name>" / "stats.update_rms:<group>": a number of stats() (NaN
    before the first step). An unknown key or group is EINVAL listing the
    valid ones.
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
    { state_bytes = n, scratch_bytes = n, scratch = { updates, state,
    copies, routing, ns } } this rank holds: the optimizer state, and the
    step's own buffers by kind (an update buffer per parameter; second
    buffers of the state the kinds do not write in place, AdamW's moments,
    and of the hooks' state; post_update_fn's copies; a mesh's routing
    buffers and split matrices' pieces; the Newton-Schulz workspace, per
    worker the largest matrix and two n x n Gram buffers, and the split
    groups' machines).
Engine:stats()
    { steps = n, <kind> = { steps, skipped_nonfinite }, comm = ... (with
    dist) } and, after a step, its measurements (muon.step_stats):
    step_seconds, ns_seconds and hook_seconds (this rank's wall time: the
    step, the Newton-Schulz calls and the config's functions in it),
    grad_norm (of every stepping parameter's gradient), update_rms[group
    name or index] (sqrt(mean u^2) of the update u the commit applies, p =
    p * decay + alpha * u), ns_matrices, ns_residual and ns_residual_rms
    (the largest and the RMS of ||A - I||_F / sqrt(n) over the matrices, A
    the Gram matrix X X^T of the iterate X entering Newton-Schulz's last
    step: how far its singular values s are from 1, sqrt(mean (s^2 - 1)^2),
    computed from that step's own product), bytes_sent and bytes_recv (this
    rank). The config's log = { every = N, file = path } writes them.
Engine:comm_stats()
    Bytes and seconds per communicator of a distributed engine ({}
    without dist): { data (the plan's moves), control (agreements),
    split_ns (the split Newton-Schulz groups' exchanges, summed) }, each
    as muon.comm.stats gives them.
Engine:save(path, opts)
    One safetensors checkpoint of every group's state, the step count and
    lr_scale (atomic write, checksummed). opts.sharded = false: true
    writes a directory instead, each rank its own boxes of the state plus
    an index (muon.checkpoint_sharded), nothing gathered; every rank passes
    the same opts.
Engine:load(path, opts)
    Load a checkpoint of save() (a file, or a sharded checkpoint's
    directory, saved on any world size and mesh): everything is checked before anything
    changes. State, step counts and lr_scale are the checkpoint's; options
    the config keeps stay the config's; every saved value that differs is a
    note on stderr. opts.checksum = true: false loads a file without (or
    with stale) checksums, written in Python. On a mesh every rank passes
    the same opts and loads the same file (else EINVAL on every rank); a
    rank that cannot load its file fails every rank with its own error.
Engine:describe()
    Rows { name, shape, group, group_name, optimizer, options, defaults,
    hooks, order, ns_opts (the group's resolved muon.ns options, nil
    without Newton-Schulz) } per parameter: what muon check prints
    (copies: writing them changes nothing the engine keeps).
Engine:plan()
    This rank's plan of the registered parameters (muon.dist.plan: state
    holders, Newton-Schulz owners, items, batches, ns_load), by the rules
    the first step uses; no communication. Without dist: the plan of one
    process.
Engine:route(name, shape)
    The group a parameter of that name and shape would go to, or nil.
Engine:check_routes()
    The routing's problems over the registered parameters (muon.routing's
    report): errors and warnings, two lists of messages. The first step
    (and the first after more add_param) fails with the first error
    (EINVAL, on every rank) and prints each warning once (rank 0); muon
    check lists them as problems and warnings.
Engine:set_comm(c)
    Use communicator c (a muon.comm) instead of the world; a config with
    dist only, before the first add_param (ESTATE otherwise).
Engine:local_shape_of(name, shape, placement)
    This rank's shard shape of a parameter of global shape and placement.
]]
local config = require("muon.config")
local T = require("muon.tensor")
local P = require("muon.param")
local O = require("muon.optim.options")
local E = require("muon.errors")
local D = require("muon.dist")
local class = require("muon.optim.class")
local Step = require("muon.step")
local CK = require("muon.engine_checkpoint")
local commlib = require("muon.comm")
local G = require("muon.grads")
local K = require("muon.optim.kind")
local RO = require("muon.readonly")
local ns = require("muon.ns")
local Rt = require("muon.routing")
local Log = require("muon.log")
local Rp = require("muon.repr")

local engine = {}
local Engine = {}
Engine.__index = Engine

local OPEN_KEYS = { trusted = true, dry_run = true, source = true }
local DRY_KEYS = { world = true, rank = true, mesh = true }

-- A dry run's dist (engine.new opts.dry_run: see the reference block), its
-- mesh checked now; nil for a dry run of a config without dist.
local function dry_dist(dry, dist, label)
  if dry == true then
    if not dist then return nil end
    dry = {}
  end
  if type(dry) ~= "table" then
    E.raise(E.EINVAL, "engine.new: dry_run must be true or { world = N, rank = R, mesh = ... }, got %s", type(dry))
  end
  E.check_keys(dry, DRY_KEYS, "dry_run key", "engine.new")
  local d = {}
  for k, v in pairs(dist or {}) do d[k] = v end
  d.mesh = dry.mesh or d.mesh or { { "world", dry.world } }
  local world, rank = dry.world, dry.rank or 0
  if world == nil then
    local ok, m = pcall(D.mesh, d.mesh)
    if not ok then E.raise(E.EINVAL, "config %s: dist: %s", label, E.message(m)) end
    world = m.size
  end
  local ok, m = pcall(D.mesh, d.mesh, world)
  if ok then ok, m = pcall(commlib.virtual, world, rank) end
  if not ok then E.raise(E.EINVAL, "config %s: a dry run as rank %s of %s: %s", label, tostring(rank), tostring(world),
    E.message(m)) end
  d.comm = m
  return d
end

-- The calls a dry run refuses (they would move or read real data).
local function live(self, what)
  if self.dry_run then E.raise(E.ESTATE, "%s: a dry-run engine (muon check) routes and plans, it never steps", what) end
end

function engine.new(cfg_src, opts)
  opts = opts or {}
  if type(opts) ~= "table" then E.raise(E.EINVAL, "engine.new: options must be a table, got %s", type(opts)) end
  E.check_keys(opts, OPEN_KEYS, "option", "engine.new")
  -- (a dry run's config sees the world it stands for: muon.world())
  local dry = opts.dry_run
  local world = dry ~= nil and { size = type(dry) == "table" and tonumber(dry.world) or 1,
    rank = type(dry) == "table" and tonumber(dry.rank) or 0 } or nil
  local ok, cfg, where
  if world then ok, cfg, where = pcall(commlib.as_world, world, config.load, cfg_src, opts.trusted, opts.source)
  else ok, cfg, where = pcall(config.load, cfg_src, opts.trusted, opts.source) end
  if not ok then E.reraise(cfg, E.EINVAL) end
  local label = where == "(table)" and "(table)" or ("'" .. where .. "'")
  local ok2, groups, dist, independent = pcall(config.resolve, cfg, label, opts.trusted or type(cfg_src) == "table")
  if not ok2 then E.reraise(groups, E.EINVAL) end
  if opts.dry_run ~= nil then
    local ok5, d = pcall(dry_dist, opts.dry_run, dist, label)
    if not ok5 then E.reraise(d, E.EINVAL) end
    dist = d
  end
  local self = setmetatable({
    config = cfg, source = where, groups = groups, params = {}, by_name = {},
    lr_scale = 1.0, step_count = 0, dist = dist, signals = {}, dry_run = opts.dry_run ~= nil or nil,
    independent = independent,
  }, Engine)
  -- (messages and the stats file from rank 0 of the engine's ranks: the
  -- mesh's, or the job's for independent ranks)
  self.log = Log.new(not self.dry_run and cfg.log or nil, function()
    if self.dist then return self:_stepper():rank() end
    return commlib.world_rank()
  end)
  return self
end

-- A collective call (what: step, reduce_grads, clip_grad_norm, save, load)
-- of an engine without a mesh on a world of several ranks (mpirun): every
-- rank would train its own model, silently. Each rank sees the same world
-- and config, so each fails alike, before any communication; unless the
-- config says so (dist = { independent = true }).
local function lone_on_world(self, what)
  if self.dist or self.independent or self.dry_run then return end
  local size = commlib.world_size()
  if size <= 1 then return end
  local where = self.source == "(table)" and "(table)" or ("'" .. self.source .. "'")
  E.raise(E.EINVAL, "%s: this process is rank %d of %d (mpirun), but config %s has no dist section: every rank "
    .. "would train its own copy of the model. For data parallelism add dist = { mesh = { { \"replicate\", %d } } } "
    .. "(and call reduce_grads before each step); if the ranks are independent on purpose, add "
    .. "dist = { independent = true }", what, commlib.world_rank(), size, where, size)
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
  self.stepper = Step.new({ groups = specs, comm = comm, mesh = mesh,
    balance = d and d.balance, max_batch_numel = d and d.max_batch_numel, check_replicas = d and d.check_replicas,
    split_ns = d and d.split_ns,
    nil_grad_warning = self.config.nil_grad_warning, log = self.log,
    -- (a hook over its budget on one rank fails the step on every rank)
    settings = { { "hook_budget", K.serialize(self.config.hook_budget) } } })
  return self.stepper
end

-- (Its contract: the reference block at the top.)
function Engine:set_comm(c)
  if not self.dist then E.raise(E.ESTATE, "set_comm: the config has no dist section") end
  if not commlib.is_comm(c) then E.raise(E.EINVAL, "set_comm: expected a muon.comm communicator") end
  if self.stepper then E.raise(E.ESTATE, "set_comm: the engine already uses its communicator (call it before add_param)") end
  self.dist.comm = c
end

-- (Its contract: the reference block at the top.)
function Engine:route(name, shape) return Rt.route(self.groups, name, shape) end

-- (Its contract: the reference block at the top.)
function Engine:check_routes()
  local params = {}
  for i, e in ipairs(self.params) do
    params[i] = { name = e.param.name, shape = e.param.logical_shape, group = e.group.index }
  end
  local errors, warnings = Rt.report(self.groups, params)
  local where = self.source == "(table)" and "(table)" or ("'" .. self.source .. "'")
  for i, m in ipairs(errors) do errors[i] = ("config %s: %s"):format(where, m) end
  for i, m in ipairs(warnings) do warnings[i] = ("config %s: %s"):format(where, m) end
  return errors, warnings
end

-- The routing check of a step (check_routes, once per registration set):
-- nil, or the error that fails the step; its warnings printed once.
function Engine:_routes_error()
  if self.routes_checked == #self.params then return self.routes_err end
  self.routes_checked = #self.params
  local ok, errors, warnings = pcall(self.check_routes, self)
  if not ok then
    self.routes_err = E.is(errors) and errors or E.new(E.EINVAL, E.message(errors))
    return self.routes_err
  end
  self.warned_routes = self.warned_routes or {}
  for _, w in ipairs(warnings) do
    if not self.warned_routes[w] then
      self.warned_routes[w] = true
      self.log:say("warn", "%s", w)
    end
  end
  self.routes_err = errors[1] and E.new(E.EINVAL, errors[1]) or nil
  return self.routes_err
end

local shape_str = T.shape_string

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

-- (Its contract: the reference block at the top.)
function Engine:local_shape_of(name, shape, placement)
  local st = self:_stepper()
  local _, plspec = split_spec(placement)
  local ok, pl = pcall(D.placement, plspec, st:mesh(), #shape)
  if not ok then E.raise(E.EINVAL, "add_param '%s': %s", name, E.message(pl)) end
  return D.local_box(shape, pl, st:mesh(), st:rank()).len
end

-- (Its contract: the reference block at the top.)
function Engine:add_param(name, value, grad, placement)
  local ok, err = pcall(function()
    P.check_name(name, "add_param")
    if self.by_name[name] then E.raise(E.EINVAL, "add_param: parameter '%s' is already registered", name) end
    -- (a dry run registers stand-ins: only their shapes matter)
    if not self.dry_run then P.check(name, value, grad) end
    if placement ~= nil and not self.dist then
      E.raise(E.EINVAL, "add_param '%s': a placement needs a config with a dist section", name)
    end
    local logical, pl = self:_placement(name, value, placement)
    local g = self:route(name, logical)
    if not g then
      E.raise(E.EINVAL, "parameter '%s' (shape %s) matches no group in config %s", name, shape_str(logical), self.source)
    end
    if g.kind.ns and #logical < 2 then
      E.raise(E.EINVAL, "parameter '%s' is %d-D but matched Muon group %d%s: 1D parameters are not supported in Muon (route them to an AdamW group)",
        name, #logical, g.index, g.name and (" ('" .. g.name .. "')") or "")
    end
    local p = self.dry_run and P.shape_only(name, value) or P(name, value, grad)
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

function Engine:set_grads(changes)
  if type(changes) ~= "table" then E.raise(E.EINVAL, "set_grads: changes must be a list of { name, grad }") end
  local list, seen = {}, {}
  for i, c in ipairs(changes) do
    local name, grad = c[1], c[2]
    local p = self.by_name[name]
    if not p then E.raise(E.EINVAL, "set_grads: no parameter '%s'", tostring(name)) end
    if seen[name] then E.raise(E.EINVAL, "set_grads: parameter '%s' is given twice", name) end
    seen[name] = true
    if grad ~= nil and not T.is_tensor(grad) then
      E.raise(E.EINVAL, "set_grads: parameter '%s': grad must be a tensor or nil, got %s", name, type(grad))
    end
    list[i] = { p = p, grad = grad }
  end
  self:_stepper():set_grads(list)
end

-- A group's options as data (copies of its base values but functions) and
-- the names of the hooks it runs.
local function options_and_hooks(g)
  local options, hooks = {}, {}
  for k, v in pairs(g.base) do
    if type(v) ~= "function" then options[k] = RO.copy(v) end
  end
  for _, h in ipairs(g.kind.HOOKS) do
    if g.options[h] ~= nil then hooks[#hooks + 1] = h end
  end
  return options, hooks
end

-- A param_groups() entry's options as its tostring prints them: the
-- options with the group's name and optimizer, hooks by name.
local function shown(e)
  local o = {}
  for k, v in pairs(e.options) do o[k] = v end
  o.name, o.optimizer = e.name, e.optimizer
  for _, h in ipairs(e.hooks) do o[h] = "<function>" end
  return o
end

function Engine:param_groups()
  local list = {}
  for _, g in ipairs(self.groups) do
    local options, hooks = options_and_hooks(g)
    local params = {}
    for i, p in ipairs(g.options.params) do params[i] = p.name end
    list[#list + 1] = Rp.printable_group({ index = g.index, name = g.name, optimizer = g.kind.name, step = g.options.step,
      options = options, hooks = hooks, params = params }, g.index - 1, shown)
  end
  return list
end

-- The seed's (torch.optim's) repr over the groups, the config named:
-- "Engine (config 'configs/muon.lua', 4 parameters, step 0\nParameter Group 0\n    lr: ...\n)".
function Engine:__tostring()
  local groups = {}
  for i, e in ipairs(self:param_groups()) do groups[i] = shown(e) end
  return Rp.optimizer("Engine", groups, ("config %s, %d parameters, step %d"):format(
    self.source == "(table)" and "(table)" or ("'" .. self.source .. "'"), #self.params, self.step_count))
end

-- (Its contract: the reference block at the top.)
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
      -- (a copy: nothing the engine keeps is the schedule's)
      local r = E.call_hook_on(g.label, "schedule", sched, step,
        { index = g.index, name = g.name, optimizer = g.kind.name, base_lr = g.base.lr, base = RO.copy(g.base) })
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
  live(self, "step")
  lone_on_world(self, "step")
  local loss = class.run_closure(closure)
  local st = self:_stepper()
  local step = self.step_count + 1
  local okv, values = pcall(self._scheduled, self, step)
  -- (a routing error fails the step on every rank, as a bad value does)
  local pre_err = self:_routes_error() or (not okv and values or nil)
  local before = st:stats().steps
  local ok, stepped = pcall(st.step, st, okv and values or nil, pre_err)
  if st:stats().steps > before then self.step_count = step end
  if not ok then E.reraise(stepped, E.ELUA) end
  self.last_stepped = stepped
  if stepped and self.log:due(self.step_count) then self.log:row(self:_stats_row()) end
  return loss, stepped
end

-- A group's key in the stats (its name, else its index).
local function group_key(g) return g.name ~= nil and g.name or g.index end

-- The log file's record of the last step: step, each group's lr, then
-- eng:stats()'s measurements (muon.log writes it as CSV or JSON).
function Engine:_stats_row()
  local s = self:stats()
  local row = { { "step", self.step_count } }
  for _, g in ipairs(self.groups) do row[#row + 1] = { "lr:" .. group_key(g), g.options.lr } end
  for _, k in ipairs({ "step_seconds", "ns_seconds", "hook_seconds", "grad_norm" }) do row[#row + 1] = { k, s[k] } end
  for _, g in ipairs(self.groups) do row[#row + 1] = { "update_rms:" .. group_key(g), s.update_rms[group_key(g)] } end
  for _, k in ipairs({ "ns_residual", "ns_residual_rms", "ns_matrices", "bytes_sent", "bytes_recv" }) do
    row[#row + 1] = { k, s[k] }
  end
  return row
end

-- Average (opts.op = "mean", the default) or sum ("sum") every registered
-- gradient over the ranks holding the same box (the replicate axes of its
-- placement), in place and in a fixed order (every replica gets the same
-- bits): what an HSDP trainer does after its backward pass and before
-- step. Collective on a mesh; without a dist section nothing changes.
-- Returns the number of gradients reduced on this rank.
function Engine:reduce_grads(opts)
  live(self, "reduce_grads")
  lone_on_world(self, "reduce_grads")
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

-- (Its contract: the reference block at the top; on a mesh the values are
-- agreed like the schedule.)
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
      E.raise(E.EINVAL, "set_signal '%s': values[%d] = %s is not a finite number", name, i, E.value(values[i]))
    end
  end
  self:_stepper():set_signal(name, values)
end

-- (Its contract: the reference block at the top.)
function Engine:zero_grad()
  live(self, "zero_grad")
  G.zero(self:_stepper())
end

-- (Its contract: the reference block at the top; the maths: muon.grads.)
function Engine:clip_grad_norm(max_norm)
  live(self, "clip_grad_norm")
  lone_on_world(self, "clip_grad_norm")
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

-- (Its contract: the reference block at the top: the group's base lr,
-- which a schedule sees as base_lr.)
function Engine:set_lr(group, lr)
  local g = self:_group(group, "set_lr")
  if not O.is_finite(lr) or lr < 0 then
    E.raise(E.EINVAL, "set_lr: %s: lr must be a finite number >= 0, got %s", g.label, E.value(lr))
  end
  g.base.lr = lr
  g.options.lr = lr
end

local SETTABLE = { lr_scale = true }
-- (the stats.* keys: eng:stats()'s numbers of the last step, NaN before one)
local STATS_KEYS = { "step_seconds", "ns_seconds", "hook_seconds", "grad_norm", "ns_residual", "ns_residual_rms",
  "ns_matrices", "bytes_sent", "bytes_recv" }
local GETTABLE = { "lr", "lr:<group>", "step", "stepped", "lr_scale", "state_bytes", "scratch_bytes" }
for _, k in ipairs(STATS_KEYS) do GETTABLE[#GETTABLE + 1] = "stats." .. k end
GETTABLE[#GETTABLE + 1] = "stats.update_rms:<group>"
local IS_STAT = {}
for _, k in ipairs(STATS_KEYS) do IS_STAT[k] = true end

function Engine:set(key, value)
  if not SETTABLE[key] then
    local msg = E.unknown("key", tostring(key), SETTABLE)
    if key == "lr" or key == "step" then msg = msg .. " ('" .. key .. "' can be read with get; scale lrs with lr_scale)" end
    E.raise(E.EINVAL, "set: %s", msg)
  end
  if not O.is_finite(value) or value < 0 then E.raise(E.EINVAL, "set: %s must be a finite number >= 0, got %s", key, E.value(value)) end
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
    local stat = key:match("^stats%.(.+)$")
    if stat and IS_STAT[stat] then
      local v = self:stats()[stat]
      return v == nil and 0 / 0 or v
    end
    which = key:match("^stats%.update_rms:(.+)$")
    if which then
      local v = self:stats().update_rms[group_key(self:_group(which, "get"))]
      return v == nil and 0 / 0 or v
    end
  end
  E.raise(E.EINVAL, "get: %s", E.unknown("key", tostring(key), GETTABLE))
end

-- (Its contract: the reference block at the top.)
function Engine:memory() return self:_stepper():memory() end

-- (Its contract: the reference block at the top.)
function Engine:plan()
  local st, d = self:_stepper(), self.dist or {}
  return D.plan(st:plan_records(), st:mesh(), { rank = st:rank(), balance = d.balance,
    max_batch_numel = d.max_batch_numel, split_ns = d.split_ns })
end

-- Rows for `muon check` and humans: which parameter went where.
function Engine:describe()
  local rows = {}
  for _, e in ipairs(self.params) do
    local g = e.group
    local options, hooks = options_and_hooks(g)
    rows[#rows + 1] = { name = e.param.name, shape = { unpack(e.param.logical_shape) }, group = g.index, group_name = g.name,
      optimizer = g.kind.name, options = options, defaults = g.kind.DEFAULTS, hooks = hooks, order = g.kind.DISPLAY,
      ns_opts = g.options._ns and ns.copy(g.options._ns) }
  end
  return rows
end

function Engine:stats()
  local st = self:_stepper()
  local s = { steps = self.step_count, update_rms = {} }
  for kind, ks in pairs(st:stats().kinds) do
    s[kind] = { steps = ks.steps, skipped_nonfinite = ks.skipped_nonfinite }
  end
  if self.dist then s.comm = st:comm_stats() end
  local last = st:last_step()
  if last then
    for k, v in pairs(last) do
      if k ~= "update_rms" then s[k] = v end
    end
    for _, g in ipairs(self.groups) do s.update_rms[group_key(g)] = last.update_rms[g.index] end
  end
  return s
end

function Engine:comm_stats()
  return self.dist and self:_stepper():comm_stats() or {}
end

-- Checkpoints: muon.engine_checkpoint (the contract: the reference block).
function Engine:save(path, opts)
  live(self, "save")
  lone_on_world(self, "save")
  CK.save(self, path, opts)
end

function Engine:load(path, opts)
  live(self, "load")
  lone_on_world(self, "load")
  CK.load(self, path, opts)
end

-- A C host's argument error in a collective call (mu_engine_save, _load):
-- on a mesh it fails that call on every rank, not on this one only.
function Engine:_fail_collective(op, err) CK.fail_collective(self, op, err) end

-- The default placement of a dry run's parameter of ndim dims on mesh
-- (FSDP's: the first dim sharded on the shard axes).
local function default_placement(mesh, ndim)
  local pl = {}
  for i, a in ipairs(mesh.axes) do pl[i] = (a.name:match("^shard") and ndim >= 1) and "S(1)" or "R" end
  return pl
end

-- The dry run of muon check and muon check --world (the reference block):
-- a dry-run engine and public calls only, so that both check what a run
-- would do.
function engine.check(cfg_src, shapes, opts)
  local o = { dry_run = true }
  for k, v in pairs(opts or {}) do o[k] = v end
  local ok, eng = pcall(engine.new, cfg_src, o)
  if not ok then return {}, { tostring(eng) } end
  local problems = {}
  local cell = T.zeros({ 1 })
  eng.check_cell = cell -- the stand-ins point into it: it lives as long as eng
  local mesh = eng.dist and eng:_stepper():mesh()
  for i, s in ipairs(shapes or {}) do
    local okp, err = pcall(function()
      if type(s.name) ~= "string" or type(s.shape) ~= "table" then
        error(("shapes[%d] must be {name = string, shape = {...}}"):format(i), 0)
      end
      local shape, placement = s.shape, nil
      if mesh then
        placement = { shape = s.shape, placement = s.placement or default_placement(mesh, #s.shape) }
        shape = eng:local_shape_of(s.name, s.shape, placement)
      end
      local zero = {}
      for d = 1, #shape do zero[d] = 0 end
      local v = T.wrap(cell.data, shape, "float32", zero)
      eng:add_param(s.name, v, v, placement)
    end)
    if not okp then problems[#problems + 1] = E.message(err) end
  end
  return eng:describe(), problems, eng
end

engine.Engine = Engine
return engine
