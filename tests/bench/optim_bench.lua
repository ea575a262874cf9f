-- Lua scheduling overhead of a Muon step: the share of a step not spent
-- inside C (Newton-Schulz, fused foreach ops, tensor copies), for a
-- GPT-2-small parameter set, and the time per parameter for 1,000 tiny ones.
-- Targets: <= 2% of a GPT-2-small step; <= 10 us per tiny parameter.
local ffi = require("ffi")
local muon = require("muon")
local T = muon.tensor
local ns = require("muon.ns")
local foreach = require("muon.foreach")

ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } mu_bench_timespec;
int clock_gettime(int clk, mu_bench_timespec *ts);
]]
local ts = ffi.new("mu_bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- Time spent inside the C-backed calls the step makes.
local inside = 0
local function timed(tbl, name)
  local f = tbl[name]
  tbl[name] = function(...)
    local t0 = now()
    local a, b = f(...)
    inside = inside + (now() - t0)
    return a, b
  end
end
timed(ns, "zeropower_into")
for _, n in ipairs({ "momentum", "apply", "scale", "all_finite", "adamw" }) do timed(foreach, n) end
timed(T.methods, "copy")
timed(T.methods, "all_finite")

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local function run(opt, reps)
  opt:step() -- warm-up: allocates buffers and state
  local totals, overheads = {}, {}
  for r = 1, reps do
    inside = 0
    local t0 = now()
    opt:step()
    local total = now() - t0
    totals[r] = total
    overheads[r] = total - inside
  end
  return median(totals), median(overheads)
end

-- GPT-2 small: 12 layers of 4 x 768x768 attention, 768x3072 and 3072x768
-- MLP on Muon; the 50257x768 embedding on AdamW.
local gpt = {}
for l = 1, 12 do
  for _, s in ipairs({ { 768, 768 }, { 768, 768 }, { 768, 768 }, { 768, 768 }, { 768, 3072 }, { 3072, 768 } }) do
    local i = #gpt + 1
    gpt[i] = muon.param(("h.%d.w%d"):format(l, i), T.randn(s, i), T.randn(s, 1000 + i))
  end
end
local emb = muon.param("wte", T.randn({ 50257, 768 }, 7), T.randn({ 50257, 768 }, 8))
local mo = muon.optim.Muon(gpt)
local ao = muon.optim.AdamW({ emb })
local step = { step = function() mo:step() ao:step() end }
local total, over = run(step, 2)
print(("GPT-2 small (%d Muon matrices + 50257x768 AdamW): step %.0f ms, Lua overhead %.2f ms = %.3f%% of the step (target <= 2%%)")
  :format(#gpt, total * 1e3, over * 1e3, 100 * over / total))
gpt, mo, ao, emb = nil, nil, nil, nil
collectgarbage()

local tiny = {}
for i = 1, 1000 do
  tiny[i] = muon.param("t" .. i, T.randn({ 4, 4 }, i), T.randn({ 4, 4 }, 5000 + i))
end
local to = muon.optim.Muon(tiny)
local ttotal, tover = run(to, 5)
print(("1,000 tiny 4x4 parameters: step %.2f ms = %.2f us per parameter (Lua overhead %.2f us/param; target <= 10 us)")
  :format(ttotal * 1e3, ttotal * 1e6 / 1000, tover * 1e6 / 1000))
