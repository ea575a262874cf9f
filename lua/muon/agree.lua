-- The agreements of a step protocol (muon.step) across the ranks of a
-- mesh, on its control communicator: each is one all-reduce when the
-- ranks agree, and when they do not, every rank raises the same error
-- (the lowest failing rank's, with its code) instead of entering a
-- collective that another rank never joins. On one process each is local
-- (an error raises at once).
--
--   local A = require("muon.agree")
--   local a = A.new(ctrl)                -- ctrl: the control communicator (muon.comm)
--   a:gate(op, err, args)                -- the start of a collective call (A.OPS); err: this rank's argument error;
--                                        -- args: the call's arguments ({ key, value } strings), agreed
--   a:failure(err, run)                  -- raise everywhere if any rank failed; with run: agree on skipped groups
--   a:entries(entries, what)             -- nil, or the message naming the first { key, value } that differs
--   a:run(run, err, records, groups)     -- a step's failures, skipped groups, stepping set and values
local D = require("muon.dist")
local E = require("muon.errors")
local K = require("muon.optim.kind")

local A = {}
local Agree = {}
Agree.__index = Agree

-- The collective calls of an engine, each with its tag in the gate.
A.OPS = { "step", "save", "load", "reduce_grads", "clip_grad_norm", "save_sharded" }
local OP_TAG = {}
for i, op in ipairs(A.OPS) do OP_TAG[op] = i end

function A.new(ctrl)
  return setmetatable({ ctrl = ctrl, W = ctrl:size(), me = ctrl:rank() }, Agree)
end

-- Raise on every rank the error of rank src (its code and message).
function Agree:raise_from(src, err)
  local code = self.ctrl:allreduce({ self.me == src and -(E.code(err) or E.ELUA) or 0 }, "max")[1]
  local msg = self.ctrl:bcast_string(self.me == src and tostring(err) or "", src)
  if not msg:find("^rank %d") then msg = ("rank %d: %s"):format(src, msg) end
  error(E.new(-code, msg), 0)
end

-- Raise on every rank if any rank has an error: the error of the lowest
-- failing rank, with its code. With run (a step's): the same all-reduce
-- agrees on the groups a non-finite derived value skips (run.g[gi].skip
-- becomes true on every rank where any rank set skip_derived).
function Agree:failure(err, run)
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
  if r[1] ~= 0 then self:raise_from(W - r[1], err) end
  for gi = 1, ng do run.g[gi].skip = run.g[gi].skip or r[1 + gi] == 1 end
end

-- Collective on a mesh: nil if every rank has the same entries ({ key,
-- value } strings, the same count everywhere), else the same message on
-- every rank naming the first that differs (D.agree_entries).
function Agree:entries(entries, what)
  if self.W == 1 then return nil end
  return D.agree_entries(self.ctrl, entries, what, #entries)
end

local function hash_all(list)
  local parts = {}
  for i, e in ipairs(list) do parts[i] = e[1] .. "=" .. e[2] end
  return D.hash(table.concat(parts, "\n"))
end

-- The start of every collective call (op: one of A.OPS): one all-reduce of
-- the call's tag, of whether this rank already failed (err: an argument
-- error, raised here on every rank, the lowest failing rank's) and of a
-- hash of the call's arguments (args: { key, value } strings, nil for
-- none). Ranks in different calls (save on one, step on another) fail on
-- every rank naming both calls; ranks whose arguments differ (op "mean" on
-- one, "sum" on another) fail on every rank naming the key and both
-- values. On one process err raises at once.
function Agree:gate(op, err, args)
  if self.W == 1 then
    if err ~= nil then error(err, 0) end
    return
  end
  local tag = OP_TAG[op]
  local h = args and hash_all(args) or 0
  local r = self.ctrl:allreduce({ tag, -tag, err ~= nil and (self.W - self.me) or 0, h, -h }, "max")
  if r[1] ~= -r[2] then
    local other = A.OPS[r[1] ~= tag and r[1] or -r[2]]
    E.raise(E.ESTATE, "%s: the ranks are not in the same call: rank %d called %s while another rank called %s "
      .. "(every rank must make the same collective calls, %s, in the same order); nothing was changed", op, self.me,
      op, other, table.concat(A.OPS, ", "))
  end
  if r[3] ~= 0 then self:raise_from(self.W - r[3], err) end
  if r[4] ~= -r[5] then
    local msg = D.agree_entries(self.ctrl, args or {}, op .. ": the arguments")
    E.raise(E.EINVAL, "%s: every rank must pass the same; nothing was changed", msg or (op .. ": the arguments differ"))
  end
end

-- Some rank holds an empty shard of a parameter and passed no grad for it
-- (the C API's NULL): one more all-reduce, per parameter, of whether any
-- rank has a grad and whether every rank holding elements has one. The
-- empty shards step with their parameter; a grad on only some of the
-- holding ranks fails on every rank, naming the parameters.
local function empty_shards(self, run, records, ngroups)
  local n = #records
  local vec = {}
  for i, rec in ipairs(records) do
    vec[i] = run.stepping[rec] and 1 or 0
    vec[n + i] = -((run.stepping[rec] or run.empty_nograd[rec]) and 1 or 0)
  end
  local r = self.ctrl:allreduce(vec, "max")
  local differ = {}
  for i, rec in ipairs(records) do
    if r[i] == 1 and r[n + i] == 0 then differ[#differ + 1] = "'" .. rec.name .. "'" end
    if r[i] == 1 and run.empty_nograd[rec] then run.stepping[rec] = true end
  end
  if #differ > 0 then
    E.raise(E.EINVAL, "gradients differ across ranks: parameter(s) %s have a grad on some ranks and none on others "
      .. "(only a rank whose shard is empty may pass none)", table.concat(differ, ", "))
  end
  for gi = 1, ngroups do run.g[gi].params = {} end
  for _, rec in ipairs(records) do
    if run.stepping[rec] then table.insert(run.g[rec.group].params, rec.param) end
  end
end

-- A step's checks, agreed (on a mesh; run: this rank's, nil when err):
-- one all-reduce of the failures, the skipped groups (a NaN/Inf gradient
-- anywhere skips the group everywhere), the stepping set (records: the
-- plan's, in registration order) and the step's values (each group's
-- schedulable options, the signals); a difference fails on every rank
-- naming it.
function Agree:run(run, err, records, groups)
  local W, me = self.W, self.me
  local ng = #groups
  local vec = { err ~= nil and (W - me) or 0 }
  for gi = 1, ng do vec[1 + gi] = run and run.g[gi].skip and 1 or 0 end
  local stepping, values = {}, {}
  if run then
    for i, rec in ipairs(records) do
      stepping[i] = { "parameter '" .. rec.name .. "'", run.stepping[rec] and "has a grad" or "has no grad" }
    end
    for gi, G in ipairs(groups) do
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
  local hs, hv = run and hash_all(stepping) or 0, run and hash_all(values) or 0
  local empty = run and next(run.empty_nograd) ~= nil and 1 or 0
  vec[#vec + 1], vec[#vec + 2], vec[#vec + 3], vec[#vec + 4], vec[#vec + 5] = hs, -hs, hv, -hv, empty
  local r = self.ctrl:allreduce(vec, "max")
  if r[1] > 0 then self:raise_from(W - r[1], err) end
  if r[ng + 6] == 1 then
    empty_shards(self, run, records, ng)
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

return A
