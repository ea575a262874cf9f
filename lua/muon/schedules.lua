-- Learning-rate schedules for configs: each returns a function(step, group)
-- suitable as a config's `schedule`, giving { lr = ... } from group.base_lr.
local E = require("muon.errors")

local S = {}

local function check(name, v, min)
  if type(v) ~= "number" or v ~= v or v < min then
    E.blame(E.EINVAL, "%s must be a number >= %s, got %s", name, tostring(min), tostring(v))
  end
end

-- Linear warmup over `warmup` steps, then cosine decay to `floor` * base_lr
-- at step `total` (constant after).
function S.warmup_cosine(warmup, total, floor)
  floor = floor or 0.1
  check("warmup", warmup, 0)
  check("total", total, warmup)
  check("floor", floor, 0)
  return function(step, group)
    local f
    if step <= warmup then
      f = step / math.max(warmup, 1)
    else
      local t = math.min(1, (step - warmup) / math.max(1, total - warmup))
      f = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
    end
    return { lr = group.base_lr * f }
  end
end

-- Constant lr after a linear warmup.
function S.warmup_constant(warmup)
  check("warmup", warmup, 0)
  return function(step, group)
    return { lr = group.base_lr * math.min(1, step / math.max(warmup, 1)) }
  end
end

return S
