-- The everyday gradient helpers of the engine and of the one-process
-- optimizers, over the parameters registered with a Stepper (muon.step):
--
--   local G = require("muon.grads")
--   G.zero(st)                     -- every registered grad := 0, in place
--   G.clip(st, max_norm, who)      --> total norm before clipping
--
-- clip is torch.nn.utils.clip_grad_norm_ (norm_type 2): total_norm =
-- sqrt(sum of g^2 over every element of every grad), computed exactly
-- (muon.reduce: each float32 square exact, the sum rounded once), so the
-- same bits on one process and on any mesh; clip_coef = max_norm /
-- (total_norm + 1e-6), and when clip_coef < 1 every grad is multiplied by
-- it (one fused C call per dtype: foreach.scale); a NaN or Inf norm is
-- returned and the grads are left as they are (the step's nonfinite policy
-- then applies). On a mesh clip is a collective (gated like step: ranks in
-- another call fail instead of waiting): every rank calls it, each
-- piece of a parameter counts once (on the rank that keeps its state, as
-- the hooks' reductions count it), so replicas must hold the same grads.
local E = require("muon.errors")
local Rd = require("muon.reduce")
local foreach = require("muon.foreach")
local O = require("muon.optim.options")

local G = {}

-- The grads registered with st (registration order), skipping nil ones.
local function grads_of(st)
  local list = {}
  for gi = 1, #st:group_specs() do
    for _, p in ipairs(st:params(gi)) do
      if p.grad ~= nil then list[#list + 1] = p end
    end
  end
  return list
end

-- Set every registered grad to 0 (parameters without a grad are skipped).
function G.zero(st)
  for _, p in ipairs(grads_of(st)) do p.grad:fill(0) end
end

-- Clip the registered grads by their global norm (see above); who names
-- the caller in messages ("clip_grad_norm"). Returns the total norm.
function G.clip(st, max_norm, who)
  local bad
  if not O.is_finite(max_norm) or max_norm < 0 then
    bad = E.new(E.EINVAL, ("%s: max_norm must be a finite number >= 0, got %s"):format(who, E.value(max_norm)))
  end
  -- (on a mesh: every rank in this call, or every rank fails; a bad
  -- max_norm on one rank fails it on every rank)
  st:gate("clip_grad_norm", bad, { { "max_norm", ("%.17g"):format(tonumber(max_norm) or 0) } })
  local params = grads_of(st)
  local counted = {}
  local mesh = st:size() > 1
  for _, p in ipairs(params) do
    if not mesh or st:record(p).holds then counted[#counted + 1] = p.grad end
  end
  local total = Rd.sqrt_value(Rd.merge_all(st:control(), Rd.squares(counted)))
  local coef = max_norm / (total + 1e-6)
  if coef < 1 and total == total and total ~= math.huge then
    local by_dtype = {}
    for _, p in ipairs(params) do
      local dt = p.grad:dtype()
      by_dtype[dt] = by_dtype[dt] or {}
      table.insert(by_dtype[dt], p.grad)
    end
    for _, list in pairs(by_dtype) do foreach.scale(list, coef) end
  end
  return total
end

return G
