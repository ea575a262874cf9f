-- The optimizer step protocol, written once for one process and for every
-- MPI mesh (one process is the mesh of a size-1 communicator):
--
--   1. values   the step's values (group options + the schedule's), each
--               checked (finite, in range; the error names group, key, value)
--   2. grads    which parameters step (those with a grad), shapes, the
--               NaN/Inf policy per group; on a mesh, one all-reduce agrees
--               on failures, skipped groups, the stepping set and the values
--   3. momentum each optimizer-state buffer's holder computes the NS input
--               (Muon) or the update (AdamW) into scratch (kind.direction)
--   4. route    per batch, NS inputs go to the rank that orthogonalizes
--               them (muon.router, as muon.dist planned); reshape_fn /
--               ns_transform_fn / zeropower_fn, Newton-Schulz and the scale
--               run there (kind.orthogonalize); every update slice comes back.
--               Batches with nothing to route (all on one process) run
--               first, their Newton-Schulz in one scheduler call (compute_local)
--   5. check    what the commit writes is finite (updates, state a hook
--               wrote, hook state, the parameters' new values: computed
--               without writing them); on a mesh every rank agrees (the
--               lowest failing rank's error is raised everywhere, nothing
--               changes). Hooks see hook state in buffers of their own,
--               copied into the state here: no alias reaches the state
-- (Before 1, a gate agrees that every rank is in the same call: step, save
-- or load, Stepper:gate. No call of the optimizer runs from inside one of
-- its hooks: Stepper:exclusive.)
--   6. commit   state buffers swap in, p = p * decay + alpha * update; no
--               error can happen from the first write to the end of this
--   7. post     post_update_fn (after the commit; a failure on any rank
--               undoes the commit on every rank, undo_commit, and raises:
--               nothing changed, as for a failure before the commit)
--
-- Kinds (the contract: muon.optim.kind) supply their parts and see the
-- step through a narrow context (kind_context below), never the Stepper.
-- The engine, the one-process optimizers (muon.optim.class) and
-- checkpoints (muon.optim.state) use the Stepper through these methods:
--
--   local S = require("muon.step")
--   local st = S.new({ groups = { { kind = K, options = g, label = "param group 1" }, ... },
--                      comm = c, mesh = m, balance = "flops", max_batch_numel = n })
--   st:add(gi, param, placement)     -- param.logical_shape: the global shape
--   st:check_buffers(params)         -- raises if their memory overlaps a registered one's
--   st:add_group(spec) --> gi        -- one more group (before its parameters)
--   st:gate(op, err)                 -- the start of a collective call (step, save, load, reduce_grads)
--   st:exclusive(what, f, ...)       -- f(...) as a call no hook may re-enter; st:check_idle(what)
--   st:step(values, pre_err)         -- values[gi] = { lr = ..., ... } this step's schedule;
--                                    -- false when no parameter has a grad (nothing changed)
--   st:set_signal(name, values)      -- ctx.signals[name] for hooks
--   st:state_table()                 -- param -> its state table (live; on its holder)
--   st:state_of(p)                   -- one parameter's state table, or nil
--   st:stats()                       -- { steps, skipped_nonfinite, kinds = { name -> {...} } } (live)
--   st:memory(), st:comm_stats()     -- bytes held; communicator counters
--   st:reduce_grads(op)              -- "mean"/"sum" of the grads over replicas (collective)
--   st:check_replicas(what)          -- "grads"/"params": replicas bitwise equal, else raise (collective)
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
local foreach = require("muon.foreach")
local ns = require("muon.ns")
local core = require("muon.core")
local K = require("muon.optim.kind")
local U = require("muon.optim.util")
local Rd = require("muon.reduce")
local B = require("muon.buffers")
local ffi = require("ffi")

local M = {}
local Stepper = {}
Stepper.__index = Stepper
M.Stepper = Stepper

local ESIZE = T.DTYPE_SIZES -- bytes per element, from C's dtype table

local make_io, kind_context, post_reductions, warn_nil_grads -- (below)

-- Run f(...) for a step: on one process an error raises at once; on a
-- mesh the first error is kept in run.failure and later calls are skipped,
-- so that every rank still takes part in every collective.
local function attempt(run, f, ...)
  if run.W == 1 then return f(...) end
  if run.failure ~= nil then return end
  local ok, e = pcall(f, ...)
  if not ok then run.failure = e end
end

-- opts: groups (list of { kind, options = the group table (params, step,
-- option values), label }), comm (muon.comm, default: this process alone),
-- mesh (muon.dist mesh over comm), balance, max_batch_numel,
-- nil_grad_warning (steps without a grad before a parameter's warning;
-- default 1, 0: never).
function M.new(opts)
  local comm = opts.comm or commlib.self()
  local W = comm:size()
  local mesh = opts.mesh or D.mesh({ { "world", W } }, W)
  local self = setmetatable({
    groups = opts.groups,
    comm = comm, W = W, me = comm:rank(), dmesh = mesh,
    balance = opts.balance or "flops", max_batch_numel = opts.max_batch_numel,
    check_replicas_mode = opts.check_replicas or "off",
    order = {}, where = {},
    state = {},     -- param -> { momentum_buffer } / { step, exp_avg, exp_avg_sq } (on its holder)
    scratch = {},   -- param -> { u = update buffer, spare = { key -> tensor } }
    pstep = {},     -- param -> how many steps it took (every rank knows)
    full = setmetatable({}, { __mode = "k" }), -- plan item -> owner's region buffer
    merged = {}, ws = {}, -- ws: dtype -> Newton-Schulz workspace
    counters = { steps = 0, skipped_nonfinite = 0, kinds = {} },
    signals = {},   -- name -> list of numbers, for hooks (ctx.signals)
    nil_grad_warning = opts.nil_grad_warning or 1, nograd = {}, warned = {},
    built = false,
    buffers = B.new(), -- the registered values' and grads' memory
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
  self.router = R.new(self.data)
  self.io = make_io(self)
  self.ctx = kind_context(self)
  self.kind_stats = {}
  local groups = self.groups
  self.groups = {}
  for _, g in ipairs(groups) do self:add_group(g) end
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

-- f(...) as the call `what` (check_idle refuses calls until it returns).
function Stepper:exclusive(what, f, ...)
  self:check_idle(what)
  self.running = what
  local r = { pcall(f, ...) }
  self.running = nil
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, table.maxn(r))
end

function Stepper:group_specs() return self.groups end
function Stepper:state_table() return self.state end
function Stepper:state_of(p) return self.state[p] end
function Stepper:stats() return self.counters end
function Stepper:mesh() return self.dmesh end
function Stepper:rank() return self.me end
function Stepper:size() return self.W end
function Stepper:step_count(p) return self.pstep[p] or 0 end
function Stepper:control() return self.ctrl end

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

------------------------------------------------------------ agreement

-- Raise on every rank if any rank has an error (a collective on meshes):
-- the error of the lowest failing rank, with its code.
-- With run: the same all-reduce agrees on the groups a non-finite derived
-- value skips (check_derived).
function Stepper:agree_failure(err, run)
  local ng = run and #run.g or 0
  if self.W == 1 then
    if err ~= nil then error(err, 0) end
    for gi = 1, ng do run.g[gi].skip = run.g[gi].skip or run.g[gi].skip_derived == true end
    return
  end
  local W, me = self.W, self.me
  local vec = { err ~= nil and (W - me) or 0 }
  for gi = 1, ng do vec[1 + gi] = run.g[gi].skip_derived and 1 or 0 end
  local r = self.ctrl:allreduce(vec, "max")
  if r[1] ~= 0 then self:_raise_from(W - r[1], err) end
  for gi = 1, ng do run.g[gi].skip = run.g[gi].skip or r[1 + gi] == 1 end
end

-- Collective on a mesh: nil if every rank has the same entries ({ key,
-- value } strings, the same count everywhere), else the same message on
-- every rank naming the first that differs (muon.dist's D.agree_entries on
-- the control communicator).
function Stepper:agree_entries(entries, what)
  if self.W == 1 then return nil end
  return D.agree_entries(self.ctrl, entries, what, #entries)
end

-- The engine's collective calls, each with its tag in the gate.
local OPS = { "step", "save", "load", "reduce_grads", "clip_grad_norm" }
local OP_TAG = {}
for i, op in ipairs(OPS) do OP_TAG[op] = i end

-- The start of every collective call (op: one of OPS), on a mesh one
-- all-reduce of the call's tag and of whether this rank already failed
-- (err: an argument error, raised here on every rank, lowest failing
-- rank's): ranks in different calls (save on one, step on
-- another) fail on every rank naming both calls instead of entering
-- collectives that cannot match. On one process err raises at once.
function Stepper:gate(op, err)
  if self.W == 1 then
    if err ~= nil then error(err, 0) end
    return
  end
  local tag = OP_TAG[op]
  local r = self.ctrl:allreduce({ tag, -tag, err ~= nil and (self.W - self.me) or 0 }, "max")
  if r[1] ~= -r[2] then
    local other = OPS[r[1] ~= tag and r[1] or -r[2]]
    E.raise(E.ESTATE, "%s: the ranks are not in the same call: rank %d called %s while another rank called %s "
      .. "(every rank must make the same collective calls, %s, in the same order); nothing was changed", op, self.me,
      op, other, table.concat(OPS, ", "))
  end
  if r[3] ~= 0 then self:_raise_from(self.W - r[3], err) end
end

-- Raise on every rank the error of rank src (its code and message).
function Stepper:_raise_from(src, err)
  local code = self.ctrl:allreduce({ self.me == src and -(E.code(err) or E.ELUA) or 0 }, "max")[1]
  local msg = self.ctrl:bcast_string(self.me == src and tostring(err) or "", src)
  if not msg:find("^rank %d") then msg = ("rank %d: %s"):format(src, msg) end
  error(E.new(-code, msg), 0)
end

-- The resolved configuration as (key, value) entries: group kinds, names
-- and every option of the kinds' schemas, in canonical text (K.serialize:
-- nested tables with their keys sorted; hooks by presence).
function Stepper:config_entries()
  local entries = {}
  local function add(k, v) entries[#entries + 1] = { k, v } end
  add("mesh", self.dmesh:describe())
  add("balance", self.balance)
  add("max_batch_numel", tostring(self.max_batch_numel or ""))
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

------------------------------------------------------------- the plan

-- Agree on the registrations and config (collective on a mesh) and make
-- the plan; done by the first step, or earlier by whoever needs the plan.
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
      state_dtype = self:state_dtype_of(w.gi, p),
      hooks = g.kind.hook_shapes and g.kind.hook_shapes(g.options, p.logical_shape) or nil }
  end
  return records
end

function Stepper:build()
  local records = self:plan_records()
  if self.W > 1 then
    local problem = D.agree(self.ctrl, records, nil)
    if problem then E.raise(E.EINVAL, problem) end
    problem = D.agree_entries(self.ctrl, self:config_entries(), "configs")
    if problem then E.raise(E.EINVAL, problem) end
  end
  self.plan = D.plan(records, self.dmesh, { rank = self.me, balance = self.balance,
    max_batch_numel = self.max_batch_numel })
  self.rec = {}
  for _, r in ipairs(records) do
    r.hooks_list = r.hooks or {}
    self.rec[r.param] = r
  end
  self.gparams, self.index_of = {}, {}
  for i, p in ipairs(self.order) do self.index_of[p] = i end
  for gi = 1, #self.groups do self.gparams[gi] = {} end
  for _, p in ipairs(self.order) do table.insert(self.gparams[self.where[p].gi], p) end
  self.built = true
end

---------------------------------------------------------------- buffers

-- The update buffer (this rank's box) and spare state buffers of a param.
function Stepper:_scratch(p, r)
  local s = self.scratch[p]
  if s == nil then
    s = { spare = {}, hook = {} }
    self.scratch[p] = s
  end
  if s.u == nil then s.u = T.zeros(r.mine.len, r.dtype) end
  return s
end

-- The owner's buffer for an item's region (kept across steps).
function Stepper:_full(it)
  local b = self.full[it]
  if b == nil then
    b = T.zeros(it.region.len, it.record.dtype)
    self.full[it] = b
  end
  return b
end

-- A reusable (n, a, b) buffer for NS batches: one per (dtype, core shape,
-- slot), grown when a batch needs more slices (ctx:batch_buffer).
function Stepper:_batch_buffer(dtype, n, a, b, slot)
  local key = ("%s:%dx%d#%d"):format(dtype, a, b, slot)
  local buf = self.merged[key]
  if buf == nil or buf:size(1) < n then
    buf = T.zeros({ n, a, b }, dtype)
    self.merged[key] = buf
  end
  if buf:size(1) == n then return buf end
  return buf:narrow(1, 1, n)
end

-- A Newton-Schulz workspace (one per dtype) large enough for a x b
-- (ctx:ns_workspace).
function Stepper:_ns_workspace(dtype, a, b)
  local ws = self.ws[dtype]
  if ws == nil or ws.rows < math.max(a, b) or ws.cols < math.min(a, b) then
    local rows = math.max(a, b, ws and ws.rows or 0)
    local cols = math.max(math.min(a, b), ws and ws.cols or 0)
    ws = { dtype = dtype, rows = rows, cols = cols, handle = ns.workspace(dtype, rows, cols) }
    self.ws[dtype] = ws
  end
  return ws.handle
end

-- Newton-Schulz in place on every job's x ({ x = 2-D or 3-D tensor, r =
-- resolved options }): one scheduler call per dtype (ctx:ns_many).
function Stepper:_ns_many(jobs)
  local by, order = {}, {}
  for _, j in ipairs(jobs) do
    local dt = j.x:dtype()
    local l = by[dt]
    if not l then
      l = { xs = {}, rs = {}, rows = 0, cols = 0, dtype = dt }
      by[dt] = l
      order[#order + 1] = l
    end
    local r, c = j.x:size(j.x:dim() - 1), j.x:size(j.x:dim())
    l.rows, l.cols = math.max(l.rows, r, c), math.max(l.cols, math.min(r, c))
    l.xs[#l.xs + 1], l.rs[#l.rs + 1] = j.x, j.r
  end
  for _, l in ipairs(order) do
    ns.zeropower_many(l.xs, l.xs, l.rs, self:_ns_workspace(l.dtype, l.rows, l.cols))
  end
end

-- The narrow context kinds get (muon.optim.kind): buffers and
-- Newton-Schulz, nothing else of the Stepper.
function kind_context(self)
  local ctx = {}
  function ctx.batch_buffer(_, dtype, n, a, b, slot) return self:_batch_buffer(dtype, n, a, b, slot) end
  function ctx.ns_workspace(_, dtype, a, b) return self:_ns_workspace(dtype, a, b) end
  function ctx.ns_many(_, jobs) return self:_ns_many(jobs) end
  return ctx
end

local function tensor_bytes(t) return t:numel() * (ESIZE[t:dtype()] or 4) end
local ws_bytes = ffi.new("int64_t[1]")

-- { state_bytes, scratch_bytes } held by this rank.
function Stepper:memory()
  local state, scratch = 0, 0
  for _, st in pairs(self.state) do
    for _, v in pairs(st) do if T.is_tensor(v) then state = state + tensor_bytes(v) end end
  end
  for _, s in pairs(self.scratch) do
    if s.u then scratch = scratch + tensor_bytes(s.u) end
    if s.before then scratch = scratch + tensor_bytes(s.before) end -- (post_update_fn's undo)
    if s.post then scratch = scratch + tensor_bytes(s.post.value) end -- (what post_update_fn writes)
    for _, v in pairs(s.spare) do scratch = scratch + tensor_bytes(v) end
    for _, v in pairs(s.hook) do scratch = scratch + tensor_bytes(v) end
  end
  for _, b in pairs(self.full) do scratch = scratch + tensor_bytes(b) end
  for _, b in pairs(self.merged) do scratch = scratch + tensor_bytes(b) end
  for _, ws in pairs(self.ws) do
    core.check(core.C.mu_ns_workspace_bytes(ws.handle, ws_bytes), "ns workspace bytes")
    scratch = scratch + tonumber(ws_bytes[0])
  end
  scratch = scratch + self.router:scratch_bytes()
  return { state_bytes = state, scratch_bytes = scratch }
end

------------------------------------------------------------- the phases

-- Values the trainer passes to hooks (ctx.signals[name]), kept until set
-- again; on a mesh they are part of the step's agreed values.
function Stepper:set_signal(name, values)
  self:check_idle("set_signal")
  local copy = {}
  for i, v in ipairs(values) do copy[i] = v end
  self.signals[name] = copy
end

local function signals_copy(signals)
  local out = {}
  for k, list in pairs(signals) do
    local c = {}
    for i, v in ipairs(list) do c[i] = v end
    out[k] = c
  end
  return out
end

-- Phase 1-2 (local): this step's values and stepping parameters per group.
-- pre_err: an error the caller met preparing the values (it fails the step
-- like any other, on every rank).
local function check_phase(self, values, pre_err)
  if pre_err ~= nil then error(pre_err, 0) end
  local run = { g = {}, stepping = {}, empty_nograd = {}, signals = signals_copy(self.signals) }
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
    for _, p in ipairs(self.gparams[gi]) do
      local g = p.grad
      if g ~= nil then
        P.check(p.name, p.value, g) -- a grad set after add_param: dtype, shape
        if G.kind.check_param then G.kind.check_param(p, hp) end
        params[#params + 1] = p
        run.stepping[self.rec[p]] = true
        if g:numel() > 0 then
          grads[#grads + 1] = g
          owners[#owners + 1] = p
        end
      elseif self.W > 1 and self.rec[p].mine_n == 0 then
        -- an empty local shard needs no gradient buffer: it steps when the
        -- ranks holding the parameter's elements have grads (_agree_check)
        run.empty_nograd[self.rec[p]] = true
      end
    end
    local skip = false
    local bad = U.first_nonfinite(grads)
    if bad then
      if opts.nonfinite == "skip" then skip = true
      else E.raise(E.ENONFINITE, "parameter '%s': gradient holds NaN or Inf (%s)", owners[bad].name, G.label) end
    end
    run.g[gi] = { hp = hp, over = over, params = params, skip = skip }
  end
  return run
end

-- On a mesh: one all-reduce agrees on failures, skipped groups (a NaN/Inf
-- gradient anywhere skips the group everywhere), the stepping set and the
-- step's values; a difference fails on every rank naming it.
function Stepper:_agree_check(run, err)
  local W, me = self.W, self.me
  local ng = #self.groups
  local vec = { err ~= nil and (W - me) or 0 }
  for gi = 1, ng do vec[1 + gi] = run and run.g[gi].skip and 1 or 0 end
  local stepping, values = {}, {}
  if run then
    for i, p in ipairs(self.order) do
      stepping[i] = { "parameter '" .. p.name .. "'", run.stepping[self.rec[p]] and "has a grad" or "has no grad" }
    end
    for gi, G in ipairs(self.groups) do
      local hp = run.g[gi].hp
      for _, k in ipairs(G.kind.SCHEDULE_ORDER) do
        values[#values + 1] = { G.label .. "." .. k, K.serialize(hp[k]) }
      end
    end
    local names = {}
    for k in pairs(run.signals) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do values[#values + 1] = { "signal " .. k, K.serialize(run.signals[k]) } end
  end
  local function hash_all(list)
    local parts = {}
    for i, e in ipairs(list) do parts[i] = e[1] .. "=" .. e[2] end
    return D.hash(table.concat(parts, "\n"))
  end
  local hs, hv = run and hash_all(stepping) or 0, run and hash_all(values) or 0
  local empty = run and next(run.empty_nograd) ~= nil and 1 or 0
  vec[#vec + 1], vec[#vec + 2], vec[#vec + 3], vec[#vec + 4], vec[#vec + 5] = hs, -hs, hv, -hv, empty
  local r = self.ctrl:allreduce(vec, "max")
  if r[1] > 0 then self:_raise_from(W - r[1], err) end
  if r[ng + 6] == 1 then
    self:_agree_empty_shards(run)
  elseif r[ng + 2] ~= -r[ng + 3] then
    local msg = D.agree_entries(self.ctrl, stepping, "gradients", #stepping)
    E.raise(E.EINVAL, msg or "gradients differ across ranks")
  end
  if r[ng + 4] ~= -r[ng + 5] then
    local msg = D.agree_entries(self.ctrl, values, "scheduled values")
    E.raise(E.EINVAL, msg or "scheduled values differ across ranks")
  end
  for gi = 1, ng do run.g[gi].skip = r[1 + gi] == 1 end
end

-- Some rank holds an empty shard of a parameter and passed no grad for it
-- (the C API's NULL): one more all-reduce, per parameter, of whether any
-- rank has a grad and whether every rank holding elements has one. The
-- empty shards step with their parameter; a grad on only some of the
-- holding ranks fails on every rank, naming the parameters.
function Stepper:_agree_empty_shards(run)
  local n = #self.order
  local vec = {}
  for i, p in ipairs(self.order) do
    local rec = self.rec[p]
    vec[i] = run.stepping[rec] and 1 or 0
    vec[n + i] = -((run.stepping[rec] or run.empty_nograd[rec]) and 1 or 0)
  end
  local r = self.ctrl:allreduce(vec, "max")
  local differ = {}
  for i, p in ipairs(self.order) do
    local rec = self.rec[p]
    if r[i] == 1 and r[n + i] == 0 then differ[#differ + 1] = "'" .. p.name .. "'" end
    if r[i] == 1 and run.empty_nograd[rec] then run.stepping[rec] = true end
  end
  if #differ > 0 then
    E.raise(E.EINVAL, "gradients differ across ranks: parameter(s) %s have a grad on some ranks and none on others "
      .. "(only a rank whose shard is empty may pass none)", table.concat(differ, ", "))
  end
  for gi = 1, #self.groups do
    local params = {}
    for _, p in ipairs(self.gparams[gi]) do
      if run.stepping[self.rec[p]] then params[#params + 1] = p end
    end
    run.g[gi].params = params
  end
end
-- A finite gradient can still overflow what is derived from it: checked
-- like the gradient, naming the parameter (the NS input here, the state the
-- update does not show, kind.hidden_state_keys; the update in phase 5).
-- Under nonfinite = "skip" the group skips the step as for a NaN/Inf
-- gradient (on a mesh agreed with the failure flag) and its NS inputs are
-- zeroed so that routing and Newton-Schulz stay finite.
local function check_derived(run, G, gr, entries)
  local list, owner = {}, {}
  for _, e in ipairs(entries) do
    if G.kind.ns then list[#list + 1] = e.u end
    for _, k in ipairs(G.kind.hidden_state_keys) do list[#list + 1] = e.new[k] end
    for _ = #owner + 1, #list do owner[#owner + 1] = e.p end
  end
  local bad = U.first_nonfinite(list)
  if not bad then return end
  if G.options.nonfinite ~= "skip" then
    E.raise(E.ENONFINITE, "parameter '%s': its gradient is finite but the %s overflowed to NaN or Inf (%s)",
      owner[bad].name, G.kind.ns and "momentum (the Newton-Schulz input)" or table.concat(G.kind.hidden_state_keys, ", "),
      G.label)
  end
  gr.skip_derived = true
  if run.W == 1 then gr.skip = true end
  for _, e in ipairs(entries) do e.u:zero() end
end

-- Phase 3: each state holder's direction into scratch. The entry table of
-- a parameter is kept across steps (no per-step allocation).
local function direction_phase(self, run)
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    local entries, empties = {}, {}
    gr.entries, gr.empties = entries, empties
    if not gr.skip then
      local keys = G.kind.state_keys
      for _, p in ipairs(gr.params) do
        local r = self.rec[p]
        if r.mine_n == 0 and self.W == 1 then
          -- an empty parameter: nothing to compute, but it has state from
          -- its first step on, as any other (zero elements; hook state has
          -- its own shape). (On a mesh no rank holds an empty box's state.)
          local st, new = self.state[p], nil
          if st == nil then
            new = {}
            for _, k in ipairs(keys) do new[k] = T.zeros(r.mine.len, r.state_dtype) end
            for _, h in ipairs(r.hooks_list) do new[h.key] = T.zeros(h.shape, r.dtype) end
          end
          empties[#empties + 1] = { p = p, new = new, count = (self.pstep[p] or 0) + 1, was = st and st.step }
        elseif r.mine_n > 0 then
          local sc = self:_scratch(p, r)
          if r.holds then
            local st = self.state[p]
            local e = sc.entry
            if e == nil then
              e = { p = p, old = {}, new = {} }
              sc.entry = e
            end
            e.grad, e.u, e.count = p.grad, sc.u, (self.pstep[p] or 0) + 1
            e.work = e.work or {}
            -- the kind's state, then hook state (over its own boxes)
            local nk = #keys
            for i = 1, nk + #r.hooks_list do
              local k = i <= nk and keys[i] or r.hooks_list[i - nk].key
              local shape = i <= nk and r.mine.len or r.hook_records[k].mine.len
              local dt = i <= nk and r.state_dtype or r.dtype
              local spare = sc.spare[k]
              if spare == nil then
                spare = T.zeros(shape, dt)
                sc.spare[k] = spare
              end
              if st then
                e.old[k], e.new[k] = st[k], spare
              else -- first step: zeros in, a fresh buffer out (becomes the state)
                e.old[k], e.new[k] = spare:zero(), T.zeros(shape, dt)
              end
              -- hooks see hook state in buffers of their own, never the
              -- state nor what becomes it (copied in at finish_phase)
              if i > nk and sc.hook[k] == nil then sc.hook[k] = T.zeros(shape, dt) end
            end
            entries[#entries + 1] = e
          end
        end
      end
      if #entries > 0 then
        attempt(run, G.kind.direction, self.ctx, G.options, gr.hp, entries)
        attempt(run, check_derived, run, G, gr, entries)
      end
    end
  end
end

-- Whether a batch's items run where they are, in place (no routing): the
-- same on every rank (the plan's flags: nothing moves in or out, so every
-- item's owner is its only source and holds its whole region).
local function local_batch(batch)
  return not batch.moves_in and not batch.moves_out
end

-- Newton-Schulz of the local batches (nothing to route) in one scheduler
-- call: every batch's kind.ns_prepare, one ns_many over all their jobs,
-- then every kind.ns_finish. Groups whose hooks need the general path
-- (ns_prepare returns nil) run kind.orthogonalize on their own, batch by
-- batch. The results are those of one call per batch (each matrix's bits
-- depend on it alone). On one process every batch is local.
local function prepare_batch(self, G, hp, list, jobs, pending)
  local done = G.kind.ns_prepare and G.kind.ns_prepare(self.ctx, G.options, hp, list, jobs)
  if done then pending[#pending + 1] = { G = G, hp = hp, list = list, done = done }
  else G.kind.orthogonalize(self.ctx, G.options, hp, list) end
end

local function compute_local(self, run, batches)
  local io = self.io
  local jobs, pending = {}, {}
  for _, b in ipairs(batches) do
    local G = self.groups[b.gi]
    local owned = {}
    for _, it in ipairs(b.items) do
      if it.owner == self.me then
        local state
        for _, a in ipairs(it.attached or {}) do
          local dst, src = io.dest(a.record), io.source(a.record)
          if dst ~= src then dst:copy(src) end
          state = state or {}
          state[a.record.key] = dst
        end
        local dst, src = io.dest(it.record), io.source(it.record)
        if dst ~= src then dst:copy(src) end
        owned[#owned + 1] = { item = it, input = dst, state = state }
      end
    end
    if #owned > 0 then attempt(run, prepare_batch, self, G, run.g[b.gi].hp, io.items(owned), jobs, pending) end
  end
  if #jobs > 0 then attempt(run, self._ns_many, self, jobs) end
  for _, p in ipairs(pending) do attempt(run, p.G.kind.ns_finish, self.ctx, p.G.options, p.hp, p.list, p.done) end
end

-- Phase 4: per batch, route NS inputs to owners, orthogonalize, route back;
-- the batches with nothing to route first, all together (compute_local).
-- (self.io: the router's view of this stepper's buffers, made once.) On a
-- mesh the router overlaps the exchanges with the owners' work.
local function route_phase(self, run)
  local io = self.io
  io.run = run
  local locals, routed = {}, {}
  for _, batch in ipairs(self.plan.batches) do
    local gi = batch.group
    local gr, G = run.g[gi], self.groups[gi]
    -- Items that neither move nor run Newton-Schulz need no routing.
    if not gr.skip and (G.kind.ns or batch.moves_in or batch.moves_out) then
      local recs, items = {}, {}
      for _, r in ipairs(batch.records) do
        if run.stepping[r] then
          recs[#recs + 1] = r
          for _, it in ipairs(r.items) do items[#items + 1] = it end
          if r.mine_n > 0 then self:_scratch(r.param, r) end
        end
      end
      if #recs == #batch.records then recs, items = batch.records, batch.items end -- stable lists (the router caches by them)
      if #recs > 0 then
        if G.kind.ns and local_batch(batch) then
          locals[#locals + 1] = { batch = batch, gi = gi, items = items }
        else
          routed[#routed + 1] = { records = recs, items = items, dtypes = batch.dtypes, moves_in = batch.moves_in,
            moves_out = batch.moves_out, group = gi }
        end
      end
    end
  end
  if #locals > 0 then compute_local(self, run, locals) end
  -- (on one process every batch is local: nothing is routed)
  if #routed > 0 then self.router:run_batches(routed, io) end
end

-- The router's callbacks (see muon.router).
function make_io(self)
  local io = {}
  -- A parameter's NS input goes out and its update comes back in one
  -- buffer; a hook state's current value goes out, its next comes back.
  function io.source(r)
    if r.parent then return self.scratch[r.parent.param].entry.old[r.key] end
    return self.scratch[r.param].u
  end
  function io.dest(r)
    if r.parent then return self.scratch[r.parent.param].hook[r.key] end
    return self.scratch[r.param].u
  end
  function io.buffer(it) return self:_full(it) end
  -- The kind's items of owned work: { name, input, state, shape, signals, region }.
  function io.items(owned)
    local list = {}
    for i, o in ipairs(owned) do
      local r = o.item.record
      local state
      if o.state then
        state = {}
        for _, h in ipairs(r.hooks_list) do state[h.name] = o.state[h.key] end
      end
      list[i] = { name = r.name, input = o.input, state = state, shape = r.shape, signals = io.run.signals,
        region = o.item.region }
    end
    return list
  end
  function io.compute(owned, job)
    local G = self.groups[job.group]
    if not G.kind.ns or #owned == 0 then return end
    attempt(io.run, G.kind.orthogonalize, self.ctx, G.options, io.run.g[job.group].hp, io.items(owned))
  end
  return io
end

local function finite(x) return type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge end

-- Whether a hook of the group writes the kind's state (then the update
-- does not show it: it is checked on its own).
local function hook_writes_state(G)
  for _, h in ipairs(G.kind.HOOKS) do
    if K.HOOK_NAMES[h].writes_state and G.options[h] ~= nil then return true end
  end
  return false
end

-- A non-finite tensor the commit would write: under nonfinite = "skip" the
-- group skips the step (on a mesh agreed with the failure flag), else the
-- step fails naming the parameter and the tensor.
local function nonfinite(G, gr, fmt, ...)
  if G.options.nonfinite == "skip" then
    gr.skip_derived = true
    return
  end
  E.raise(E.ENONFINITE, fmt, ...)
end

-- Phase 5, the state the commit swaps in: the hooks' hook state is copied
-- into it; then every state tensor the update does not show is checked
-- (hook state; the kind's state where a hook wrote it; the hidden state
-- was checked by check_derived).
local function check_state(self, G, gr)
  local list, owner, key = {}, {}, {}
  local kind_keys = {}
  if hook_writes_state(G) then
    local hidden = {}
    for _, k in ipairs(G.kind.hidden_state_keys) do hidden[k] = true end
    for _, k in ipairs(G.kind.state_keys) do
      if not hidden[k] then kind_keys[#kind_keys + 1] = k end
    end
  end
  for _, e in ipairs(gr.entries) do
    local hooks, sc = self.rec[e.p].hooks_list, self.scratch[e.p]
    for _, k in ipairs(kind_keys) do
      list[#list + 1], owner[#list + 1], key[#list + 1] = e.new[k], e.p, k
    end
    for _, h in ipairs(hooks) do
      e.new[h.key]:copy(sc.hook[h.key])
      list[#list + 1], owner[#list + 1], key[#list + 1] = e.new[h.key], e.p, h.key
    end
  end
  local bad = U.first_nonfinite(list)
  if bad then
    local k = key[bad]
    local hook = k:match("^hook%.(.*)$")
    nonfinite(G, gr, "parameter '%s': %s would hold NaN or Inf after the step (%s); nothing was changed",
      owner[bad].name, hook and ("hook state '" .. hook .. "' (pre_ortho_fn / post_ortho_fn)")
        or ("state tensor '" .. k .. "' (written by a hook)"), G.label)
  end
end

-- Phase 5 (local): updates are finite; the state the commit swaps in and
-- the parameters it writes are finite; the apply lists for the commit.
local function finish_phase(self, run)
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    gr.applies = {}
    if not gr.skip then
      check_state(self, G, gr)
      local values, updates, names = {}, {}, {}
      for _, p in ipairs(gr.params) do
        local r = self.rec[p]
        if r.mine_n > 0 then
          local n = #values + 1
          values[n], updates[n], names[n] = p.value, self.scratch[p].u, p.name
        end
      end
      local decay, alpha, cautious = G.kind.apply_coeffs(G.options, gr.hp)
      if not (finite(decay) and finite(alpha)) then
        E.raise(E.EINVAL, "%s: the step's decay (%s) or alpha (%s) is not finite", G.label, tostring(decay), tostring(alpha))
      end
      for i, v in ipairs(values) do
        if not v:is_contiguous() then
          E.raise(E.EINVAL, "parameter '%s': value is not contiguous", names[i])
        end
      end
      -- One read of the parameters and updates: the values the commit
      -- writes, computed without writing them. A NaN/Inf update makes its
      -- result NaN/Inf too (alpha * u with alpha finite, 0 * Inf = NaN), so
      -- this is also the updates' check; which one it was is looked up only
      -- on a failure.
      for _, part in ipairs(U.split_dtype(values, updates)) do
        gr.applies[#gr.applies + 1] = { part[1], part[2], decay, alpha, cautious }
        if not gr.skip_derived then
          local ok, i = foreach.apply_finite(part[1], part[2], nil, decay, alpha, cautious)
          if not ok then
            local name
            for n, v in ipairs(values) do if v == part[1][i] then name = names[n] end end
            if not part[2][i]:all_finite() then
              nonfinite(G, gr, "parameter '%s': update holds NaN or Inf (%s)", name, G.label)
            else
              nonfinite(G, gr, "parameter '%s': the step would leave NaN or Inf in the parameter (value * %.17g + "
                .. "%.17g * update overflows, or the value holds NaN or Inf) (%s); nothing was changed",
                name, decay, alpha, G.label)
            end
          end
        end
      end
    end
  end
end

local function apply_group(gr)
  for _, a in ipairs(gr.applies) do
    if a[5] then foreach.apply_cautious(a[1], a[2], nil, a[3], a[4])
    else foreach.apply(a[1], a[2], nil, a[3], a[4]) end
  end
end

-- Phase 6: nothing below raises (everything was checked above). The
-- parameters of the groups in held are left for apply_held (after the
-- post_update_fn calls).
local function commit_phase(self, run, held)
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
        local p = e.p
        local st = self.state[p]
        if st == nil then
          st = {}
          self.state[p] = st
          for k, t in pairs(e.new) do st[k] = t end
        else
          local spare = self.scratch[p].spare
          for k, t in pairs(e.new) do
            spare[k] = st[k]
            st[k] = t
          end
        end
        if G.kind.counts_steps then st.step = e.count end
      end
      for _, e in ipairs(gr.empties) do
        if e.new then self.state[e.p] = e.new end
        if G.kind.counts_steps then self.state[e.p].step = e.count end
      end
      if not held[gi] then apply_group(gr) end
    end
  end
  for _, ks in ipairs(self.kind_stats) do ks.steps = ks.steps + 1 end
  self.counters.steps = self.counters.steps + 1
end

local function runs_post(G, gr)
  return not gr.skip and G.kind.post_update ~= nil and G.options.post_update_fn ~= nil
end

-- What the commit and post_update_fn change, kept when a group runs
-- post_update_fn (nil otherwise): the values of such groups' parameters on
-- this rank (copies into buffers kept across steps), every group's
-- options, the step counts and the state tables as they were. The other
-- groups' parameters are not written before the post_update_fn calls have
-- passed on every rank (j.held: commit_phase leaves them to apply_held).
local function journal(self, run)
  local held, any = {}, false
  for gi, G in ipairs(self.groups) do
    if runs_post(G, run.g[gi]) then any = true else held[gi] = true end
  end
  if not any then return nil, {} end
  local j = { options = {}, pstep = {}, state = {}, values = {}, kinds = {}, held = held,
    steps = self.counters.steps, skipped = self.counters.skipped_nonfinite }
  for p, n in pairs(self.pstep) do j.pstep[p] = n end
  for name, ks in pairs(self.counters.kinds) do j.kinds[name] = { ks.steps, ks.skipped_nonfinite } end
  for gi, G in ipairs(self.groups) do
    local o = {}
    for k, v in pairs(G.options) do o[k] = v end
    j.options[gi] = o
    local gr = run.g[gi]
    if not gr.skip then
      for _, e in ipairs(gr.entries) do
        local st = self.state[e.p]
        local was = false
        if st then
          was = {}
          for k, v in pairs(st) do was[k] = v end
        end
        j.state[e] = was
      end
      if not held[gi] then
        for _, p in ipairs(self:params(gi)) do
          local sc = self.scratch[p] or { spare = {}, hook = {} }
          self.scratch[p] = sc
          if sc.before == nil then sc.before = T.zeros(p.value:size(), p.value:dtype()) end
          sc.before:copy(p.value)
          j.values[p] = sc.before
        end
      end
    end
  end
  return j, held
end

-- Undo commit_phase (and what post_update_fn wrote to the parameters).
-- A committed group's state tables as the journal found them.
local function undo_state(self, gr, j)
  for _, e in ipairs(gr.entries) do
    local was = j.state[e]
    if was == false then
      self.state[e.p] = nil -- (its first step: the fresh buffers go)
    else
      local st, spare = self.state[e.p], self.scratch[e.p].spare
      for k, t in pairs(e.new) do spare[k] = t end -- (back where the step found them)
      for k in pairs(st) do st[k] = nil end
      for k, v in pairs(was) do st[k] = v end
    end
  end
  for _, e in ipairs(gr.empties) do
    if e.new then self.state[e.p] = nil else self.state[e.p].step = e.was end
  end
end

-- One group whose post_update_fn left NaN/Inf under nonfinite = "skip":
-- its parameters, state and step counts as before the step, counted as
-- skipped (its options keep the step's values, as for any skipped group).
local function skip_after_post(self, gi, gr, j)
  for _, p in ipairs(self:params(gi)) do
    if j.values[p] then p.value:copy(j.values[p]) end
  end
  undo_state(self, gr, j)
  for _, p in ipairs(gr.params) do self.pstep[p] = j.pstep[p] end
  local ks = self.counters.kinds[self.groups[gi].kind.name]
  ks.skipped_nonfinite = ks.skipped_nonfinite + 1
  self.counters.skipped_nonfinite = self.counters.skipped_nonfinite + 1
end

local function undo_commit(self, run, j)
  for p, before in pairs(j.values) do p.value:copy(before) end
  for gi, G in ipairs(self.groups) do
    local opts, o = G.options, j.options[gi]
    for k in pairs(opts) do if o[k] == nil then opts[k] = nil end end
    for k, v in pairs(o) do opts[k] = v end
    local gr = run.g[gi]
    if not gr.skip then undo_state(self, gr, j) end
  end
  for k in pairs(self.pstep) do self.pstep[k] = nil end
  for p, n in pairs(j.pstep) do self.pstep[p] = n end
  for name, ks in pairs(self.counters.kinds) do ks.steps, ks.skipped_nonfinite = j.kinds[name][1], j.kinds[name][2] end
  self.counters.steps, self.counters.skipped_nonfinite = j.steps, j.skipped
end

-- What post_update_fn runs on: for each parameter a stand-in (its name,
-- logical_shape and grad) whose value is a copy of the committed value,
-- in a buffer kept across steps; the step copies it back after the hook.
-- A hook that keeps the stand-in or a view of it thus cannot write the
-- parameter outside its own call (a later, failing step among them).
local function post_copies(self, params)
  local copies = {}
  for i, p in ipairs(params) do
    local sc = self.scratch[p] or { spare = {}, hook = {} }
    self.scratch[p] = sc
    if sc.post == nil then
      sc.post = setmetatable({ value = T.zeros(p.value:size(), p.value:dtype()) }, { __index = p })
    end
    sc.post.value:copy(p.value)
    copies[i] = sc.post
  end
  return copies
end

-- One step (collective on a mesh). values[gi]: this step's scheduled
-- values for group gi (they become the group's values when it commits);
-- pre_err: see check_phase. Returns true, or false when no parameter has a
-- grad (then nothing changed: parameters, state, step counts).
local step_body

function Stepper:step(values, pre_err) return self:exclusive("step", step_body, self, values, pre_err) end

function step_body(self, values, pre_err)
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
    self:_agree_check(run, not ok and r or nil)
  end
  -- Nothing to step (no parameter has a grad): no change at all, not even
  -- the step counts (torch skips such parameters). On a mesh the stepping
  -- set was agreed above, so every rank returns here together.
  warn_nil_grads(self, run)
  if next(run.stepping) == nil then return false end
  -- Phases 3-5: on one process the first error raises; on a mesh it is
  -- kept and the collectives still run, so no rank waits for another.
  run.W = W
  attempt(run, direction_phase, self, run)
  -- (the router's own code does not fail on one rank only: its inputs are
  -- the plan, the same everywhere; the owners' work goes through attempt)
  if W == 1 then route_phase(self, run)
  else
    local ok, e = pcall(route_phase, self, run)
    if not ok and run.failure == nil then run.failure = e end
  end
  attempt(run, finish_phase, self, run)
  self:agree_failure(run.failure, run)
  local undo, held = journal(self, run)
  commit_phase(self, run, held)
  local post_failure
  -- groups whose post_update_fn left NaN/Inf under "skip" (agreed with
  -- the failure flag below)
  local post_skip = { g = {} }
  for gi = 1, #self.groups do post_skip.g[gi] = {} end
  local sess
  if W > 1 and post_reductions(self, run) then
    self.post_session = self.post_session or Rd.session(self.ctrl)
    sess = self.post_session:reset()
  end
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    if runs_post(G, gr) and post_failure == nil and #gr.params > 0 then -- (boxes only for a hook that runs)
      local boxes, reducers = {}, sess and {}
      for i, p in ipairs(gr.params) do
        local r = self.rec[p]
        local b = r.mine
        local start = {}
        for d = 1, #b.start do start[d] = b.start[d] + 1 end
        boxes[i] = { start = start, len = b.len }
        if sess then reducers[i] = sess:reducer("post_update_fn", self.index_of[p], p.name, b.len, r.holds) end
      end
      local ok, e = pcall(G.kind.post_update, G.options, gr.hp, post_copies(self, gr.params), boxes, run.signals,
        reducers)
      if not ok then post_failure = e end
      if post_failure == nil and runs_post(G, gr) then
        -- what it left in the parameters is committed: finite (it ran
        -- after the commit: "error" undoes the step, "skip" the group's)
        local written = {}
        for i, p in ipairs(gr.params) do
          p.value:copy(self.scratch[p].post.value)
          written[i] = p.value
        end
        local bad = U.first_nonfinite(written)
        if bad and G.options.nonfinite == "skip" then
          post_skip.g[gi].skip_derived = true
        elseif bad then
          post_failure = E.new(E.ENONFINITE, ("parameter '%s': post_update_fn left NaN or Inf in the parameter (%s); "
            .. "the step was undone"):format(gr.params[bad].name, G.label))
        end
      end
    end
  end
  if sess then
    local ok, e = pcall(sess.finish, sess, post_failure ~= nil)
    if not ok and post_failure == nil then post_failure = e end
  end
  local ok, e = pcall(self.agree_failure, self, post_failure, post_skip)
  if not ok then
    if undo then undo_commit(self, run, undo) end
    error(e, 0)
  end
  for gi, pg in ipairs(post_skip.g) do
    if pg.skip then skip_after_post(self, gi, run.g[gi], undo) end
  end
  for gi in pairs(held) do apply_group(run.g[gi]) end
  return true
end

-- A parameter without a grad for the first nil_grad_warning steps since it
-- was registered (never stepped) gets one warning naming it (rank 0 prints
-- it; the stepping set is agreed).
function warn_nil_grads(self, run)
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

-- Whether a group of this step runs a post-update hook that may reduce
-- across ranks (the same on every rank: the config and the stepping set
-- are agreed).
function post_reductions(self, run)
  for gi, G in ipairs(self.groups) do
    local gr = run.g[gi]
    if G.kind.post_update and not gr.skip and #gr.params > 0 then
      for _, h in ipairs(G.kind.HOOKS) do
        if K.HOOK_NAMES[h].reduces and not K.HOOK_NAMES[h].whole and G.options[h] ~= nil then return true end
      end
    end
  end
  return false
end

function Stepper:build_once()
  if not self.built then self:build() end
end

-- The plan's record of a parameter: its boxes, state holders and items.
function Stepper:record(p)
  self:build_once()
  return self.rec[p]
end

-- Average (op "mean") or sum (op "sum") every registered gradient over
-- the ranks that hold the same box (the replicate axes of its placement),
-- in place, before a step (collective over the mesh). Every replica gets
-- the same bits: each box is cut into as many flat pieces as it has
-- replicas; the replica of class k adds piece k of every replica in rank
-- order (g_0 + g_1 + ... left to right, then / n for "mean") and sends the
-- result back to the others (a reduce-scatter and an all-gather, two
-- all-to-all-v per dtype on the data communicator: comm_stats counts
-- them). A parameter whose grad is missing on some ranks that hold
-- elements of it fails on every rank, naming it and those ranks, before
-- any grad changes. Returns the number of gradients reduced.
-- pre_err: an argument error of this rank's call, raised on every rank.
local reduce_body
function Stepper:reduce_grads(op, pre_err) return self:exclusive("reduce_grads", reduce_body, self, op, pre_err) end

function reduce_body(self, op, pre_err)
  if pre_err == nil and op ~= "mean" and op ~= "sum" then
    pre_err = E.new(E.EINVAL, ("reduce_grads: op must be 'mean' or 'sum', got %s"):format(tostring(op)))
  end
  self:gate("reduce_grads", pre_err)
  self:build_once()
  if self.W == 1 then return 0 end
  local mesh, me = self.dmesh, self.me
  local mc = mesh:coords(me)
  -- Which gradients every holder has (one all-reduce): hi = some holder
  -- has it, lo = every holder has it (ranks with an empty box count as both).
  local recs = {}
  for i, p in ipairs(self.order) do recs[i] = self.rec[p] end
  local n = #recs
  local vec = {}
  for i, r in ipairs(recs) do
    local has = r.param.grad ~= nil and 1 or 0
    local empty = r.mine_n == 0
    vec[i], vec[n + i] = empty and 0 or has, empty and -1 or -has
  end
  local red = self.ctrl:allreduce(vec, "max")
  local bad
  for i = 1, n do
    if red[i] == 1 and -red[n + i] == 0 then bad = i break end
  end
  if bad then
    local flags = {}
    for q = 1, self.W do flags[q] = 0 end
    if recs[bad].mine_n > 0 and recs[bad].param.grad == nil then flags[me + 1] = 1 end
    flags = self.ctrl:allreduce(flags, "max")
    local ranks = {}
    for q = 1, self.W do if flags[q] == 1 then ranks[#ranks + 1] = q - 1 end end
    E.raise(E.EINVAL, "reduce_grads: parameter '%s' has no grad on rank%s %s and a grad on others holding the same box",
      recs[bad].name, #ranks == 1 and "" or "s", table.concat(ranks, ", "))
  end
  -- The pieces, per dtype, in registration order (the same on every rank).
  local todo, dtypes, seen = {}, {}, {}
  for i, r in ipairs(recs) do
    if red[i] == 1 and r.nrep > 1 and r.mine_n > 0 then
      local g = r.param.grad
      local flat = g:is_contiguous() and g:view({ r.mine_n }) or g:contiguous():view({ r.mine_n })
      local k = D.class_of(r, mesh, mc)
      local peers, cc = {}, {}
      for a = 1, #mc do cc[a] = mc[a] end
      for c = 0, r.nrep - 1 do
        D.set_class(r, mesh, c, cc)
        peers[c] = mesh:rank_of(cc)
      end
      local rs, rl = D.chunk(r.mine_n, r.nrep, k)
      self.rg_bufs = self.rg_bufs or setmetatable({}, { __mode = "k" })
      local buf = self.rg_bufs[r]
      if buf == nil or buf:size(1) ~= r.nrep or buf:size(2) ~= math.max(rl, 1) or buf:dtype() ~= g:dtype() then
        buf = T.zeros({ r.nrep, math.max(rl, 1) }, g:dtype())
        self.rg_bufs[r] = buf
      end
      todo[#todo + 1] = { r = r, g = g, flat = flat, k = k, peers = peers, rs = rs, rl = rl, buf = buf }
      local dt = g:dtype()
      if not seen[dt] then
        seen[dt] = true
        dtypes[#dtypes + 1] = dt
      end
    end
  end
  table.sort(dtypes)
  local W = self.W
  local function lists()
    local s, r = {}, {}
    for q = 1, W do s[q], r[q] = {}, {} end
    return s, r
  end
  for _, dt in ipairs(dtypes) do
    -- Reduce-scatter: piece c of this box to the replica of class c.
    local sends, recvs = lists()
    for _, t in ipairs(todo) do
      if t.g:dtype() == dt then
        for c = 0, t.r.nrep - 1 do
          local s, l = D.chunk(t.r.mine_n, t.r.nrep, c)
          if c ~= t.k and l > 0 then
            table.insert(sends[t.peers[c] + 1], { n = l, src = t.flat:narrow(1, s + 1, l) })
          end
          if c ~= t.k and t.rl > 0 then
            table.insert(recvs[t.peers[c] + 1], { n = t.rl, dst = t.buf:select(1, c + 1):narrow(1, 1, t.rl) })
          end
        end
      end
    end
    self.router:exchange(dt, sends, recvs)
    -- Sum in rank order (classes are in rank order), then the all-gather.
    sends, recvs = lists()
    for _, t in ipairs(todo) do
      if t.g:dtype() == dt then
        if t.rl > 0 then
          local mine = t.flat:narrow(1, t.rs + 1, t.rl)
          local function piece(c) return c == t.k and mine or t.buf:select(1, c + 1):narrow(1, 1, t.rl) end
          local sum = t.buf:select(1, t.k + 1):narrow(1, 1, t.rl) -- (row k receives nothing)
          sum:copy(piece(0))
          for c = 1, t.r.nrep - 1 do sum:add_(piece(c)) end
          if op == "mean" then sum:div_(t.r.nrep) end
          mine:copy(sum)
        end
        for c = 0, t.r.nrep - 1 do
          local s, l = D.chunk(t.r.mine_n, t.r.nrep, c)
          if c ~= t.k and t.rl > 0 then
            table.insert(sends[t.peers[c] + 1], { n = t.rl, src = t.flat:narrow(1, t.rs + 1, t.rl) })
          end
          if c ~= t.k and l > 0 then
            table.insert(recvs[t.peers[c] + 1], { n = l, dst = t.flat:narrow(1, s + 1, l) })
          end
        end
      end
    end
    self.router:exchange(dt, sends, recvs)
    for _, t in ipairs(todo) do
      if t.g:dtype() == dt and not t.g:is_contiguous() then t.g:copy(t.flat:view(t.g:size())) end
    end
  end
  return #todo
end

-- XXH64 of a tensor's bytes, folded to 48 bits (exact in a double).
local u64 = require("ffi").typeof("uint64_t[1]")
local tarr = require("ffi").typeof("mu_tensor *[1]")
local function hash48(t)
  local out, arr = u64(), tarr()
  arr[0] = t
  core.check(core.C.mu_st_checksum(1, arr, out), "check_replicas: hash")
  return tonumber(out[0] % 281474976710656ULL)
end

-- Whether every replica of every box holds the same bits of its gradients
-- (what = "grads") or parameter values ("params"); collective. Per set of
-- replicate axes, one all-reduce over the ranks that hold the same boxes
-- (a communicator split once) of two 48-bit hashes per parameter, then one
-- of a flag over every rank; on a difference every rank raises EINVAL
-- naming the first parameter that differs and the ranks of the replica
-- groups where it does.
function Stepper:check_replicas(what)
  self:build_once()
  if self.W == 1 then return end
  local mesh, me = self.dmesh, self.me
  local mc = mesh:coords(me)
  self.rep_comms = self.rep_comms or {}
  local by, order = {}, {}
  for i, p in ipairs(self.order) do
    local r = self.rec[p]
    if r.nrep > 1 then
      local key = table.concat(r.raxes, ",")
      if not by[key] then
        by[key] = { raxes = r.raxes, list = {} }
        order[#order + 1] = key
      end
      table.insert(by[key].list, { i = i, r = r })
    end
  end
  local NONE = 2 ^ 40
  local bad_here = NONE
  for _, key in ipairs(order) do
    local g = by[key]
    local sub = self.rep_comms[key]
    if not sub then
      local isr, color = {}, 0
      for _, a in ipairs(g.raxes) do isr[a] = true end
      for a = 1, #mc do if not isr[a] then color = color * mesh.sizes[a] + mc[a] end end
      sub = self.ctrl:split(color, me)
      self.rep_comms[key] = sub
    end
    local vec, n = {}, #g.list
    for j, e in ipairs(g.list) do
      local t = what == "grads" and e.r.param.grad or e.r.param.value
      local h = (e.r.mine_n > 0 and t ~= nil) and hash48(t) or -1
      vec[j], vec[n + j] = h, -h
    end
    local red = sub:allreduce(vec, "max")
    for j, e in ipairs(g.list) do
      if red[j] ~= -red[n + j] and e.i < bad_here then bad_here = e.i end
    end
  end
  local bad = self.ctrl:allreduce({ bad_here }, "min")[1]
  if bad == NONE then return end
  local flags = {}
  for q = 1, self.W do flags[q] = 0 end
  if bad_here == bad then flags[me + 1] = 1 end
  flags = self.ctrl:allreduce(flags, "max")
  local ranks = {}
  for q = 1, self.W do if flags[q] == 1 then ranks[#ranks + 1] = q - 1 end end
  local p = self.order[bad]
  E.raise(E.EINVAL, "check_replicas: parameter '%s': its %s differ across replicas of the same box (ranks %s)%s",
    p.name, what == "grads" and "gradients" or "values", table.concat(ranks, ", "),
    what == "grads" and "; an HSDP trainer reduces them first: eng:reduce_grads({ op = 'mean' })" or "")
end

function Stepper:comm_stats()
  return { data = commlib.stats(self.data), control = commlib.stats(self.ctrl) }
end

return M
