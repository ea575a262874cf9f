-- One-process optimizer step (`make bench`): a GPT-2-small parameter set
-- (72 Muon matrices + the 50257x768 embedding on AdamW) and 1,000 tiny 4x4
-- Muon parameters, timed here and, in the same run, with the previous
-- implementation (BASELINE: the two-path step before lua/muon/step.lua),
-- built from git into /tmp; prints medians and new/old ratios, and the Lua
-- share of the step (the time not spent inside the C-backed calls).
-- Targets: no slowdown against the baseline; Lua <= 2% of a GPT-2-small
-- step; <= 10 us per tiny parameter.
--   luajit tests/bench/optim_bench.lua            (compare; skips the baseline without git)
--   luajit tests/bench/optim_bench.lua --measure  (one measurement, machine-readable)
local BASELINE = os.getenv("MU_BENCH_BASELINE") or "ceab6d5" -- (any revision; env to override)
local ROUNDS = tonumber(os.getenv("MU_BENCH_ROUNDS") or "5")

local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua")
local now, median, sh, capture = B.now, B.median, B.sh, B.capture

local function measure()
  local muon = require("muon")
  local T = muon.tensor
  local ns = require("muon.ns")
  local foreach = require("muon.foreach")
  -- The Lua share: time spent outside the C-backed calls the step makes,
  -- every function of muon.ns and muon.foreach (the step's kernels) but the
  -- two that only split lists by dtype and call back into Lua, and the
  -- tensor copies; a call made inside another timed call is not counted
  -- again. The wrappers are on only for the steps that measure the share:
  -- the step times (and the ratios against the baseline) run unwrapped.
  local inside, depth = 0, 0
  local function done(t0, ...) -- (passes every result on; the JIT keeps it)
    inside, depth = inside + (now() - t0), 0
    return ...
  end
  local originals = {} -- { table, name, function }
  local function add(tbl, name)
    if type(tbl[name]) == "function" then originals[#originals + 1] = { tbl, name, tbl[name] } end
  end
  for _, tbl in ipairs({ ns, foreach }) do
    for name in pairs(tbl) do
      if name ~= "per_dtype" and name ~= "split_dtype" then add(tbl, name) end
    end
  end
  for _, name in ipairs({ "copy", "all_finite", "clone", "fill", "zero" }) do add(T.methods, name) end
  local function instrument(on)
    for _, o in ipairs(originals) do
      local tbl, name, f = o[1], o[2], o[3]
      tbl[name] = not on and f or function(...)
        if depth > 0 then return f(...) end
        depth = 1
        return done(now(), f(...))
      end
    end
  end
  -- (median step time over reps, median Lua time over share_reps)
  local function run(step, reps, share_reps)
    step() -- warm-up: allocates buffers and state
    local totals, overheads = {}, {}
    for r = 1, reps do
      local t0 = now()
      step()
      totals[r] = now() - t0
    end
    instrument(true)
    for r = 1, share_reps do
      inside = 0
      local t0 = now()
      step()
      overheads[r] = now() - t0 - inside
    end
    instrument(false)
    return median(totals), median(overheads)
  end
  local total, over
  do -- (its tensors are freed before the tiny run)
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
    total, over = run(function() mo:step() ao:step() end, 3, 1)
  end
  collectgarbage()
  local tiny = {}
  for i = 1, 1000 do tiny[i] = muon.param("t" .. i, T.randn({ 4, 4 }, i), T.randn({ 4, 4 }, 5000 + i)) end
  local to = muon.optim.Muon(tiny)
  local ttotal, tover = run(function() to:step() end, 9, 9)
  return total, over, ttotal / 1000, tover / 1000
end

if arg[1] == "--measure" then
  print(("RESULT %.9f %.9f %.9f %.9f"):format(measure()))
  return
end


local base = B.baseline(BASELINE, "optim_bench")
local have_base = base ~= nil
if not have_base then io.write("optim_bench: no git baseline here; timing the current tree only\n") end

local function run_tree(dir, lib)
  local env = ("LUA_PATH=%s MUON_LIB=%s"):format(sh(dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;;"), sh(lib))
  local out = capture(("env -u OPENBLAS_CORETYPE %s luajit tests/bench/optim_bench.lua --measure"):format(env))
  local a, b, c, d = out:match("RESULT (%S+) (%S+) (%S+) (%S+)")
  if not a then error("optim_bench: a measurement failed:\n" .. out) end
  return { tonumber(a), tonumber(b), tonumber(c), tonumber(d) }
end

local here = io.popen("pwd"):read("*l")
local new, old = {}, {}
for r = 1, ROUNDS do -- interleaved, so that load on the machine hits both
  new[r] = run_tree(here, here .. "/build/libmuon.so")
  if have_base then old[r] = run_tree(base, base .. "/build/libmuon.so") end
  print(("round %d/%d: GPT-2 small step %.0f ms%s; tiny parameters %.2f us each%s"):format(r, ROUNDS, new[r][1] * 1e3,
    have_base and (" (old %.0f)"):format(old[r][1] * 1e3) or "", new[r][3] * 1e6,
    have_base and (" (old %.2f)"):format(old[r][3] * 1e6) or ""))
end
local function med(rows, i)
  local xs = {}
  for r, row in ipairs(rows) do xs[r] = row[i] end
  return median(xs)
end
local g, go, t, tl = med(new, 1), med(new, 2), med(new, 3), med(new, 4)
print(("GPT-2 small (72 Muon matrices + 50257x768 AdamW): step %.0f ms, Lua %.2f ms = %.3f%% of the step (target <= 2%%)")
  :format(g * 1e3, go * 1e3, 100 * go / g))
print(("1,000 tiny 4x4 parameters: %.2f us per parameter (Lua %.2f us; target <= 10 us)"):format(t * 1e6, tl * 1e6))
if have_base then
  local og, ot = med(old, 1), med(old, 3)
  print(("vs the previous implementation (%s), same run, medians of %d interleaved rounds:"):format(BASELINE, ROUNDS))
  print(("  GPT-2 small step: %.0f ms new, %.0f ms old: new/old = %.3f"):format(g * 1e3, og * 1e3, g / og))
  print(("  tiny parameters:  %.2f us new, %.2f us old: new/old = %.3f"):format(t * 1e6, ot * 1e6, t / ot))
end
