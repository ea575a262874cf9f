-- A GPT-2-small optimizer step from Python (libmuon.Optimizer over torch
-- tensors: tests/bench/python_step.py) against the same step from C
-- (mu_engine_step: tests/bench/step_host.c), same config, same process
-- layout, in one run: interleaved rounds, medians. Target: Python / C <= 1.03.
--   luajit tests/bench/python_bench.lua [ROUNDS] [STEPS]
local ROUNDS, STEPS = tonumber(arg[1] or "") or 5, tonumber(arg[2] or "") or 3

local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua")
local capture, median, sh = B.capture, B.median, B.sh

local build = os.getenv("MUON_BUILD") or "build"
local host = build .. "/bench/step_host"
local py = io.open("/usr/bin/python3") and "/usr/bin/python3" or "python3"
if os.execute("make -s " .. host .. " >/dev/null 2>&1") ~= 0 then
  print("python_bench: cannot build " .. host .. "; skipped")
  return
end
if not capture(sh(py) .. " -c 'import cffi, numpy; print(1)'"):find("^1") then
  print("python_bench: " .. py .. " has no cffi or numpy; skipped")
  return
end
local config = os.tmpname()
local f = assert(io.open(config, "w"))
f:write('return { groups = { { name = "hidden", optimizer = "muon", match = "^h%." }, '
  .. '{ name = "embed", optimizer = "adamw", match = ".*" } } }\n')
f:close()

local function result(cmd)
  local out = capture("env -u OPENBLAS_CORETYPE " .. cmd)
  local t, own = out:match("RESULT (%S+) ?(%S*)")
  if not t then error("python_bench: a run failed:\n" .. out) end
  return tonumber(t), tonumber(own)
end

local c, p, own = {}, {}, {}
for r = 1, ROUNDS do
  c[r] = result(("%s %s %d"):format(host, sh(config), STEPS))
  p[r], own[r] = result(("PYTHONPATH=src %s tests/bench/python_step.py %s %d"):format(sh(py), sh(config), STEPS))
  print(("round %d/%d: C %.1f ms/step, Python %.1f ms/step"):format(r, ROUNDS, c[r] * 1e3, p[r] * 1e3))
end
os.remove(config)
local core = capture(("PYTHONPATH=src %s -c %s"):format(sh(py), sh("import libmuon; print(libmuon.blas_info()['core'])")))
local has_torch = capture(sh(py) .. " -c 'import torch; print(1)'"):find("^1") ~= nil
print(("GPT-2 small step (72 Muon matrices, 50257x768 AdamW), OpenBLAS %s core, %s; medians of %d "
  .. "interleaved rounds of %d steps"):format(core:match("%S+") or "?", has_torch and "torch tensors" or "NumPy arrays",
  ROUNDS, STEPS))
print(("%-10s %10s"):format("host", "ms/step"))
print(("%-10s %10.1f"):format("C", median(c) * 1e3))
print(("%-10s %10.1f"):format("Python", median(p) * 1e3))
print(("Python / C = %.3f (target <= 1.03); the package's own work per step (checking and handing over the "
  .. "73 gradients): %.3f ms = %.4f%% of the C step"):format(median(p) / median(c), median(own) * 1e3,
  100 * median(own) / median(c)))
