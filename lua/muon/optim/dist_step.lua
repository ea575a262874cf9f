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

local DS = {}
DS.__index = DS

local NEW_KEYS = { comm = true, mesh = true, groups = true, balance = true, max_batch_numel = true }

function DS.new(opts)
  if type(opts) ~= "table" then error("dist_step.new: options must be a table", 2) end
  for k in pairs(opts) do
    if not NEW_KEYS[k] then error("dist_step.new: unknown option '" .. tostring(k) .. "'", 2) end
  end
  local comm = opts.comm or commlib.world()
  if not commlib.is_comm(comm) then error("dist_step.new: comm must be a muon.comm communicator", 2) end
  local mesh = opts.mesh
  if mesh == nil then mesh = { { "world", comm:size() } } end
  if not D.is_mesh(mesh) then
    local ok, m = pcall(D.mesh, mesh, comm:size())
    if not ok then error(tostring(m):gsub("^[^:]*:%d+: ", ""), 2) end
    mesh = m
  elseif mesh.size ~= comm:size() then
    error(("dist_step.new: mesh %s has %d ranks, the communicator %d"):format(mesh:describe(), mesh.size, comm:size()), 2)
  end
  if type(opts.groups) ~= "table" or #opts.groups == 0 then
    error("dist_step.new: groups must be a non-empty list of { optimizer = 'muon'|'adamw', <options> }", 2)
  end
  local groups = {}
  for gi, g in ipairs(opts.groups) do
    local kind = g.optimizer or "muon"
    if kind ~= "muon" and kind ~= "adamw" then
      error(("dist_step.new: groups[%d].optimizer must be 'muon' or 'adamw', got %s"):format(gi, tostring(kind)), 2)
    end
    local o = {}
    for k, v in pairs(g) do if k ~= "optimizer" then o[k] = v end end
    groups[gi] = { kind = kind, opts = o, params = {} }
  end
  local self = setmetatable({
    comm = comm,
    rank = comm:rank(),
    -- Separate communicators so the data counters hold only NS routing.
    data = comm:split(0, comm:rank()),
    ctrl = comm:split(0, comm:rank()),
    mesh = mesh,
    groups = groups,
    records = {},
    by_name = {},
    balance = opts.balance or "flops",
    max_batch_numel = opts.max_batch_numel,
    stats = { steps = 0 },
  }, DS)
  if self.balance ~= "flops" and self.balance ~= "numel" then
    error("dist_step.new: balance must be 'flops' or 'numel', got " .. tostring(self.balance), 2)
  end
  return self
end

local function shape_str(s) return "{" .. table.concat(s, ",") .. "}" end

-- Register this rank's shard of a parameter. spec: { shape = global shape,
-- placement = per mesh axis, group = index (default 1) }.
function DS:add_param(name, value, grad, spec)
  if self.built then error("dist_step:add_param: parameters are fixed after the first step", 2) end
  spec = spec or {}
  for k in pairs(spec) do
    if k ~= "shape" and k ~= "placement" and k ~= "group" then
      error(("add_param '%s': unknown key '%s' (shape, placement, group)"):format(tostring(name), tostring(k)), 2)
    end
  end
  if type(name) ~= "string" or name == "" then error("add_param: name must be a non-empty string", 2) end
  if self.by_name[name] then error(("add_param: parameter '%s' is registered twice"):format(name), 2) end
  if not T.is_tensor(value) then error(("add_param '%s': value must be a tensor"):format(name), 2) end
  local gi = spec.group or 1
  local g = self.groups[gi]
  if not g then error(("add_param '%s': group %s does not exist"):format(name, tostring(gi)), 2) end
  local shape = spec.shape or value:size()
  if type(shape) ~= "table" or #shape ~= value:dim() then
    error(("add_param '%s': shape must list the global size of each of the value's %d dims"):format(name, value:dim()), 2)
  end
  local ok, pl = pcall(D.placement, spec.placement, self.mesh, #shape)
  if not ok then error(("add_param '%s': %s"):format(name, tostring(pl):gsub("^[^:]*:%d+: ", "")), 2) end
  local box = D.local_box(shape, pl, self.mesh, self.rank)
  local vs = value:size()
  for d = 1, #shape do
    if vs[d] ~= box.len[d] then
      error(("add_param '%s': rank %d holds a local shard of shape %s, but global shape %s with placement %s on mesh %s gives %s")
        :format(name, self.rank, shape_str(vs), shape_str(shape), D.placement_string(pl), self.mesh:describe(), shape_str(box.len)), 2)
    end
  end
  if grad ~= nil and (not T.is_tensor(grad) or not P.same_shape(grad, value)) then
    error(("add_param '%s': grad must be nil or a tensor of the value's shape %s"):format(name, shape_str(vs)), 2)
  end
  if g.kind == "muon" and #shape < 2 then
    error(("parameter '%s' is %d-D: 1D parameters are not supported in Muon (use AdamW)"):format(name, #shape), 2)
  end
  local p = P.new(name, value, grad)
  p.logical_shape = shape
  local r = {
    name = name, shape = shape, placement = pl, group = gi, muon = g.kind == "muon",
    has_grad = grad ~= nil, dtype = value:dtype(), box = box, param = p, index = #self.records + 1,
  }
  self.records[#self.records + 1] = r
  self.by_name[name] = r
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

-- Collective: agreement check, local optimizers, owners, batches.
function DS:_build()
  local problem = D.agree(self.ctrl, self.records, self:_settings())
  if problem then error(problem, 0) end
  self.muon_groups, self.adamw_groups = {}, {}
  local mg, ag = {}, {}
  for gi, g in ipairs(self.groups) do
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
  self.plan = D.plan(self.records, self.mesh, { balance = self.balance, max_batch_numel = self.max_batch_numel })
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
  local sbuf = T.zeros({ math.max(stot, 1) }, dtype)
  local rbuf = T.zeros({ math.max(rtot, 1) }, dtype)
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
  local W, me, mesh = self.mesh.size, self.rank, self.mesh
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
          if q ~= me and D.is_source(r.placement, mesh, q, me) then
            local b = D.local_box(r.shape, r.placement, mesh, q)
            local n = box_numel(b)
            if n > 0 then table.insert(recvs[q + 1], { n = n, dst = box_view(full, b, r.shape) }) end
          end
        end
      elseif D.is_source(r.placement, mesh, me, o) then
        local n = box_numel(r.box)
        if n > 0 then table.insert(sends[o + 1], { n = n, src = inputs[ri] }) end
      end
    end
    self:_exchange(dt, sends, recvs)
    -- 2. NS + scale on the owner's full matrices.
    if #mine > 0 then
      local items = {}
      for i, ri in ipairs(mine) do items[i] = { name = records[ri].name, input = self.full[ri] } end
      local ok, err = pcall(self.muon.orthogonalize, self.muon, group, items, 1)
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
          local b = q == me and r.box or D.local_box(r.shape, r.placement, mesh, q)
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
  for gi, plan in pairs(plans) do
    if not plan.skipped and plan.updates then
      local items = {}
      for i, p in ipairs(plan.params) do
        local r = self.by_name[p.name]
        if r.kind == "local" then items[#items + 1] = { name = p.name, input = plan.updates[i] } end
      end
      if #items > 0 and not failure then
        local ok, err = pcall(self.muon.orthogonalize, self.muon, plan.group, items, 1)
        if not ok then failure = tostring(err) end
        for _, it in ipairs(items) do
          if not failure and not it.input:all_finite() then
            failure = ("parameter '%s': update holds NaN or Inf"):format(it.name)
          end
        end
      end
      local _ = gi
    end
  end
  self:_sync_failure(failure)
  return plans
end

-- One distributed step (collective over the communicator).
function DS:step()
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
      local entries, meta = S.encode(dicts, { ["muon.dist.mesh"] = self.mesh:describe() })
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
  local failure
  local staged = {}
  local ok, err = pcall(function()
    local file = st.load(path)
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
end

return DS
