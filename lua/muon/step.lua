-- The optimizer step protocol, written once for one process and for every
-- MPI mesh (one process is the mesh of a size-1 communicator). A step
-- computes, then commits: every hook and every check works on the step's
-- private buffers (muon.scratch), and the parameters, the state and the
-- hook state are written once, at the end, after every rank agreed. A step
-- that fails anywhere (a bad value, a hook that raises or runs out of its
-- budget, NaN/Inf, another rank's failure) changes nothing on any rank:
--
--   1. values   the step's values (group options + the schedule's), each
--               checked (finite, in range; the error names group, key, value)
--   2. grads    which parameters step (those with a grad), shapes, the
--               NaN/Inf policy per group (for the grads no direction pass
--               checks: see 3); on a mesh, one all-reduce agrees on
--               failures, skipped groups, the stepping set and the values
--   3. direction each state holder's kind computes the new state and the
--               NS input (Muon) or the update (AdamW, Lion) into scratch
--               (kind.direction; momentum_update_fn), checking in the same
--               pass what it writes (kind.checks: its gradients too, and
--               for AdamW and Lion the apply's result)
--   4. ns       per batch, NS inputs go to the rank that orthogonalizes them
--               and every update slice comes back (muon.ns_phase; hooks
--               around Newton-Schulz)
--   5. post     groups with a post_update_fn: each parameter's private copy
--               (refreshed from its committed value) takes the apply, then
--               the hook runs on it (muon.post_phase; after one agreement
--               on a mesh: its reductions are collectives)
--   6. check    what the commit writes is finite (muon.commit_checks: the
--               state as stored, hook state, the copies post_update_fn left,
--               the other groups' values computed without writing them);
--               on a mesh every rank agrees: the lowest failing rank's error
--               is raised everywhere
--   7. commit   state buffers swap in, the copies are copied into the
--               parameters, the other groups apply p = p * decay + alpha * u
--               in place; no error can happen from the first write to the end
-- (Before 1, a gate agrees that every rank is in the same call: step, save
-- or load, Stepper:gate. No call of the optimizer runs from inside one of
-- its hooks: Stepper:exclusive.)
--
-- Kinds (the contract: muon.optim.kind) supply their parts and see the
-- step through a narrow context (muon.kind_context), never the Stepper.
-- The engine, the one-process optimizers (muon.optim.class) and
-- checkpoints (muon.checkpoint) use the Stepper through these methods:
--
--   local S = require("muon.step")
--   local st = S.new({ groups = { { kind = K, options = g, label = "param group 1" }, ... },
--                      comm = c, mesh = m, balance = "flops", max_batch_numel = n })
--   st:add(gi, param, placement)     -- param.logical_shape: the global shape
--   st:check_buffers(params)         -- raises if their memory overlaps a registered one's
--   st:set_grads({ { p = p, grad = g }, ... }) -- re-point registered grads (nil: none), all at once
--   st:add_group(spec) --> gi        -- one more group (before its parameters)
--   st:gate(op, err, args)           -- the start of a collective call (step, save, load, reduce_grads,
--                                    -- clip_grad_norm): its arguments ({ key, value } strings) agreed
--   st:exclusive(what, f, ...)       -- f(...) as a call no hook may re-enter; st:check_idle(what)
--   st:step(values, pre_err)         -- values[gi] = { lr = ..., ... } this step's schedule;
--                                    -- false when no parameter has a grad (nothing changed)
--   st:set_signal(name, values)      -- ctx.signals[name] for hooks
--   st:state_table()                 -- param -> its state table (live; on its holder)
--   st:state_of(p)                   -- one parameter's state table, or nil
--   st:stats()                       -- { steps, skipped_nonfinite, kinds = { name -> {...} } } (live)
--   st:last_step()                   -- the last step's measurements (muon.step_stats), nil before one
--   st:memory(), st:comm_stats()     -- bytes held (scratch by kind: muon.scratch); communicator counters
--   st:reduce_grads(op)              -- "mean"/"sum" of the grads over replicas (muon.grad_reduce; collective)
--   st:check_replicas(what)          -- "grads"/"params": replicas bitwise equal, else raise (muon.replica_check)
--   st:mesh(), st:rank(), st:size()  -- the mesh and this process in it
--   -- checkpoints:
--   st:build_once()                  -- agree on the registrations, make the plan (collective)
--   st:group_specs(), st:params(gi)  -- the groups ({ kind, options, label }); a group's parameters
--   st:record(p)                     -- the plan's record (boxes, holders; builds the plan)
--   st:step_count(p)                 -- steps a parameter took
--   st:install(p, state, count)      -- a loaded state (the caller checked it)
--   st:agree_failure(err)            -- raise err everywhere if any rank has one (collective)
--   st:agree_entries(entries, what)  -- nil, or the message naming the first entry that differs (collective)
--   st:exchange_control(dt, s, r)    -- an all-to-all-v on the control communicator
--   st:control()                     -- that communicator (muon.grads' global norm)
local T = require("muon.tensor")
local P = require("muon.param")
local E = require("muon.errors")
local D = require("muon.dist")
local R = require("muon.router")
local commlib = require("muon.comm")
local K = require("muon.optim.kind")
local foreach = require("muon.foreach")
local B = require("muon.buffers")
local A = require("muon.agree")
local Sc = require("muon.scratch")
local KC = require("muon.kind_context")
local SP = require("muon.split_phase")
local NP = require("muon.ns_phase")
local PP = require("muon.post_phase")
local CC = require("muon.commit_checks")
local GR = require("muon.grad_reduce")
local RC = require("muon.replica_check")
local RO = require("muon.readonly")
local SS = require("muon.step_stats")

local M = {}
local Stepper = {}
Stepper.__index = Stepper
M.Stepper = Stepper

-- A step's run: its values and stepping parameters per group (run.g[gi]),
-- and on a mesh the first error met (run.failure). run:attempt(f, ...)
-- runs f: on one process an error raises at once; on a mesh the first
-- error is kept and later calls are skipped, so that every rank still
-- takes part in every collective.
local Run = {}
Run.__index = Run

function Run:attempt(f, ...)
  if self.W == 1 then return f(...) end
  if self.failure ~= nil then return end
  local ok, e = pcall(f, ...)
  if not ok then self.failure = e end
end

-- opts: groups (list of { kind, options = the group table (params, step,
-- option values), label }), comm (muon.comm, default: this process alone),
-- mesh (muon.dist mesh over comm), balance, max_batch_numel, split_ns,
-- check_replicas, nil_grad_warning (steps without a grad before a
-- parameter's warning; default 1, 0: never), settings (more { key, value }
-- strings the ranks must agree on: the caller's config keys that change
-- what a step does), log (a muon.log logger; default: MUON_LOG's level,
-- rank 0).
function M.new(opts)
  local comm = opts.comm or commlib.self()
  local W = comm:size()
  local mesh = opts.mesh or D.mesh({ { "world", W } }, W)
  local self = setmetatable({
    groups = {},
    comm = comm, W = W, me = comm:rank(), dmesh = mesh,
    balance = opts.balance or "flops", max_batch_numel = opts.max_batch_numel, split_ns = opts.split_ns,
    check_replicas_mode = opts.check_replicas or "off", settings = opts.settings or {},
    order = {}, where = {},
    state = {},     -- param -> { momentum_buffer } / { step, exp_avg, exp_avg_sq } (on its holder)
    pstep = {},     -- param -> how many steps it took (every rank knows)
    counters = { steps = 0, skipped_nonfinite = 0, kinds = {} },
    kind_stats = {},
    signals = {},   -- name -> list of numbers, for hooks (ctx.signals)
    nil_grad_warning = opts.nil_grad_warning or 1, nograd = {}, warned = {},
    built = false,
    buffers = B.new(), -- the registered values' and grads' memory
    scratch = Sc.new(), -- the step's private buffers
  }, Stepper)
  -- Separate communicators: data carries NS routing (its counters are the
  -- bytes the plan moves) and reduce_grads, ctrl the agreements, replica
  -- checks and failure messages.
  if W > 1 then
    self.data = comm:split(0, comm:rank())
    self.ctrl = comm:split(0, comm:rank())
  else
    self.data, self.ctrl = comm, comm
  end
  self.agree = A.new(self.ctrl)
  self.router = R.new(self.data)
  self.log = opts.log or require("muon.log").new(nil, function() return self.me end)
  self.ctx = KC.new(self.scratch, self.log)
  self.split_phase = SP.new(self.router, self.dmesh)
  self.ns_phase = NP.new({ groups = self.groups, scratch = self.scratch, router = self.router, ctx = self.ctx,
    me = self.me, split_phase = self.split_phase })
  self.post_phase = PP.new({ groups = self.groups, scratch = self.scratch, ctrl = self.ctrl })
  for _, g in ipairs(opts.groups) do self:add_group(g) end
  return self
end

-- One more group (spec: { kind, options, label }); returns its index.
-- Its parameters follow with add.
function Stepper:add_group(spec)
  self:check_idle("add_param_group")
  local gi = #self.groups + 1
  self.groups[gi] = spec
  local name = spec.kind.name
  if not self.counters.kinds[name] then
    self.counters.kinds[name] = { steps = 0, skipped_nonfinite = 0 }
    self.kind_stats[#self.kind_stats + 1] = self.counters.kinds[name]
  end
  self.built = false
  return gi
end

-- Refuse a call made while another call of this optimizer runs (a hook
-- calling back into its own engine or optimizer, as the C API refuses it:
-- MU_ESTATE); nothing is changed. what: the refused call.
function Stepper:check_idle(what)
  if self.running then
    E.raise(E.ESTATE, "%s: refused: the optimizer is already in a call (%s), so this comes from inside one of its "
      .. "hooks; nothing was changed", what, self.running)
  end
end

-- f(...) as the call `what` (check_idle refuses calls until it returns),
-- in a coroutine of its own: hooks cannot yield (E.call_hook), and should
-- anything else yield inside the call, the call fails instead of being
-- suspended with the optimizer busy for good once its caller's coroutine
-- is dropped.
function Stepper:exclusive(what, f, ...)
  self:check_idle(what)
  self.running = what
  local co = coroutine.create(f)
  local r = { coroutine.resume(co, ...) }
  self.running = nil
  if r[1] and coroutine.status(co) ~= "dead" then error(E.yielded(what), 0) end
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, table.maxn(r))
end

function Stepper:group_specs() return self.groups end
function Stepper:state_table() return self.state end
function Stepper:state_of(p) return self.state[p] end
function Stepper:stats() return self.counters end
function Stepper:last_step() return self.last end
function Stepper:mesh() return self.dmesh end
function Stepper:rank() return self.me end
function Stepper:size() return self.W end
function Stepper:step_count(p) return self.pstep[p] or 0 end
function Stepper:control() return self.ctrl end
function Stepper:gate(op, err, args) return self.agree:gate(op, err, args) end
function Stepper:agree_failure(err) return self.agree:failure(err) end
function Stepper:agree_entries(entries, what) return self.agree:entries(entries, what) end

-- Install a loaded state (tensors this rank holds; nil for none) and step
-- count of a parameter (checkpoints: the caller checked both).
function Stepper:install(p, state, count)
  self.state[p] = state
  self.pstep[p] = count > 0 and count or nil
end

-- One all-to-all-v of pieces on the control communicator (sends[q+1] /
-- recvs[q+1]: lists of { n, src } / { n, dst }; muon.router's exchange),
-- collective on a mesh: checkpoints gather and scatter state with it.
function Stepper:exchange_control(dtype, sends, recvs)
  R.new(self.ctrl):exchange(dtype, sends, recvs) -- (its staging goes with it)
end

-- The dtype of parameter p's kind state in group gi (hook state keeps the
-- parameter's): the group's state_dtype for float32 parameters.
function Stepper:state_dtype_of(gi, p)
  local want, dt = self.groups[gi].options.state_dtype, p.value:dtype()
  if want == nil or want == "float32" then return dt end
  if dt ~= "float32" then
    E.raise(E.EDTYPE, "parameter '%s' is %s: state_dtype = '%s' needs float32 parameters", p.name, dt, want)
  end
  return want
end

-- Register a parameter of group gi: param.value / param.grad are this
-- rank's part, param.logical_shape the global shape; placement: one entry
-- per mesh axis (muon.dist normalized), nil for replicated. Memory that
-- overlaps a registered value or grad is refused (muon.buffers).
function Stepper:add(gi, p, placement)
  self:check_idle("add_param")
  self:state_dtype_of(gi, p) -- (fails now, naming the parameter)
  if self.built and self.W > 1 then
    E.raise(E.ESTATE, "add_param '%s': parameters are fixed after the first step of a distributed run", p.name)
  end
  if not p.stand_in then self.buffers:claim({ p }) end -- (last check: nothing is registered on failure)
  p.logical_shape = p.logical_shape or p.value:size()
  self.order[#self.order + 1] = p
  self.where[p] = { gi = gi, placement = placement or D.placement(nil, self.dmesh, #p.logical_shape) }
  self.built = false
end

-- Re-point registered parameters' grads between steps, all at once:
-- changes is a list of { p = param, grad = tensor of its value's dtype and
-- shape (muon.param's checks), or nil: no gradient }; the new grads must
-- overlap no registered value or grad but those they replace
-- (muon.buffers). On failure nothing changes.
function Stepper:set_grads(changes)
  self:check_idle("set_grads")
  local list = {}
  for i, c in ipairs(changes) do
    if c.grad ~= nil then P.check(c.p.name, c.p.value, c.grad) end
    list[i] = { p = c.p, what = "grad", t = c.grad }
  end
  self.buffers:swap(list)
end

-- Raise (EINVAL, naming both) when the values or grads of params overlap
-- each other or a registered parameter's; registers nothing.
function Stepper:check_buffers(params)
  local list = {}
  for _, p in ipairs(params) do
    if not p.stand_in then list[#list + 1] = p end
  end
  self.buffers:check(list)
end

function Stepper:params(gi)
  if not self.built then
    local list = {}
    for _, p in ipairs(self.order) do
      if self.where[p].gi == gi then list[#list + 1] = p end
    end
    return list
  end
  return self.gparams[gi]
end

------------------------------------------------------------- the plan

-- The resolved configuration as (key, value) entries: every setting that
-- changes what the ranks do together (the mesh, the plan's, the replica
-- checks', the caller's settings), group kinds, names and every option of
-- the kinds' schemas, in canonical text (K.serialize: nested tables with
-- their keys sorted; hooks by presence).
function Stepper:config_entries()
  local entries = {}
  local function add(k, v) entries[#entries + 1] = { k, v } end
  add("mesh", self.dmesh:describe())
  add("balance", self.balance)
  add("max_batch_numel", tostring(self.max_batch_numel or ""))
  add("split_ns", K.serialize(self.split_ns or "auto"))
  -- (the split plan's sizes, src/ns_split.c: ranks that read different
  -- ones would plan different groups and wait on each other)
  local plan_env = os.getenv("MU_NS_SPLIT_PLAN") or ""
  add("MU_NS_SPLIT_PLAN", plan_env ~= "" and plan_env or "(unset)")
  add("check_replicas", self.check_replicas_mode)
  for _, e in ipairs(self.settings) do add(e[1], e[2]) end
  for gi, g in ipairs(self.groups) do
    local keys = {}
    for k in pairs(g.kind.OPTIONS) do keys[#keys + 1] = k end
    table.sort(keys)
    add(g.label .. ".optimizer", g.kind.name)
    add(g.label .. ".name", tostring(g.options.name))
    for _, k in ipairs(keys) do add(g.label .. "." .. k, K.serialize(g.options[k])) end
    add(g.label .. ".index", tostring(gi))
  end
  return entries
end

-- The plan's records of the registered parameters (muon.dist's D.plan),
-- in registration order, placed by placement_of(p) (default: as
-- registered). `muon check --world` plans a virtual mesh with them.
function Stepper:plan_records(placement_of)
  local records = {}
  for i, p in ipairs(self.order) do
    local w = self.where[p]
    local g = self.groups[w.gi]
    records[i] = { name = p.name, shape = p.logical_shape, placement = placement_of and placement_of(p) or w.placement,
      group = w.gi, dtype = p.value:dtype(), ns = g.kind.ns, whole = K.whole(g.kind, g.options),
      nd_mode = g.options.nd_mode, ns_opts = g.options._ns, state_count = #g.kind.state_keys, param = p,
      split_ok = g.kind.ns and not K.whole(g.kind, g.options) and g.options.zeropower_fn == nil,
      state_dtype = self:state_dtype_of(w.gi, p),
      hooks = g.kind.hook_shapes and g.kind.hook_shapes(g.options, p.logical_shape) or nil }
  end
  return records
end

-- Agree on the registrations and config (collective on a mesh) and make
-- the plan; done by the first step, or earlier by whoever needs the plan.
function Stepper:build()
  local records = self:plan_records()
  if self.W > 1 then
    local problem = D.agree(self.ctrl, records, nil)
    if problem then E.raise(E.EINVAL, problem) end
    problem = self.agree:entries(self:config_entries(), "configs")
    if problem then E.raise(E.EINVAL, problem) end
  end
  self.plan = D.plan(records, self.dmesh, { rank = self.me, balance = self.balance,
    max_batch_numel = self.max_batch_numel, split_ns = self.split_ns })
  self.records, self.rec = records, {}
  for _, r in ipairs(records) do
    r.hooks_list = r.hooks or {}
    self.rec[r.param] = r
  end
  if self.log:enabled("debug") then self:log_uneven() end
  self.gparams, self.index_of = {}, {}
  for i, p in ipairs(self.order) do self.index_of[p] = i end
  for gi = 1, #self.groups do self.gparams[gi] = {} end
  for _, p in ipairs(self.order) do table.insert(self.gparams[self.where[p].gi], p) end
  self.built = true
end

-- The seed's debug_rank0 "[hyper-optimizer uneven-shard]" line for each
-- parameter a shard axis does not divide evenly (torch.chunk's pieces of
-- unequal length, possibly empty).
function Stepper:log_uneven()
  local mesh = self.dmesh
  for _, r in ipairs(self.records) do
    for a, pl in ipairs(r.placement) do
      local d, k = pl.kind == "S" and pl.dim, mesh.sizes[a]
      if d and k > 1 and r.shape[d] % k ~= 0 then
        local sizes = {}
        for i = 0, k - 1 do sizes[i + 1] = select(2, D.chunk(r.shape[d], k, i)) end
        self.log:say("debug", "[hyper-optimizer uneven-shard] p %s placement %s device_mesh %s local_shape %s "
          .. "global_shape %s rank %d shard_sizes %s", r.name, D.placement_string(r.placement), mesh:describe(),
          T.shape_string(r.param.value:size()), T.shape_string(r.shape), self.me, T.shape_string(sizes))
      end
    end
  end
end

function Stepper:build_once()
  if not self.built then self:build() end
end

-- The plan's record of a parameter: its boxes, state holders and items.
function Stepper:record(p)
  self:build_once()
  return self.rec[p]
end

local function tensor_bytes(t) return t:numel() * T.DTYPE_SIZES[t:dtype()] end

-- { state_bytes, scratch_bytes, scratch = its parts } held by this rank.
function Stepper:memory()
  local state = 0
  for _, st in pairs(self.state) do
    for _, v in pairs(st) do if T.is_tensor(v) then state = state + tensor_bytes(v) end end
  end
  local scratch, parts = self.scratch:bytes()
  local routing = self.router:scratch_bytes()
  local machines, pieces = self.split_phase:bytes()
  routing = routing + pieces
  parts.routing = parts.routing + routing
  parts.ns = parts.ns + machines
  return { state_bytes = state, scratch_bytes = scratch + routing + machines, scratch = parts }
end

function Stepper:comm_stats()
  return { data = commlib.stats(self.data), control = commlib.stats(self.ctrl), split_ns = self.split_phase:stats() }
end

-- Values the trainer passes to hooks (ctx.signals[name]), kept until set
-- again; on a mesh they are part of the step's agreed values.
function Stepper:set_signal(name, values)
  self:check_idle("set_signal")
  local copy = {}
  for i, v in ipairs(values) do copy[i] = v end
  self.signals[name] = copy
end

------------------------------------------------------------- the phases

local function signals_copy(signals)
  local out = {}
  for k, list in pairs(signals) do
    local c = {}
    for i, v in ipairs(list) do c[i] = v end
    out[k] = c
  end
  return out
end

-- Phases 1-2 (local): this step's values and stepping parameters per
-- group. pre_err: an error the caller met preparing the values (it fails
-- the step like any other, on every rank).
local function check_phase(self, values, pre_err)
  if pre_err ~= nil then error(pre_err, 0) end
  local run = setmetatable({ W = self.W, g = {}, stepping = {}, empty_nograd = {}, signals = signals_copy(self.signals) },
    Run)
  for gi, G in ipairs(self.groups) do
    local opts = G.options
    local over = values and values[gi]
    local hp = opts
    if over then
      hp = setmetatable({}, { __index = opts })
      for k, v in pairs(over) do hp[k] = v end
    end
    local ok, err = pcall(K.check_step, G.kind, hp)
    if not ok then E.raise(E.EINVAL, "%s, step %d: %s", G.label, opts.step + 1, E.message(err)) end
    local params, grads, owners = {}, {}, {}
    local checks = G.kind.checks -- (the holders' grads: checked by direction's pass)
    for _, p in ipairs(self.gparams[gi]) do
      local g = p.grad
      if g ~= nil then
        P.check(p.name, p.value, g) -- a grad set after add_param: dtype, shape
        if G.kind.check_param then G.kind.check_param(p, hp) end
        params[#params + 1] = p
        local r = self.rec[p]
        run.stepping[r] = true
        if g:numel() > 0 and not (checks and r.holds) then
          grads[#grads + 1] = g
          owners[#owners + 1] = p
        end
      elseif self.W > 1 and self.rec[p].mine_n == 0 then
        -- an empty local shard needs no gradient buffer: it steps when the
        -- ranks holding the parameter's elements have grads (Agree:run)
        run.empty_nograd[self.rec[p]] = true
      end
    end
    local skip = false
    local bad = foreach.first_nonfinite(grads)
    if bad then
      if opts.nonfinite == "skip" then skip = true
      else E.raise(E.ENONFINITE, "parameter '%s': gradient holds NaN or Inf (%s)", owners[bad].name, G.label) end
    end
    run.g[gi] = { hp = hp, over = over, params = params, skip = skip }
  end
  return run
end

-- A group's direction and its checks (kind.checks: its report).
local function direction(self, run, G, gr, entries)
  local bad, applies = G.kind.direction(self.ctx, G.options, gr.hp, entries)
  CC.derived(run, G, gr, entries, bad, applies)
end

-- Phase 3: each state holder's direction into scratch (the entries are
-- the scratch's, kept across steps).
local function direction_phase(self, run)
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    local entries, empties = {}, {}
    gr.entries, gr.empties = entries, empties
    if not gr.skip then
      local keys = G.kind.state_keys
      local in_place = G.kind.in_place_state and G.kind.in_place_state(G.options)
      if in_place then
        local set = {}
        for _, k in ipairs(in_place) do set[k] = true end
        in_place = set
      end
      for _, p in ipairs(gr.params) do
        local r = self.rec[p]
        if r.mine_n == 0 and self.W == 1 then
          -- an empty parameter: nothing to compute, but it has state from
          -- its first step on, as any other (zero elements; hook state has
          -- its own shape). (On a mesh no rank holds an empty box's state.)
          local new
          if self.state[p] == nil then
            new = {}
            for _, k in ipairs(keys) do new[k] = T.zeros(r.mine.len, r.state_dtype) end
            for _, h in ipairs(r.hooks_list) do new[h.key] = T.zeros(h.shape, r.dtype) end
          end
          empties[#empties + 1] = { p = p, new = new, count = (self.pstep[p] or 0) + 1 }
        elseif r.mine_n > 0 then
          self.scratch:update(p, r)
          if r.holds then
            local e = self.scratch:entry(p, r, keys, self.state[p], in_place)
            e.count = (self.pstep[p] or 0) + 1
            local dest = run.ns_inputs and run.ns_inputs[r]
            if dest then -- (the NS input goes out from there: no copy)
              e.u = dest
              run.ns_direct[r] = true
            end
            entries[#entries + 1] = e
          end
        end
      end
      if #entries > 0 then run:attempt(direction, self, run, G, gr, entries) end
    end
  end
end

-- The step's signals as its hooks leave them (ctx.signals: one copy per
-- step, which they share): unchanged, or the step fails naming the value
-- (a hook's ctx is read-only; on a mesh a change would make ranks differ).
local function check_signals(self, run)
  RO.unchanged(run.signals, self.signals, "ctx.signals", "a hook", "a hook's ctx is read-only (change a copy of what "
    .. "you read)")
end

-- Phase 6 (local, after every hook of the step): the state the commit
-- swaps in, the copies post_update_fn left, the other groups' applies.
local function final_checks(self, run)
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    if not gr.skip then
      CC.state(self.scratch, self.rec, G, gr)
      if PP.runs(G, gr) then
        CC.stand_ins(G, gr, gr.stand_ins)
      else
        gr.applies = CC.apply(G, gr, CC.parts(G, gr, self.rec, self.scratch))
      end
    end
  end
end

-- Phase 7: nothing below raises (everything was checked above).
local function commit_phase(self, run)
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    local opts = G.options
    opts.step = opts.step + 1
    if gr.over then
      for k, v in pairs(gr.over) do opts[k] = v end
    end
    local ks = self.counters.kinds[G.kind.name]
    if gr.skip then
      ks.skipped_nonfinite = ks.skipped_nonfinite + 1
      self.counters.skipped_nonfinite = self.counters.skipped_nonfinite + 1
    else
      for _, p in ipairs(gr.params) do self.pstep[p] = (self.pstep[p] or 0) + 1 end
      for _, e in ipairs(gr.entries) do
        local st = self.scratch:swap(e, self.state[e.p])
        self.state[e.p] = st
        if G.kind.counts_steps then st.step = e.count end
      end
      for _, e in ipairs(gr.empties) do
        if e.new then self.state[e.p] = e.new end
        if G.kind.counts_steps then self.state[e.p].step = e.count end
      end
      if gr.stand_ins then
        for i, p in ipairs(gr.params) do p.value:copy(gr.stand_ins[i].value) end
      else
        CC.write(gr.applies)
      end
      -- the state the kind writes in place (its new value checked finite by direction)
      if G.kind.commit_state and gr.entries[1] and gr.entries[1].in_place then
        G.kind.commit_state(G.options, gr.hp, gr.entries)
      end
    end
  end
  for _, ks in ipairs(self.kind_stats) do ks.steps = ks.steps + 1 end
  self.counters.steps = self.counters.steps + 1
end

-- A parameter without a grad for the first nil_grad_warning steps since it
-- was registered (never stepped) gets one warning naming it (rank 0 prints
-- it; the stepping set is agreed).
local function warn_nil_grads(self, run)
  local n = self.nil_grad_warning
  if n == 0 then return end
  for _, p in ipairs(self.order) do
    if not run.stepping[self.rec[p]] and self.pstep[p] == nil and not self.warned[p] then
      local c = (self.nograd[p] or 0) + 1
      self.nograd[p] = c
      if c >= n then
        self.warned[p] = true
        if self.me == 0 then
          io.stderr:write(("muon: parameter '%s' has had no gradient for its first %d step%s: it does not train "
            .. "(nil_grad_warning = 0 in a config silences this)\n"):format(p.name, c, c == 1 and "" or "s"))
        end
      end
    end
  end
end

-- One step (collective on a mesh). values[gi]: this step's scheduled
-- values for group gi (they become the group's values when it commits);
-- pre_err: see check_phase. Returns true, or false when no parameter has a
-- grad (then nothing changed: parameters, state, step counts).
local function step_body(self, values, pre_err)
  local measured = SS.begin(self)
  self:gate("step")
  self:build_once()
  local W = self.W
  -- (before anything runs: a difference fails the step, which changes nothing)
  if self.check_replicas_mode ~= "off" and W > 1 then self:check_replicas(self.check_replicas_mode) end
  local run
  if W == 1 then
    run = check_phase(self, values, pre_err)
  else
    local ok, r = pcall(check_phase, self, values, pre_err)
    run = ok and r or nil
    self.agree:run(run, not ok and r or nil, self.records, self.groups)
  end
  -- Nothing to step (no parameter has a grad): no change at all, not even
  -- the step counts (torch skips such parameters). On a mesh the stepping
  -- set was agreed above, so every rank returns here together.
  warn_nil_grads(self, run)
  if next(run.stepping) == nil then return false end
  -- Phases 3-6: on one process the first error raises; on a mesh it is
  -- kept and the collectives still run, so no rank waits for another.
  -- (the batches first: where the NS inputs go; local, plan-only work)
  if W == 1 then self.ns_phase:prepare(self.plan, run)
  else
    local ok, e = pcall(self.ns_phase.prepare, self.ns_phase, self.plan, run)
    if not ok then run.failure = e end
  end
  run:attempt(direction_phase, self, run)
  -- (the router's own code does not fail on one rank only: its inputs are
  -- the plan, the same everywhere; the owners' work goes through attempt)
  if W == 1 then self.ns_phase:run(self.plan, run)
  else
    local ok, e = pcall(self.ns_phase.run, self.ns_phase, self.plan, run)
    if not ok and run.failure == nil then run.failure = e end
  end
  local any_post = false
  for gi, G in ipairs(self.groups) do any_post = any_post or PP.runs(G, run.g[gi]) end
  if any_post then
    run:attempt(self.post_phase.stage, self.post_phase, run, self.rec)
    -- (post_update_fn's reductions are collectives: every rank runs the
    -- hooks, or none)
    self.agree:failure(run.failure, run)
    run:attempt(self.post_phase.run, self.post_phase, run, self.rec, self.index_of)
  end
  if next(self.signals) ~= nil then run:attempt(check_signals, self, run) end
  run:attempt(final_checks, self, run)
  self.agree:failure(run.failure, run)
  commit_phase(self, run)
  self.last = SS.finish(self, run, measured)
  return true
end

function Stepper:step(values, pre_err) return self:exclusive("step", step_body, self, values, pre_err) end

------------------------------------------------------ replicas

-- Average (op "mean") or sum (op "sum") every registered gradient over
-- the ranks that hold the same box, in place (muon.grad_reduce;
-- collective over the mesh). Returns the number of gradients reduced.
-- pre_err: an argument error of this rank's call, raised on every rank.
local function reduce_body(self, op, pre_err)
  if pre_err == nil and op ~= "mean" and op ~= "sum" then
    pre_err = E.new(E.EINVAL, ("reduce_grads: op must be 'mean' or 'sum', got %s"):format(tostring(op)))
  end
  self:gate("reduce_grads", pre_err, { { "op", ("'%s'"):format(tostring(op)) } })
  self:build_once()
  if self.W == 1 then return 0 end
  self.grad_reduce = self.grad_reduce or GR.new(self.dmesh, self.ctrl, self.router)
  return self.grad_reduce:run(self.records, op)
end

function Stepper:reduce_grads(op, pre_err) return self:exclusive("reduce_grads", reduce_body, self, op, pre_err) end

-- Whether every replica of every box holds the same bits of its gradients
-- (what = "grads") or parameter values ("params"), else EINVAL on every
-- rank naming the first that differs (muon.replica_check; collective).
function Stepper:check_replicas(what)
  self:build_once()
  if self.W == 1 then return end
  self.replica_check = self.replica_check or RC.new(self.dmesh, self.ctrl)
  self.replica_check:run(self.records, what)
end

return M
