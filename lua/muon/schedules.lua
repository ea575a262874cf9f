-- Learning-rate schedules for configs: each returns a function(step, group)
-- suitable as a config's `schedule`, giving { lr = ... } from group.base_lr.
-- Steps count from 1 (the engine's first step is step 1), so a linear
-- warmup over `warmup` steps gives base_lr / warmup at step 1 and the full
-- base_lr at step `warmup`: no step runs at lr 0.
--
--   schedules.warmup_cosine(warmup, total, floor)   linear warmup, cosine to floor x base lr at total
--   schedules.warmup_constant(warmup)                linear warmup, then the base lr
--   schedules.wsd(warmup, stable, decay, min_ratio, shape)
--                                                    warmup-stable-decay (below)
--[[ reference muon.schedules
    Learning-rate schedules for a config's schedule key: each returns a
    function(step, group) giving { lr = group.base_lr * factor }. Steps
    count from 1, so no step runs at lr 0. Bad arguments are EINVAL naming
    them.
muon.schedules.warmup_cosine(warmup, total, floor)
    Linear warmup over warmup steps (step / warmup), then a cosine from 1
    to floor (default 0.1) at step total, constant after.
muon.schedules.warmup_constant(warmup)
    Linear warmup over warmup steps, then the base lr.
muon.schedules.wsd(warmup, stable, decay, min_ratio, shape)
    Warmup-stable-decay: s / warmup up to warmup; 1 for stable steps (may
    be math.huge); then min_ratio + (1 - min_ratio) * shape(p),
    p = (s - warmup - stable) / decay, reaching min_ratio (in [0, 1]) at the
    last decay step and staying there. shape = "cosine": 0.5 (1 + cos(pi
    p)); "linear": 1 - p; "sqrt": 1 - sqrt(p).
]]
local E = require("muon.errors")

local S = {}

local function check(name, v, min, max)
  if type(v) ~= "number" or v ~= v or v < min or (max and v > max) then
    E.blame(E.EINVAL, "%s must be a number %s, got %s", name,
      max and ("in [%s, %s]"):format(tostring(min), tostring(max)) or (">= " .. tostring(min)), E.value(v))
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

-- Warmup-stable-decay (WSD: MiniCPM, Hu et al. 2024; Kimi K2 trained with
-- it: 500 warmup steps, a constant lr, then a cosine decay to 0.1 of it).
-- The base lr times, at step s:
--   s <= warmup                  s / warmup (linear from 0; 1 at step warmup)
--   s <= warmup + stable         1 (stable may be math.huge: decay never starts)
--   s <= warmup + stable + decay min_ratio + (1 - min_ratio) * shape(p),
--                                p = (s - warmup - stable) / decay in (0, 1]
--   after                        min_ratio (reached exactly at the last decay step)
-- shape: "cosine" (0.5 (1 + cos(pi p)), the default, as Kimi K2 and
-- transformers' get_wsd_schedule), "linear" (1 - p, torchtitan's default and
-- MiniCPM's), or "sqrt" (1 - sqrt(p), Hagele et al. 2024). transformers
-- counts from step 0 and gives lr 0 to the first update; torchtitan gives it
-- base_lr / (warmup + 1) and reaches the full lr one step after the warmup:
-- here the first update gets base_lr / warmup and update `warmup` the full
-- lr, as warmup_cosine above.
local SHAPES = {
  cosine = function(p) return 0.5 * (1 + math.cos(math.pi * p)) end,
  linear = function(p) return 1 - p end,
  sqrt = function(p) return 1 - math.sqrt(p) end,
}

function S.wsd(warmup, stable, decay, min_ratio, shape)
  check("wsd: warmup", warmup, 0)
  check("wsd: stable", stable, 0)
  check("wsd: decay", decay, 0)
  check("wsd: min_ratio", min_ratio, 0, 1)
  shape = shape == nil and "cosine" or shape
  local f = SHAPES[shape]
  if not f then E.blame(E.EINVAL, "wsd: %s", E.unknown("shape", shape, SHAPES)) end
  local decay_start = warmup + stable
  return function(step, group)
    local m
    if step <= warmup then
      m = warmup > 0 and step / warmup or 0 -- (0 only at step 0, which the engine never runs)
    elseif step <= decay_start then
      m = 1
    elseif step < decay_start + decay then
      m = min_ratio + (1 - min_ratio) * f((step - decay_start) / decay)
    else
      m = min_ratio
    end
    return { lr = group.base_lr * m }
  end
end

return S
