-- The orthogonalize phase of a step (muon.step, phase 4): per batch of the
-- plan (muon.dist), the Newton-Schulz inputs go to the rank that
-- orthogonalizes them (muon.router), the kind's orthogonalize runs there
-- (reshape_fn / ns_transform_fn / zeropower_fn, pre_ortho_fn, Newton-Schulz,
-- post_ortho_fn, the scale), and every update slice comes back. Batches
-- with nothing to route (every batch on one process) run first, their
-- Newton-Schulz in one scheduler call (kind.ns_prepare, one ns_many,
-- kind.ns_finish); the bits are those of one call per batch. Matrices the
-- plan split over a group of ranks run last (muon.split_phase). Everything is
-- computed into the step's scratch (muon.scratch): the NS input and the
-- update in the parameter's update buffer, hook state in the buffers the
-- hooks see (refreshed here from the state's current value). On a mesh
-- the NS inputs that leave this rank are written by the kinds straight
-- into the router's send buffers (or the owner's region buffer): prepare
-- says where, before the direction phase computes them.
--
--   local NP = require("muon.ns_phase")
--   local np = NP.new({ groups =, scratch =, router =, ctx =, me = })
--   np:prepare(plan, run) -- the step's batches; run.ns_inputs = record -> where its NS input goes (or nil),
--                         -- run.ns_direct = {} (the direction phase marks the records it wrote there)
--   np:run(plan, run)     -- run: the step's (run.g[gi].hp, .skip; run.stepping; run:attempt(f, ...))
local NP = {}
local Phase = {}
Phase.__index = Phase

-- The router's callbacks over the step's scratch (see muon.router). A
-- parameter's NS input goes out and its update comes back in one buffer;
-- a hook state's current value goes out, its next comes back.
local function make_io(self)
  local sc, io = self.scratch, {}
  function io.source(r)
    if r.parent then return sc:of(r.parent.param).entry.old[r.key] end
    return sc:update_of(r.param)
  end
  function io.direct(r) return io.run.ns_direct[r] end
  function io.dest(r)
    if r.parent then return sc:hook_buffer(r.parent.param, r.key) end
    return sc:update_of(r.param)
  end
  function io.buffer(it) return sc:region(it) end
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
    io.run:attempt(G.kind.orthogonalize, self.ctx, G.options, io.run.g[job.group].hp, io.items(owned))
  end
  return io
end

-- opts: groups (the step's: { kind, options, label }), scratch, router,
-- split_phase (muon.split_phase), ctx (muon.kind_context), me (this rank).
function NP.new(opts)
  local self = setmetatable({ groups = opts.groups, scratch = opts.scratch, router = opts.router, ctx = opts.ctx,
    me = opts.me, split_phase = opts.split_phase }, Phase)
  self.io = make_io(self)
  return self
end

-- Whether a batch's items run where they are, in place (no routing): the
-- same on every rank (the plan's flags: nothing moves in or out, so every
-- item's owner is its only source and holds its whole region).
local function local_batch(batch)
  return not batch.moves_in and not batch.moves_out
end

-- A group's ns_prepare on one batch (into jobs and pending), or, when its
-- hooks need the general path (ns_prepare returns nil), its orthogonalize.
local function prepare_batch(self, G, hp, list, jobs, pending)
  local done = G.kind.ns_prepare and G.kind.ns_prepare(self.ctx, G.options, hp, list, jobs)
  if done then pending[#pending + 1] = { G = G, hp = hp, list = list, done = done }
  else G.kind.orthogonalize(self.ctx, G.options, hp, list) end
end

-- The local batches: every batch's ns_prepare, one ns_many over all their
-- jobs, then every ns_finish.
function Phase:_compute_local(run, batches)
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
    if #owned > 0 then run:attempt(prepare_batch, self, G, run.g[b.gi].hp, io.items(owned), jobs, pending) end
  end
  if #jobs > 0 then run:attempt(self.ctx.ns_many, self.ctx, jobs) end
  for _, p in ipairs(pending) do run:attempt(p.G.kind.ns_finish, self.ctx, p.G.options, p.hp, p.list, p.done) end
end

-- The step's batches (after its stepping set and skipped groups are
-- agreed): the local ones and the routed ones, and where the routed NS
-- inputs go out from (run.ns_inputs: the router lays the waves' send
-- buffers out now; nil on one process).
function Phase:prepare(plan, run)
  self.io.run = run
  run.ns_direct = {}
  local locals, routed, splits = {}, {}, {}
  for _, batch in ipairs(plan.batches) do
    local gi = batch.group
    local gr, G = run.g[gi], self.groups[gi]
    -- Items that neither move nor run Newton-Schulz need no routing.
    if not gr.skip and (G.kind.ns or batch.moves_in or batch.moves_out) then
      local recs, items = {}, {}
      for _, r in ipairs(batch.records) do
        if run.stepping[r] then
          recs[#recs + 1] = r
          if r.ns_group then
            if G.kind.ns then splits[#splits + 1] = r end
          else
            for _, it in ipairs(r.items) do items[#items + 1] = it end
          end
          if r.mine_n > 0 then self.scratch:update(r.param, r) end
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
  run.ns_jobs = { locals = locals, routed = routed, splits = splits }
  -- (on one process every batch is local: nothing is routed)
  run.ns_inputs = #routed > 0 and self.router:inputs(routed, self.io) or nil
end

-- The phase: the local batches, then the routed ones (on a mesh the
-- router overlaps the exchanges with the owners' work).
function Phase:run(plan, run)
  if not run.ns_jobs then self:prepare(plan, run) end
  self.io.run = run
  local jobs = run.ns_jobs
  if #jobs.locals > 0 then self:_compute_local(run, jobs.locals) end
  if #jobs.routed > 0 then self.router:run_batches(jobs.routed, self.io) end
  if #jobs.splits > 0 then self.split_phase:run(jobs.splits, self.io, run) end
end

return NP
