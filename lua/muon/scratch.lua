-- The step's private buffers (muon.step): everything a step computes into
-- before its commit, kept across steps so that a step allocates nothing
-- once the first one has run. Hooks only ever see these buffers (or copies
-- in them), never the optimizer state nor a registered parameter, so a
-- step that fails leaves the state and the parameters as they were, and a
-- view a hook keeps reaches only scratch that the next step refreshes.
--
--   local Sc = require("muon.scratch")
--   local sc = Sc.new()
--   sc:update(p, rec)              -- the update buffer of this rank's box (the NS input, then the update)
--   sc:entry(p, rec, keys, state, in_place) -- the kind's entry of a parameter whose state this rank holds
--   sc:swap(e, state)              -- the commit: e's new buffers become the state (the old ones the spares)
--   sc:hook_buffer(p, key)         -- the buffer the hooks see for a hook state tensor
--   sc:stand_in(p)                 -- what post_update_fn gets: p's fields, value a private copy of p.value
--   sc:region(item, rec)           -- an owner's buffer for a plan item's region
--   sc:batch(dtype, n, a, b, slot) -- a reusable (n, a, b) buffer for Newton-Schulz batches
--   sc:ns_workspace(dtype, a, b)   -- a Newton-Schulz workspace large enough for a x b
--   sc:bytes()                     -- bytes held by all of them, and by kind
--   sc:ns_stats(reset)             -- the Newton-Schulz calls on its workspaces (muon.ns.workspace_stats, summed)
local T = require("muon.tensor")
local ns = require("muon.ns")
local core = require("muon.core")
local ffi = require("ffi")

local Sc = {}
local Scratch = {}
Scratch.__index = Scratch

function Sc.new()
  return setmetatable({
    per = {},   -- param -> { u = update buffer, spare = { key -> tensor }, hook = { key -> tensor }, entry, post }
    full = setmetatable({}, { __mode = "k" }), -- plan item -> owner's region buffer
    merged = {}, -- "dtype:AxB#slot" -> (n, A, B) batch buffer
    ws = {},     -- dtype -> { rows, cols, handle }: Newton-Schulz workspaces
  }, Scratch)
end

-- A parameter's buffers (made on first use).
function Scratch:of(p)
  local s = self.per[p]
  if s == nil then
    s = { spare = {}, hook = {} }
    self.per[p] = s
  end
  return s
end

-- The update buffer of this rank's box of p (rec: its plan record): the NS
-- input goes out of it and the update comes back into it.
function Scratch:update(p, rec)
  local s = self:of(p)
  if s.u == nil then s.u = T.zeros(rec.mine.len, rec.dtype) end
  return s.u
end

-- The update buffer of p if it has one, else nil.
function Scratch:update_of(p)
  local s = self.per[p]
  return s and s.u
end

-- The entry of a parameter whose state this rank holds (muon.optim.kind's
-- direction): { p, grad, u, old = the state as it is (never written),
-- new = the buffers this step writes (the spares; fresh ones on the first
-- step: they become the state), work = the kind's own buffers }, the same
-- table every step. keys: the kind's state keys; state: p's state table or
-- nil. Hook state (rec.hooks_list) gets its old/new pair too, and a buffer
-- of its own that the hooks see (hook_buffer). in_place: the set of keys
-- the kind writes in place at the commit (muon.optim.kind's in_place_state):
-- old[k] is the state itself and there is no new[k].
function Scratch:entry(p, rec, keys, state, in_place)
  local s = self:of(p)
  local e = s.entry
  if e == nil then
    e = { p = p, old = {}, new = {}, work = {} }
    s.entry = e
  end
  e.grad, e.u = p.grad, self:update(p, rec)
  e.in_place = in_place
  local nk = #keys
  for i = 1, nk + #rec.hooks_list do
    local k = i <= nk and keys[i] or rec.hooks_list[i - nk].key
    local shape = i <= nk and rec.mine.len or rec.hook_records[k].mine.len
    local dt = i <= nk and rec.state_dtype or rec.dtype
    if in_place and in_place[k] then
      -- written in place at the commit: the state itself (first step: zeros
      -- that become it), no second buffer
      e.old[k], e.new[k] = state and state[k] or T.zeros(shape, dt), nil
    else
      local spare = s.spare[k]
      if spare == nil then
        spare = T.zeros(shape, dt)
        s.spare[k] = spare
      end
      if state then
        e.old[k], e.new[k] = state[k], spare
      else -- first step: zeros in, a fresh buffer out (becomes the state)
        e.old[k], e.new[k] = spare:zero(), T.zeros(shape, dt)
      end
      if i > nk and s.hook[k] == nil then s.hook[k] = T.zeros(shape, dt) end
    end
  end
  return e
end

-- The commit of an entry: its new buffers become the state (state: p's
-- table, or nil on its first step), the state's old ones the spares.
-- Returns the state table. Nothing here can fail.
function Scratch:swap(e, state)
  if state == nil then
    state = {}
    for k, t in pairs(e.new) do state[k] = t end
    for k in pairs(e.in_place or {}) do state[k] = e.old[k] end
    return state
  end
  local spare = self.per[e.p].spare
  for k, t in pairs(e.new) do
    spare[k] = state[k]
    state[k] = t
  end
  return state
end

-- The buffer the hooks (pre_ortho_fn, post_ortho_fn) see for hook state
-- key of p: refreshed from the state before the hooks run, copied into
-- the state's new buffer after them.
function Scratch:hook_buffer(p, key) return self.per[p].hook[key] end

-- What post_update_fn runs on for p: a stand-in with p's fields (name,
-- logical_shape, grad) whose value is a copy of p.value, in a buffer kept
-- across steps and refreshed here (the commit copies it into p.value). A
-- hook that keeps the stand-in, or a view of its value, thus never reaches
-- the parameter outside its own call.
function Scratch:stand_in(p)
  local s = self:of(p)
  if s.post == nil then
    s.post = setmetatable({ value = T.zeros(p.value:size(), p.value:dtype()) }, { __index = p })
  end
  s.post.value:copy(p.value)
  return s.post
end

-- The owner's buffer for a plan item's region (kept while the plan lives).
function Scratch:region(it)
  local b = self.full[it]
  if b == nil then
    b = T.zeros(it.region.len, it.record.dtype)
    self.full[it] = b
  end
  return b
end

-- A reusable (n, a, b) buffer for Newton-Schulz batches: one per (dtype,
-- core shape, slot), grown when a batch needs more slices.
function Scratch:batch(dtype, n, a, b, slot)
  local key = ("%s:%dx%d#%d"):format(dtype, a, b, slot)
  local buf = self.merged[key]
  if buf == nil or buf:size(1) < n then
    buf = T.zeros({ n, a, b }, dtype)
    self.merged[key] = buf
  end
  if buf:size(1) == n then return buf end
  return buf:narrow(1, 1, n)
end

-- A Newton-Schulz workspace (one per dtype) large enough for a x b.
function Scratch:ns_workspace(dtype, a, b)
  local ws = self.ws[dtype]
  if ws == nil or ws.rows < math.max(a, b) or ws.cols < math.min(a, b) then
    local rows = math.max(a, b, ws and ws.rows or 0)
    local cols = math.max(math.min(a, b), ws and ws.cols or 0)
    ws = { rows = rows, cols = cols, handle = ns.workspace(dtype, rows, cols) }
    self.ws[dtype] = ws
  end
  return ws.handle
end

-- What the Newton-Schulz calls on the workspaces did since the last reset:
-- { seconds, matrices, residuals, residual_max, residual_sumsq } summed
-- over them (reset: zero them after reading).
function Scratch:ns_stats(reset)
  local r = { seconds = 0, matrices = 0, residuals = 0, residual_sumsq = 0 }
  for _, ws in pairs(self.ws) do
    local s = ns.workspace_stats(ws.handle, reset)
    r.seconds, r.matrices = r.seconds + s.seconds, r.matrices + s.matrices
    r.residuals, r.residual_sumsq = r.residuals + s.residuals, r.residual_sumsq + s.residual_sumsq
    if s.residual_max and (r.residual_max == nil or s.residual_max > r.residual_max) then r.residual_max = s.residual_max end
  end
  return r
end

local function tensor_bytes(t) return t:numel() * T.DTYPE_SIZES[t:dtype()] end
local ws_bytes = ffi.new("int64_t[1]")

-- The bytes held by every buffer here, and by kind: { updates (the update
-- buffers: the Newton-Schulz inputs and the updates), state (the second
-- buffers of the state a kind does not write in place, and the hooks'
-- state), copies (post_update_fn's private copies of the parameters),
-- routing (a mesh's owner regions and batches), ns (the Newton-Schulz
-- workspaces: per worker the largest matrix and two n x n Gram buffers) }.
function Scratch:bytes()
  local d = { updates = 0, state = 0, copies = 0, routing = 0, ns = 0 }
  for _, s in pairs(self.per) do
    if s.u then d.updates = d.updates + tensor_bytes(s.u) end
    if s.post then d.copies = d.copies + tensor_bytes(s.post.value) end
    for _, v in pairs(s.spare) do d.state = d.state + tensor_bytes(v) end
    for _, v in pairs(s.hook) do d.state = d.state + tensor_bytes(v) end
  end
  for _, b in pairs(self.full) do d.routing = d.routing + tensor_bytes(b) end
  for _, b in pairs(self.merged) do d.routing = d.routing + tensor_bytes(b) end
  for _, ws in pairs(self.ws) do
    core.check(core.C.mu_ns_workspace_bytes(ws.handle, ws_bytes), "ns workspace bytes")
    d.ns = d.ns + tonumber(ws_bytes[0])
  end
  return d.updates + d.state + d.copies + d.routing + d.ns, d
end

return Sc
