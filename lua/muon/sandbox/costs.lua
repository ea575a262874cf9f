-- Host work a sandboxed config's load is charged for (lua/muon/sandbox/budget.lua).
--
-- Inside a bounded load every host call is charged its CPU time afterwards
-- (HOST_RATE instructions per second: the membrane's call_host), and the
-- calls whose time grows faster than their arguments' size are charged an
-- estimate before they run, so that one call cannot take far longer than
-- the budget (matmuls, Newton-Schulz, optimizer steps;
-- FLOPS_PER_INSTRUCTION floating point operations count as one
-- instruction). At step time host work is not charged (B.charge_host).
local T = require("muon.tensor")

local C = {}

C.HOST_RATE = 1e9
local FLOPS_PER_INSTRUCTION = 16

-- a (..., m, k) @ b (..., k, n): 2 * batch * m * k * n flops (1-D operands
-- are a row or a column).
function C.matmul_cost(a, b)
  if not (T.is_tensor(a) and T.is_tensor(b)) then return 0 end
  local sa, sb = a:size(), b:size()
  local m = #sa >= 2 and sa[#sa - 1] or 1
  local n = #sb >= 2 and sb[#sb] or 1
  return 2 * math.max(a:numel() * n, b:numel() * m) / FLOPS_PER_INSTRUCTION
end

-- Newton-Schulz on x (a matrix or a batch of them) with these options: the
-- flops of the cost model (muon.ns.cost; 0 for options the call refuses).
function C.ns_cost(x, opts)
  if not T.is_tensor(x) or x:dim() < 2 then return 0 end
  local s, batch = x:size(), 1
  for d = 1, #s - 2 do batch = batch * s[d] end
  local ok, flops = pcall(require("muon.ns").cost, s[#s - 1], s[#s], opts)
  return ok and batch * flops / FLOPS_PER_INSTRUCTION or 0
end

-- One step of an optimizer made by the config over these (host) params:
-- ns_steps iterations on each core matrix (as the "legacy" schedule, which
-- runs any number of them), plus the elementwise passes.
function C.step_cost(params, opts)
  local steps = type(opts) == "table" and tonumber(opts.ns_steps) or 5
  local ns_opts = { variant = "legacy", steps = math.max(0, math.min(math.floor(steps), 1000)) }
  local cost = 0
  if type(params) ~= "table" then return 0 end
  for _, p in ipairs(params) do
    local v = type(p) == "table" and rawget(p, "value")
    if T.is_tensor(v) then
      local ok, flops = pcall(require("muon.ns").shape_cost, v:size(), "batch", ns_opts)
      cost = cost + (ok and flops / FLOPS_PER_INSTRUCTION or 0) + 32 * v:numel()
    end
  end
  return cost
end
C.STEP_COST = setmetatable({}, { __mode = "k" }) -- optimizer -> its step's estimate

return C
