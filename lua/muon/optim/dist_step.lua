-- The distributed (HSDP) optimizer step: parameters sharded and replicated
-- over a device mesh, one Newton-Schulz owner per parameter over all ranks.
--
--   local DS = require("muon.optim.dist_step")
--   local ds = DS.new({
--     comm = require("muon.comm").world(),
--     mesh = { {"replicate", 2}, {"shard", 2} },
--     groups = { { optimizer = "muon", lr = 0.02, ... }, { optimizer = "adamw", lr = 3e-3 } },
--     balance = "flops",              -- owner rule cost: "flops" (default) or "numel"
--   })
--   ds:add_param(name, local_value, local_grad_or_nil, { shape = global_shape, placement = {...}, group = 1 })
--   ds:step()                         -- collective; atomic across ranks
--   ds:save(path) / ds:load(path)     -- one file of full tensors, loadable at any world size
--   ds:comm_stats()                   -- { data = {...}, control = {...} }
--
-- The config engine uses it through DS.attach(engine, config.dist): then
-- eng:add_param(name, local_value, local_grad, { "R", "S(1)", shape = global })
-- registers shards, and eng:step/save/load/comm_stats are collective. From C:
-- mu_engine_set_comm (a trainer's MPI_Comm) and mu_engine_add_param_sharded.
--
-- Communicators: "data" carries the NS routing (during a step its counters
-- match the plan's formula, dist.step_elements) and checkpoint gathers;
-- "control" carries the agreement check, failure flags and messages.
--
-- A step: (1) momentum on each local shard (elementwise, the single-process
-- Muon's code); (2) per batch, one all-to-all-v routes each shard's NS input
-- to the parameter's owner, which assembles the full matrix and runs the
-- single-process Muon's orthogonalize (NS + scale, hooks reshape_fn /
-- ns_transform_fn / zeropower_fn on full matrices), and one all-to-all-v
-- returns to every rank exactly the slice it holds; (3) an all-reduce of a
-- failure flag: if any rank failed, every rank raises the message of the
-- lowest failing rank and nobody commits; else (4) decay + apply on local
-- shards, AdamW on local shards, then post_update_fn on local shards with
-- ctx.logical_shape the global shape.
local T = require("muon.tensor")
local P = require("muon.param")
local D = require("muon.dist")
local commlib = require("muon.comm")
local Muon = require("muon.optim.muon")
local AdamW = require("muon.optim.adamw")
local S = require("muon.optim.state")
local st = require("muon.safetensors")

-- Wall clock for the step statistics.
local ffi = require("ffi")
pcall(ffi.cdef, "typedef struct mu__dist_timespec { long tv_sec; long tv_nsec; } mu__dist_timespec;"
  .. "int clock_gettime(int clk, mu__dist_timespec *tp);")
local ts = ffi.new("mu__dist_timespec")
local function now()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + 1e-9 * tonumber(ts.tv_nsec)
end
if not pcall(now) then now = os.clock end -- clock_gettime declared elsewhere with another type

local DS = {}
DS.__index = DS
local Lazy

local NEW_KEYS = { comm = true, mesh = true, groups = true, balance = true, max_batch_numel = true }
local ATTACH_KEYS = { comm = true, mesh = true, balance = true, max_batch_numel = true }

local function strip(msg) return (tostring(msg):gsub("^[^:]*:%d+: ", "")) end

-- Common part of new() and attach(): communicators, mesh, options.
local function base(opts, where)
  -- Not launched by mpirun: a one-process communicator (MPI stays untouched).
  local comm = opts.comm or (commlib.world_size() > 1 and commlib.world() or commlib.self())
  if not commlib.is_comm(comm) then error(where .. ": comm must be a muon.comm communicator", 3) end
  local mesh = opts.mesh
  if mesh == nil then mesh = { { "world", comm:size() } } end
  if not D.is_mesh(mesh) then
    local ok, m = pcall(D.mesh, mesh, comm:size())
    if not ok then error(where .. ": " .. strip(m), 3) end
    mesh = m
  elseif mesh.size ~= comm:size() then
    error(("%s: mesh %s has %d ranks, the communicator %d"):format(where, mesh:describe(), mesh.size, comm:size()), 3)
  end
  local balance = opts.balance or "flops"
  if balance ~= "flops" and balance ~= "numel" then
    error(where .. ": balance must be 'flops' or 'numel', got " .. tostring(balance), 3)
  end
  if opts.max_batch_numel ~= nil and (type(opts.max_batch_numel) ~= "number" or opts.max_batch_numel < 1) then
    error(where .. ": max_batch_numel must be a number >= 1", 3)
  end
  return setmetatable({
    comm = comm,
    rank = comm:rank(),
    -- Separate communicators so the data counters hold only NS routing.
    data = comm:split(0, comm:rank()),
    ctrl = comm:split(0, comm:rank()),
    mesh = mesh,
    groups = {},
    records = {},
    by_name = {},
    balance = balance,
    max_batch_numel = opts.max_batch_numel,
    stats = { steps = 0, ns_seconds = 0, ns_matrices = 0, step_seconds = 0 },
  }, DS)
end

-- Standalone: groups = list of { optimizer = "muon"|"adamw", <options> }.
function DS.new(opts)
  if type(opts) ~= "table" then error("dist_step.new: options must be a table", 2) end
  for k in pairs(opts) do
    if not NEW_KEYS[k] then error("dist_step.new: unknown option '" .. tostring(k) .. "'", 2) end
  end
  if type(opts.groups) ~= "table" or #opts.groups == 0 then
    error("dist_step.new: groups must be a non-empty list of { optimizer = 'muon'|'adamw', <options> }", 2)
  end
  local self = base(opts, "dist_step.new")
  for gi, g in ipairs(opts.groups) do
    local kind = g.optimizer or "muon"
    if kind ~= "muon" and kind ~= "adamw" then
      error(("dist_step.new: groups[%d].optimizer must be 'muon' or 'adamw', got %s"):format(gi, tostring(kind)), 2)
    end
    local o = {}
    for k, v in pairs(g) do if k ~= "optimizer" then o[k] = v end end
    self.groups[gi] = { kind = kind, opts = o, params = {} }
  end
  return self
end

-- Engine-side proxy: becomes a DS on first use (set_comm may come first).
Lazy = {}
Lazy.__index = function(self, k)
  if k == "set_comm" then return Lazy.set_comm end
  local v = DS[k]
  if type(v) ~= "function" then return v end
  return function(obj, ...)
    Lazy.realize(obj)
    return v(obj, ...)
  end
end

function Lazy.realize(self)
  local o = rawget(self, "pending")
  if not o then return end
  local eng = rawget(self, "engine")
  o.comm = rawget(self, "comm_override") or o.comm
  local ok, real = pcall(base, o, "config: dist")
  if not ok then error(strip(real), 0) end
  for k, v in pairs(real) do rawset(self, k, v) end
  rawset(self, "pending", nil)
  rawset(self, "engine", eng)
  setmetatable(self, DS)
end

-- Use this communicator (a muon.comm) instead of the world; only before the
-- first parameter is registered.
function Lazy.set_comm(self, c)
  if not commlib.is_comm(c) then error("set_comm: expected a muon.comm communicator", 2) end
  if not rawget(self, "pending") then
    error("set_comm: the engine already uses its communicator (call it before add_param)", 2)
  end
  rawset(self, "comm_override", c)
end

function DS:set_comm()
  error("set_comm: the engine already uses its communicator (call it before add_param)", 2)
end

-- For the config engine (muon.engine): the config's dist = { mesh = ...,
-- balance =, max_batch_numel = } over the engine's own optimizers and groups.
-- engine.comm (a muon.comm, e.g. from mu_engine_set_comm) wins over the world.
function DS.attach(engine, dcfg)
  if type(dcfg) ~= "table" then error("config: 'dist' must be a table { mesh = {...} }", 0) end
  for k in pairs(dcfg) do
    if not ATTACH_KEYS[k] then error("config: dist: unknown key '" .. tostring(k) .. "' (mesh, balance, max_batch_numel)", 0) end
  end
  -- Check the mesh spec now; communicators are made on first use so that a
  -- host can still hand in its own (set_comm) after opening the engine.
  if dcfg.mesh ~= nil then
    local ok, err = pcall(D.mesh, dcfg.mesh)
    if not ok then error("config: dist: " .. strip(err), 0) end
  end
  if dcfg.balance ~= nil and dcfg.balance ~= "flops" and dcfg.balance ~= "numel" then
    error("config: dist: balance must be 'flops' or 'numel', got " .. tostring(dcfg.balance), 0)
  end
  local o = {}
  for k, v in pairs(dcfg) do o[k] = v end
  return setmetatable({ pending = o, engine = engine }, Lazy)
end

local function shape_str(s) return "{" .. table.concat(s, ",") .. "}" end

-- Split an add_param placement argument into (global shape or nil, per-axis spec).
-- Accepted: nil (replicated), a list of per-axis entries with an optional
-- .shape field, or { shape = {...}, placement = {...} }.
local function split_spec(spec)
  if spec == nil then return nil, nil end
  if type(spec) ~= "table" then error("placement must be a table", 0) end
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

-- Global shape of a parameter whose local shard is value (engine hook).
function DS:logical_shape(name, value, placement)
  local shape, plspec = split_spec(placement)
  if shape ~= nil then return shape end
  local ok, pl = pcall(D.placement, plspec, self.mesh, value:dim())
  if not ok then error(("add_param '%s': %s"):format(name, strip(pl)), 0) end
  if D.is_sharded(pl) then
    local sharded = false
    for a, p in ipairs(pl) do
      if p.kind == "S" and self.mesh.sizes[a] > 1 then sharded = true end
    end
    if sharded then
      error(("add_param '%s': placement %s shards the parameter: give its global shape as placement.shape")
        :format(name, D.placement_string(pl)), 0)
    end
  end
  return value:size()
end

-- The local shard shape of a parameter (global shape + placement spec as
-- add_param takes them) on this rank.
function DS:local_shape_of(name, shape, placement)
  local _, plspec = split_spec(placement)
  local ok, pl = pcall(D.placement, plspec, self.mesh, #shape)
  if not ok then error(("add_param '%s': %s"):format(name, strip(pl)), 0) end
  return D.local_box(shape, pl, self.mesh, self.rank).len
end

-- Record a parameter: p.value/p.grad are this rank's shard; p.logical_shape
-- the global shape. Checks the local shard's size. group: index (standalone)
-- or resolved from the engine at the first step.
function DS:_record(p, shape, plspec, gi, is_muon)
  local name = p.name
  if self.built then error("dist: parameters are fixed after the first step", 0) end
  if self.by_name[name] then error(("add_param: parameter '%s' is registered twice"):format(name), 0) end
  if type(shape) ~= "table" or #shape ~= p.value:dim() then
    error(("add_param '%s': shape must list the global size of each of the value's %d dims"):format(name, p.value:dim()), 0)
  end
  local ok, pl = pcall(D.placement, plspec, self.mesh, #shape)
  if not ok then error(("add_param '%s': %s"):format(name, strip(pl)), 0) end
  local box = D.local_box(shape, pl, self.mesh, self.rank)
  local vs = p.value:size()
  for d = 1, #shape do
    if vs[d] ~= box.len[d] then
      error(("add_param '%s': rank %d holds a local shard of shape %s, but global shape %s with placement %s on mesh %s gives %s")
        :format(name, self.rank, shape_str(vs), shape_str(shape), D.placement_string(pl), self.mesh:describe(), shape_str(box.len)), 0)
    end
  end
  if p.grad ~= nil and not P.same_shape(p.grad, p.value) then
    error(("add_param '%s': grad must be nil or a tensor of the value's shape %s"):format(name, shape_str(vs)), 0)
  end
  if is_muon and #shape < 2 then
    error(("parameter '%s' is %d-D: 1D parameters are not supported in Muon (use AdamW)"):format(name, #shape), 0)
  end
  p.logical_shape = shape
  local r = {
    name = name, shape = shape, placement = pl, group = gi, muon = is_muon,
    has_grad = p.grad ~= nil, dtype = p.value:dtype(), box = box, param = p, index = #self.records + 1,
  }
  self.records[#self.records + 1] = r
  self.by_name[name] = r
  return r
end

-- Engine hook: called by Engine:add_param after routing.
function DS:register(p, placement)
  local shape, plspec = split_spec(placement)
  self:_record(p, shape or p.logical_shape or p.value:size(), plspec, nil, nil)
end

-- Standalone: register this rank's shard of a parameter. spec: { shape =
-- global shape, placement = per mesh axis, group = index (default 1) }.
function DS:add_param(name, value, grad, spec)
  spec = spec or {}
  for k in pairs(spec) do
    if k ~= "shape" and k ~= "placement" and k ~= "group" then
      error(("add_param '%s': unknown key '%s' (shape, placement, group)"):format(tostring(name), tostring(k)), 2)
    end
  end
  if type(name) ~= "string" or name == "" then error("add_param: name must be a non-empty string", 2) end
  if not T.is_tensor(value) then error(("add_param '%s': value must be a tensor"):format(name), 2) end
  if grad ~= nil and not T.is_tensor(grad) then error(("add_param '%s': grad must be nil or a tensor"):format(name), 2) end
  local gi = spec.group or 1
  local g = self.groups[gi]
  if not g then error(("add_param '%s': group %s does not exist"):format(name, tostring(gi)), 2) end
  local p = P.new(name, value, grad)
  local ok, err = pcall(self._record, self, p, spec.shape or value:size(), spec.placement, gi, g.kind == "muon")
  if not ok then error(err, 2) end
  g.params[#g.params + 1] = p
  return p
end

-- Settings every rank must share (part of the agreement check).
function DS:_settings()
  local parts = { self.mesh:describe(), self.balance, tostring(self.max_batch_numel or "") }
  for gi, g in ipairs(self.groups) do parts[#parts + 1] = gi .. "=" .. g.kind end
  return table.concat(parts, " ")
end

-- Raise on every rank if any rank has a message (lowest failing rank wins).
function DS:_sync_failure(msg)
  local W = self.ctrl:size()
  local flag = self.ctrl:allreduce({ msg and (W - self.rank) or 0 }, "max")[1]
  if flag == 0 then return end
  local src = W - flag
  local text = self.ctrl:bcast_string(self.rank == src and tostring(msg) or "", src)
  if W > 1 and not text:find("^rank %d") then text = ("rank %d: %s"):format(src, text) end
  error(text, 0)
end

-- Collective: local optimizers (standalone) or the engine's, agreement
-- check, owners, batches.
function DS:_build()
  local eng = self.engine
  if eng then
    for _, g in ipairs(eng.groups) do self.groups[g.index] = { kind = g.kind, group = g.group } end
    for _, e in ipairs(eng.params) do
      local r = self.by_name[e.param.name]
      r.group, r.muon = e.group.index, e.group.kind == "muon"
    end
    self.muon, self.adamw = eng.optimizers.muon, eng.optimizers.adamw
  else
    local mg, ag = {}, {}
    for _, g in ipairs(self.groups) do
      local entry = { params = g.params }
      for k, v in pairs(g.opts) do entry[k] = v end
      if g.kind == "muon" then
        mg[#mg + 1] = entry
        g.local_index = #mg
      else
        ag[#ag + 1] = entry
        g.local_index = #ag
      end
    end
    if #mg > 0 then self.muon = Muon.new(mg, {}, 3) end
    if #ag > 0 then self.adamw = AdamW.new(ag, {}, 3) end
    for _, g in ipairs(self.groups) do
      g.group = g.kind == "muon" and self.muon.param_groups[g.local_index] or self.adamw.param_groups[g.local_index]
    end
  end
  local problem = D.agree(self.ctrl, self.records, self:_settings())
  if problem then error(problem, 0) end
  self.plan = D.plan(self.records, self.mesh, { balance = self.balance, max_batch_numel = self.max_batch_numel })
  -- Every rank's box and whether it feeds the owner, once (used every step).
  for _, r in ipairs(self.records) do
    if r.kind == "owner" then
      r.boxes, r.feeds = {}, {}
      for q = 0, self.mesh.size - 1 do
        r.boxes[q] = D.local_box(r.shape, r.placement, self.mesh, q)
        r.feeds[q] = D.is_source(r.placement, self.mesh, q, r.owner)
      end
    end
  end
  self.full = {} -- owner-side full matrices, by record
  self.built = true
end

-- The live option table of group gi (set lr etc. here between steps).
function DS:group(gi)
  local g = self.groups[gi]
  if not g then error("dist_step:group: no group " .. tostring(gi), 2) end
  return g.group or g.opts
end

local function box_view(t, box, shape)
  local v = t
  for d = 1, #shape do
    if box.len[d] ~= shape[d] then v = v:narrow(d, box.start[d] + 1, box.len[d]) end
  end
  return v
end

local function box_numel(box)
  local n = 1
  for _, l in ipairs(box.len) do n = n * l end
  return n
end

-- One all-to-all-v over the data communicator. pieces[q+1] = list of
-- { n = elements, src = tensor (send) }; recv[q+1] = list of { n, dst }.
function DS:_exchange(dtype, sends, recvs)
  local W = self.data:size()
  local scount, rcount, stot, rtot = {}, {}, 0, 0
  for q = 1, W do
    local s, r = 0, 0
    for _, x in ipairs(sends[q]) do s = s + x.n end
    for _, x in ipairs(recvs[q]) do r = r + x.n end
    scount[q], rcount[q] = s, r
    stot, rtot = stot + s, rtot + r
  end
  -- Staging buffers per dtype, kept across steps (grown when a batch needs more).
  self.bufs = self.bufs or {}
  local b = self.bufs[dtype]
  if not b or b.send:numel() < stot or b.recv:numel() < rtot then
    b = { send = T.zeros({ math.max(stot, b and b.send:numel() or 1, 1) }, dtype),
          recv = T.zeros({ math.max(rtot, b and b.recv:numel() or 1, 1) }, dtype) }
    self.bufs[dtype] = b
  end
  local sbuf, rbuf = b.send, b.recv
  local off = 0
  for q = 1, W do
    for _, x in ipairs(sends[q]) do
      sbuf:narrow(1, off + 1, x.n):view(x.src:size()):copy(x.src)
      off = off + x.n
    end
  end
  self.data:alltoallv(sbuf, scount, rbuf, rcount)
  off = 0
  for q = 1, W do
    for _, x in ipairs(recvs[q]) do
      x.dst:copy(rbuf:narrow(1, off + 1, x.n):view(x.dst:size()))
      off = off + x.n
    end
  end
end

-- Route, orthogonalize and return one batch (list of record indices, one
-- group). inputs[ri] = the rank's local NS input (momentum update) of each
-- record; on return it holds the rank's slice of the scaled update.
-- Returns an error message if this rank's part of the work failed (the
-- protocol still completes so no rank waits).
function DS:_run_batch(batch, inputs, group)
  local W, me = self.mesh.size, self.rank
  local records = self.records
  local by_dtype, dtypes = {}, {}
  for _, ri in ipairs(batch) do
    local dt = records[ri].dtype
    if not by_dtype[dt] then
      by_dtype[dt] = {}
      dtypes[#dtypes + 1] = dt
    end
    table.insert(by_dtype[dt], ri)
  end
  local failure
  for _, dt in ipairs(dtypes) do
    local list = by_dtype[dt]
    -- 1. NS inputs to owners.
    local sends, recvs = {}, {}
    for q = 1, W do sends[q], recvs[q] = {}, {} end
    local mine = {}
    for _, ri in ipairs(list) do
      local r = records[ri]
      local o = r.owner
      if o == me then
        mine[#mine + 1] = ri
        local full = self.full[ri]
        if not full then
          full = T.zeros(r.shape, dt)
          self.full[ri] = full
        end
        if box_numel(r.box) > 0 then box_view(full, r.box, r.shape):copy(inputs[ri]) end
        for q = 0, W - 1 do
          if q ~= me and r.feeds[q] then
            local b = r.boxes[q]
            local n = box_numel(b)
            if n > 0 then table.insert(recvs[q + 1], { n = n, dst = box_view(full, b, r.shape) }) end
          end
        end
      elseif r.feeds[me] then
        local n = box_numel(r.box)
        if n > 0 then table.insert(sends[o + 1], { n = n, src = inputs[ri] }) end
      end
    end
    self:_exchange(dt, sends, recvs)
    -- 2. NS + scale on the owner's full matrices.
    if #mine > 0 then
      local items = {}
      for i, ri in ipairs(mine) do items[i] = { name = records[ri].name, input = self.full[ri] } end
      local t0 = now()
      local ok, err = pcall(self.muon.orthogonalize, self.muon, group, items, 1)
      self.stats.ns_seconds = self.stats.ns_seconds + (now() - t0)
      self.stats.ns_matrices = self.stats.ns_matrices + #items
      if not ok then
        failure = failure or tostring(err)
      else
        for _, ri in ipairs(mine) do
          if not self.full[ri]:all_finite() then
            failure = failure or ("parameter '%s': update holds NaN or Inf"):format(records[ri].name)
          end
        end
      end
    end
    -- 3. Update slices back to every rank holding a piece.
    for q = 1, W do sends[q], recvs[q] = {}, {} end
    for _, ri in ipairs(list) do
      local r = records[ri]
      local o = r.owner
      if o == me then
        for q = 0, W - 1 do
          local b = r.boxes[q]
          if box_numel(b) > 0 then
            local v = box_view(self.full[ri], b, r.shape)
            if q == me then inputs[ri]:copy(v)
            else table.insert(sends[q + 1], { n = box_numel(b), src = v }) end
          end
        end
      elseif box_numel(r.box) > 0 then
        table.insert(recvs[o + 1], { n = box_numel(r.box), dst = inputs[ri] })
      end
    end
    self:_exchange(dt, sends, recvs)
  end
  return failure
end

-- Everything before the commit; returns the per-group plans or a failure.
function DS:_prepare()
  local plans = {}
  local failure
  local flags = {}
  -- Momentum on local shards (each group), nonfinite checks.
  for gi, g in ipairs(self.groups) do
    if g.kind == "muon" then
      local group = g.group
      local params = {}
      for _, p in ipairs(group.params) do if p.grad ~= nil then params[#params + 1] = p end end
      local plan = { group = group, params = params, step = group.step + 1, gi = gi }
      plans[gi] = plan
      local grads = {}
      for i, p in ipairs(params) do grads[i] = p.grad end
      local bad = false
      for i, gr in ipairs(grads) do
        if gr:numel() > 0 and not gr:all_finite() then
          bad = i
          break
        end
      end
      flags[gi] = bad and 1 or 0
      if bad and group.nonfinite ~= "skip" then
        failure = failure or ("parameter '%s': gradient holds NaN or Inf (param group %d)"):format(params[bad].name, gi)
      end
      if #params > 0 and not failure then
        local ok, a, b = pcall(self.muon.momentum, self.muon, group, params)
        if ok then plan.new_bufs, plan.updates = a, b
        else failure = failure or tostring(a) end
      end
    else
      local group = g.group
      flags[gi] = 0
      for _, p in ipairs(group.params) do
        if p.grad ~= nil and p.grad:numel() > 0 and not p.grad:all_finite() then
          flags[gi] = 1
          if group.nonfinite ~= "skip" then
            failure = failure or ("parameter '%s': gradient holds NaN or Inf (param group %d)"):format(p.name, gi)
          end
          break
        end
      end
    end
  end
  -- Agree on failures and skipped groups before any NS routing.
  self:_sync_failure(failure)
  local any = self.ctrl:allreduce(flags, "max")
  for gi, g in ipairs(self.groups) do
    if any[gi] == 1 then
      if g.kind == "muon" then plans[gi].skipped = true else g.skip = true end
    else
      g.skip = nil
    end
  end
  -- NS routing, batch by batch.
  for _, batch in ipairs(self.plan.batches) do
    local r1 = self.records[batch[1]]
    local plan = plans[r1.group]
    if not plan.skipped then
      local inputs = {}
      for i, p in ipairs(plan.params) do inputs[self.by_name[p.name].index] = plan.updates[i] end
      local f = self:_run_batch(batch, inputs, plan.group)
      failure = failure or f
    end
  end
  -- Muon params computed locally (world size 1: kind "local").
  for gi = 1, #self.groups do
    local plan = plans[gi]
    if plan and not plan.skipped and plan.updates then
      local items = {}
      for i, p in ipairs(plan.params) do
        local r = self.by_name[p.name]
        if r.kind == "local" then items[#items + 1] = { name = p.name, input = plan.updates[i] } end
      end
      if #items > 0 and not failure then
        local t0 = now()
        local ok, err = pcall(self.muon.orthogonalize, self.muon, plan.group, items, 1)
        self.stats.ns_seconds = self.stats.ns_seconds + (now() - t0)
        self.stats.ns_matrices = self.stats.ns_matrices + #items
        if not ok then failure = tostring(err) end
        for _, it in ipairs(items) do
          if not failure and not it.input:all_finite() then
            failure = ("parameter '%s': update holds NaN or Inf"):format(it.name)
          end
        end
      end
    end
  end
  self:_sync_failure(failure)
  return plans
end

-- One distributed step (collective over the communicator).
function DS:step()
  local t0 = now()
  self:_step()
  self.stats.step_seconds = self.stats.step_seconds + (now() - t0)
end

function DS:_step()
  if not self.built then self:_build() end
  local plans = self:_prepare()
  -- Commit: nothing below can fail on one rank only.
  for gi, g in ipairs(self.groups) do
    if g.kind == "muon" then
      local plan = plans[gi]
      if plan.skipped then plan.params = {} end
      self.muon:_commit(plan)
    end
  end
  if self.adamw then
    -- Skipped groups (a NaN/Inf gradient somewhere): hide their grads.
    local hidden = {}
    for _, g in ipairs(self.groups) do
      if g.kind == "adamw" and g.skip then
        for _, p in ipairs(g.group.params) do
          hidden[p] = p.grad
          p.grad = nil
        end
      end
    end
    self.adamw:step()
    for p, gr in pairs(hidden) do p.grad = gr end
  end
  if self.muon then self.muon.stats.steps = self.muon.stats.steps + 1 end
  self.stats.steps = self.stats.steps + 1
  -- post_update_fn on local shards; a raise on any rank raises on all.
  local failure
  for gi, g in ipairs(self.groups) do
    if g.kind == "muon" and not failure then
      local ok, err = pcall(self.muon._post_update, self.muon, plans[gi])
      if not ok then failure = tostring(err) end
    end
  end
  self:_sync_failure(failure)
end

function DS:comm_stats()
  return { data = commlib.stats(self.data), control = commlib.stats(self.ctrl) }
end

-- Bytes this rank's NS routing moves per step by the plan's formula.
function DS:expected_step_bytes()
  if not self.built then self:_build() end
  local sent, recv = 0, 0
  local esize = { float32 = 4, float64 = 8 }
  local saved = self.plan.records
  for _, r in ipairs(self.records) do
    if r.kind == "owner" then
      self.plan.records = { r }
      local s, q = D.step_elements(self.plan, self.rank)
      sent, recv = sent + s * esize[r.dtype], recv + q * esize[r.dtype]
    end
  end
  self.plan.records = saved
  return sent, recv
end

------------------------------------------------------------- checkpoints

local TENSOR_KEYS = { "momentum_buffer", "exp_avg", "exp_avg_sq" }

-- Gather full tensors of every state entry to rank 0 (collective).
-- Returns on rank 0 the state dicts { {prefix, dict}, ... }; nil elsewhere.
function DS:_gather_state()
  local W, me, mesh = self.mesh.size, self.rank, self.mesh
  local out = {}
  for _, kind in ipairs({ "muon", "adamw" }) do
    local opt = self[kind]
    if opt then
      local d = { kind = kind, params = {}, state = {}, groups = {} }
      for li, g in ipairs(opt.param_groups) do d.groups[li] = { step = g.step } end
      -- Which state tensors exist (same on all ranks: state follows grads).
      for li, g in ipairs(opt.param_groups) do
        for _, p in ipairs(g.params) do
          local r = self.by_name[p.name]
          d.params[#d.params + 1] = { name = p.name, shape = r.shape, dtype = r.dtype, group = li }
          local s = opt.state[p]
          if s then
            local entry = {}
            for k, v in pairs(s) do if type(v) == "number" then entry[k] = v end end
            for _, k in ipairs(TENSOR_KEYS) do
              if s[k] ~= nil then
                -- gather to rank 0: sources are the holders with replicate coords 0 ... of rank 0
                local full = me == 0 and T.zeros(r.shape, r.dtype) or nil
                local sends, recvs = {}, {}
                for q = 1, W do sends[q], recvs[q] = {}, {} end
                if me == 0 then
                  if box_numel(r.box) > 0 then box_view(full, r.box, r.shape):copy(s[k]) end
                  for q = 1, W - 1 do
                    if D.is_source(r.placement, mesh, q, 0) then
                      local b = D.local_box(r.shape, r.placement, mesh, q)
                      if box_numel(b) > 0 then table.insert(recvs[q + 1], { n = box_numel(b), dst = box_view(full, b, r.shape) }) end
                    end
                  end
                elseif D.is_source(r.placement, mesh, me, 0) and box_numel(r.box) > 0 then
                  table.insert(sends[1], { n = box_numel(r.box), src = s[k] })
                end
                self:_exchange(r.dtype, sends, recvs)
                entry[k] = full
              end
            end
            d.state[p.name] = entry
          end
        end
      end
      out[#out + 1] = { prefix = kind .. "/", dict = d }
    end
  end
  return me == 0 and out or nil
end

-- Save: full tensors gathered to rank 0, one safetensors file (collective).
function DS:save(path)
  if not self.built then self:_build() end
  local dicts = self:_gather_state()
  local failure
  if self.rank == 0 then
    local ok, err = pcall(function()
      local extra = {} -- nothing about the mesh: the file does not depend on it
      if self.engine then
        extra["muon.engine.step"] = tostring(self.engine.step_count)
        extra["muon.engine.lr_scale"] = ("%.17g"):format(self.engine.lr_scale)
      end
      local entries, meta = S.encode(dicts, extra)
      st.save(path, entries, meta)
    end)
    if not ok then failure = tostring(err) end
  end
  self:_sync_failure(failure)
end

-- Load: every rank reads the full tensors and keeps its shard (collective).
-- Checks everything first; on any mismatch every rank raises and nothing changes.
function DS:load(path)
  if not self.built then self:_build() end
  local failure, meta
  local staged = {}
  local ok, err = pcall(function()
    local file = st.load(path)
    meta = file.metadata
    local dicts = S.decode(file, path)
    local by_prefix = {}
    for _, it in ipairs(dicts) do by_prefix[it.prefix] = it.dict end
    for _, kind in ipairs({ "muon", "adamw" }) do
      local opt = self[kind]
      local d = by_prefix[kind .. "/"]
      if opt and not d then error(("checkpoint '%s' has no %s state"):format(path, kind), 0) end
      if opt then
        local problems = {}
        local seen = {}
        for _, e in ipairs(d.params) do
          local r = self.by_name[e.name]
          seen[e.name] = true
          if r and shape_str(e.shape) ~= shape_str(r.shape) then
            problems[#problems + 1] = ("parameter '%s': global shape %s in the checkpoint, %s here")
              :format(e.name, shape_str(e.shape), shape_str(r.shape))
          end
        end
        if #problems > 0 then
          table.sort(problems)
          error(("checkpoint '%s' does not match:\n  %s"):format(path, table.concat(problems, "\n  ")), 0)
        end
        -- Local dict: shapes and tensors of this rank's shard.
        local ld = { kind = d.kind, params = {}, state = {}, groups = d.groups }
        for i, e in ipairs(d.params) do
          local r = self.by_name[e.name]
          ld.params[i] = { name = e.name, dtype = e.dtype, group = e.group, shape = r and r.box.len or e.shape }
          local entry = d.state[e.name]
          if entry and r then
            local le = {}
            for k, v in pairs(entry) do
              if type(v) == "cdata" then
                le[k] = box_numel(r.box) > 0 and box_view(v, r.box, r.shape):clone() or T.zeros(r.box.len, v:dtype())
              else
                le[k] = v
              end
            end
            ld.state[e.name] = le
          end
        end
        local probs = S.mismatches(opt, ld)
        if #probs > 0 then
          error(("checkpoint '%s' does not match:\n  %s"):format(path, table.concat(probs, "\n  ")), 0)
        end
        staged[#staged + 1] = { opt = opt, dict = ld }
      end
    end
  end)
  if not ok then failure = tostring(err) end
  self:_sync_failure(failure)
  for _, s in ipairs(staged) do S.load_state_dict(s.opt, s.dict, "checkpoint '" .. path .. "'") end
  if self.engine and meta then
    self.engine.step_count = tonumber(meta["muon.engine.step"]) or self.engine.step_count
    self.engine.lr_scale = tonumber(meta["muon.engine.lr_scale"]) or self.engine.lr_scale
  end
end

return DS
