-- The narrow context the step gives the kinds' members that run
-- Newton-Schulz (muon.optim.kind: orthogonalize, ns_prepare, ns_finish):
-- reusable buffers and Newton-Schulz over the step's scratch
-- (muon.scratch), nothing else of the step.
--
--   local KC = require("muon.kind_context")
--   local ctx = KC.new(scratch, log)        -- log: a muon.log logger (nil: none)
--   ctx:batch_buffer(dtype, n, a, b, slot) -- a reusable (n, a, b) tensor
--   ctx:ns_workspace(dtype, a, b)          -- a Newton-Schulz workspace for a x b
--   ctx:ns_many(jobs)                      -- Newton-Schulz in place on every { x, r } in one scheduler call
--   ctx:log(level, fmt, ...)               -- a message at a level (muon.log: rank 0, when the level shows)
local ns = require("muon.ns")

local KC = {}

-- Newton-Schulz in place on every job's x ({ x = 2-D or 3-D tensor, r =
-- resolved options }): one scheduler call per dtype, on a workspace large
-- enough for every matrix of that dtype.
local function ns_many(scratch, jobs)
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
    ns.zeropower_many(l.xs, l.xs, l.rs, scratch:ns_workspace(l.dtype, l.rows, l.cols))
  end
end

function KC.new(scratch, log)
  local ctx = {}
  function ctx.log(_, level, fmt, ...)
    if log then log:say(level, fmt, ...) end
  end
  function ctx.batch_buffer(_, dtype, n, a, b, slot) return scratch:batch(dtype, n, a, b, slot) end
  function ctx.ns_workspace(_, dtype, a, b) return scratch:ns_workspace(dtype, a, b) end
  function ctx.ns_many(_, jobs) return ns_many(scratch, jobs) end
  return ctx
end

return KC
