-- Hook experiment: Newton-Schulz per block of a fused QKV matrix.
--
-- Attention layers often store W_q, W_k, W_v fused as one (3d x d) matrix.
-- Plain Muon orthogonalizes the fused matrix as a whole; with an
-- ns_transform_fn it can orthogonalize the three (d x d) blocks separately,
-- which is exactly what Muon does to three separate parameters. This script
-- trains the three layouts on the same gradients and compares:
--   fused + ns_transform_fn   vs   separate q, k, v     (equal)
--   fused, no transform       vs   separate q, k, v     (different)
--
--   build/muon run examples/qkv_split.lua [steps] [d]
local muon = require("muon")
local T = muon.tensor

local steps = tonumber(arg and arg[1]) or 5
local d = tonumber(arg and arg[2]) or 16
local opts = { lr = 0.02, weight_decay = 0.1, momentum = 0.95, nesterov = true }

-- The hook: three row blocks of the NS input, and how to write their
-- orthogonalized updates back into the fused update.
local function split_qkv(name, x)
  if not name:match("qkv") then return nil end
  local rows = x:size(1) / 3
  local blocks = { x:narrow(1, 1, rows), x:narrow(1, rows + 1, rows), x:narrow(1, 2 * rows + 1, rows) }
  return {
    tensors = blocks,
    restore = function(updates, output)
      for i = 1, 3 do output:narrow(1, (i - 1) * rows + 1, rows):copy(updates[i]) end
    end,
  }
end

local function with(extra)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- Same initial weights and gradients for every layout.
local w0 = T.randn({ 3 * d, d }, 1)
local grads = {}
for s = 1, steps do grads[s] = T.randn({ 3 * d, d }, 100 + s) end

-- 1) fused with the hook, 2) fused without, 3) three separate parameters.
local fused_w, fused_g = w0:clone(), T.zeros({ 3 * d, d })
local plain_w, plain_g = w0:clone(), T.zeros({ 3 * d, d })
local sep_w, sep_g = {}, {}
for i = 1, 3 do
  sep_w[i] = w0:narrow(1, (i - 1) * d + 1, d):clone()
  sep_g[i] = T.zeros({ d, d })
end

local fused = muon.optim.Muon({ muon.param("layer.attn.qkv", fused_w, fused_g) }, with({ ns_transform_fn = split_qkv }))
local plain = muon.optim.Muon({ muon.param("layer.attn.qkv", plain_w, plain_g) }, with())
local sep_params = {}
for i, n in ipairs({ "q", "k", "v" }) do sep_params[i] = muon.param("layer.attn." .. n, sep_w[i], sep_g[i]) end
local separate = muon.optim.Muon(sep_params, with())

local function max_diff(a, b)
  local x, y = a:flat(), b:flat()
  local m = 0
  for i = 1, #x do m = math.max(m, math.abs(x[i] - y[i])) end
  return m
end

local function diff_to_separate(w)
  local m = 0
  for i = 1, 3 do m = math.max(m, max_diff(w:narrow(1, (i - 1) * d + 1, d), sep_w[i])) end
  return m
end

print(("fused QKV (%dx%d) vs separate q, k, v (%dx%d each), %d Muon steps"):format(3 * d, d, d, d, steps))
for s = 1, steps do
  fused_g:copy(grads[s])
  plain_g:copy(grads[s])
  for i = 1, 3 do sep_g[i]:copy(grads[s]:narrow(1, (i - 1) * d + 1, d)) end
  fused:step()
  plain:step()
  separate:step()
  print(("step %d  max|fused+split - separate| = %.3e   max|fused - separate| = %.3e")
    :format(s, diff_to_separate(fused_w), diff_to_separate(plain_w)))
end
local split_diff, plain_diff = diff_to_separate(fused_w), diff_to_separate(plain_w)
print(("result: split_vs_separate %.3e  unsplit_vs_separate %.3e"):format(split_diff, plain_diff))
print(split_diff < 1e-6 and plain_diff > 1e-4 and "OK: ns_transform_fn makes the fused matrix train like three parameters"
  or "UNEXPECTED: see the differences above")
