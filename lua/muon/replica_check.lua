-- Whether every replica of every box holds the same bits (muon.step's
-- Stepper:check_replicas; the config's dist.check_replicas): of its
-- gradients (what = "grads") or parameter values ("params"). Per set of
-- replicate axes, one all-reduce over the ranks that hold the same boxes
-- (a communicator split once) of two 48-bit hashes per parameter, then one
-- of a flag over every rank; on a difference every rank raises EINVAL
-- naming the first parameter that differs and the ranks of the replica
-- groups where it does.
--
--   local RC = require("muon.replica_check")
--   local rc = RC.new(mesh, ctrl)  -- muon.dist mesh; the control communicator
--   rc:run(records, what)          -- records: the plan's, registration order (collective)
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")

local RC = {}
local Checker = {}
Checker.__index = Checker

function RC.new(mesh, ctrl)
  return setmetatable({ mesh = mesh, ctrl = ctrl, W = ctrl:size(), me = ctrl:rank(), comms = {} }, Checker)
end

-- XXH64 of a tensor's bytes, folded to 48 bits (exact in a double).
local u64 = ffi.typeof("uint64_t[1]")
local tarr = ffi.typeof("mu_tensor *[1]")
local function hash48(t)
  local out, arr = u64(), tarr()
  arr[0] = t
  core.check(core.C.mu_st_checksum(1, arr, out), "check_replicas: hash")
  return tonumber(out[0] % 281474976710656ULL)
end

-- The communicator of the ranks that hold the same boxes as this one
-- under a set of replicate axes (split once per set).
function Checker:_replicas(key, raxes)
  local sub = self.comms[key]
  if not sub then
    local mesh, mc = self.mesh, self.mesh:coords(self.me)
    local isr, color = {}, 0
    for _, a in ipairs(raxes) do isr[a] = true end
    for a = 1, #mc do if not isr[a] then color = color * mesh.sizes[a] + mc[a] end end
    sub = self.ctrl:split(color, self.me)
    self.comms[key] = sub
  end
  return sub
end

function Checker:run(records, what)
  local by, order = {}, {}
  for i, r in ipairs(records) do
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
    local vec, n = {}, #g.list
    for j, e in ipairs(g.list) do
      local t = what == "grads" and e.r.param.grad or e.r.param.value
      local h = (e.r.mine_n > 0 and t ~= nil) and hash48(t) or -1
      vec[j], vec[n + j] = h, -h
    end
    local red = self:_replicas(key, g.raxes):allreduce(vec, "max")
    for j, e in ipairs(g.list) do
      if red[j] ~= -red[n + j] and e.i < bad_here then bad_here = e.i end
    end
  end
  local bad = self.ctrl:allreduce({ bad_here }, "min")[1]
  if bad == NONE then return end
  local flags = {}
  for q = 1, self.W do flags[q] = 0 end
  if bad_here == bad then flags[self.me + 1] = 1 end
  flags = self.ctrl:allreduce(flags, "max")
  local ranks = {}
  for q = 1, self.W do if flags[q] == 1 then ranks[#ranks + 1] = q - 1 end end
  E.raise(E.EINVAL, "check_replicas: parameter '%s': its %s differ across replicas of the same box (ranks %s)%s",
    records[bad].name, what == "grads" and "gradients" or "values", table.concat(ranks, ", "),
    what == "grads" and "; an HSDP trainer reduces them first: eng:reduce_grads({ op = 'mean' })" or "")
end

return RC
