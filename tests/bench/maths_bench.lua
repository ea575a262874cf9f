-- Tensor maths for ports (`make bench`): the ops of lua/muon/tensor_math.lua
-- on float32 tensors a small model port uses (a 1M-element activation, a
-- 512 x 4096 logits matrix), and the same ops in torch (one thread: our
-- kernels use one) when /usr/bin/python3 has it. Medians of 9 runs each,
-- ours and torch's measured in the same run.
--   luajit tests/bench/maths_bench.lua
local muon = require("muon")
local T = muon.tensor
local here = arg[0]:match("^(.*)/[^/]*$") or "."
local B = dofile(here .. "/lib.lua")

local REPS = 9
local function median_time(fn)
  fn()
  local ts = {}
  for i = 1, REPS do
    local t0 = B.now()
    fn()
    ts[i] = B.now() - t0
  end
  return B.median(ts)
end

local x = T.randn({ 1024, 1024 }, 1)
local logits = T.randn({ 512, 4096 }, 2)
local labels = T.zeros({ 512, 1 })
for i = 1, 512 do labels:set((i * 37) % 4096 + 1, i, 1) end
local parts = { T.randn({ 256, 1024 }, 3), T.randn({ 256, 1024 }, 4), T.randn({ 512, 1024 }, 5) }
local y = x:clone()

local cases = {
  { "exp_ (1M)", function() y:copy(x):exp_() end },
  { "sigmoid (1M)", function() return x:sigmoid() end },
  { "tanh (1M)", function() return x:tanh() end },
  { "pow(2) (1M)", function() return x:pow(2) end },
  { "pow(2.5) of |x| (1M)", function() return y:copy(x):abs_():pow_(2.5) end },
  { "softmax(2) 512x4096", function() return logits:softmax(2) end },
  { "log_softmax(2) 512x4096", function() return logits:log_softmax(2) end },
  { "softmax(1) 512x4096", function() return logits:softmax(1) end },
  { "argmax(2) 512x4096", function() return logits:argmax(2) end },
  { "gather(2, labels) 512x4096", function() return logits:gather(2, labels) end },
  { "cat(3 parts, 1) 1024x1024", function() return T.cat(parts, 1) end },
}

local torch = {}
if os.execute("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0 then
  for line in B.capture("/usr/bin/python3 " .. B.sh(here .. "/maths_torch.py")):gmatch("[^\n]+") do
    local name, t = line:match("^(.-)=([%d.e+-]+)$")
    if name then torch[name] = tonumber(t) end
  end
end

local info = muon.blas_info()
print(("tensor maths, float32, medians of %d runs (OpenBLAS core %s; one thread)"):format(REPS, info.core))
print(("%-30s %10s %10s %8s"):format("op", "muon ms", "torch ms", "ratio"))
for _, c in ipairs(cases) do
  local t = median_time(c[2]) * 1e3
  local tt = torch[c[1]] and torch[c[1]] * 1e3
  print(("%-30s %10.3f %10s %8s"):format(c[1], t, tt and ("%.3f"):format(tt) or "-", tt and ("%.2f"):format(t / tt) or "-"))
end
