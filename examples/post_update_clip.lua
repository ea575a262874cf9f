-- Hook experiment: post_update_fn logs the RMS of each applied update and
-- clips weight norms.
--
-- post_update_fn(param, local_tensor, ctx) runs after every Muon step, once
-- per parameter, with ctx = { param_fqn, logical_shape, lr, weight_decay,
-- step }. Here it (1) measures the update actually applied (new - old
-- weights): Muon's scale sqrt(max(A, B)) * matched_adamw_rms makes its RMS
-- about lr * matched_adamw_rms, whatever the matrix shape; and (2) rescales
-- any weight whose Frobenius norm exceeds max_norm back to max_norm. The
-- gradient used here is -W, which pushes every norm up.
--
--   build/muon run examples/post_update_clip.lua [steps] [max_norm]
local muon = require("muon")
local T = muon.tensor
local foreach = require("muon.foreach")

local steps = tonumber(arg and arg[1]) or 6
local max_norm = tonumber(arg and arg[2]) or 33.0
local lr, rms = 0.05, 0.2

local shapes = { ["mlp.up"] = { 64, 16 }, ["mlp.down"] = { 16, 64 }, ["attn.wo"] = { 32, 32 } }
local order = { "mlp.up", "mlp.down", "attn.wo" }
local params, prev = {}, {}
for i, name in ipairs(order) do
  local w = T.randn(shapes[name], i)
  params[i] = muon.param(name, w, T.zeros(shapes[name]))
  prev[name] = w:clone()
end

local log = {}
local function log_and_clip(param, w, ctx)
  -- RMS of the update just applied, relative to lr.
  local a, b = w:flat(), prev[ctx.param_fqn]:flat()
  local ss = 0
  for i = 1, #a do ss = ss + (a[i] - b[i]) ^ 2 end
  local update_rms = math.sqrt(ss / #a)
  -- Clip the weight norm.
  local norm = w:norm()
  local clipped = norm > max_norm
  if clipped then foreach.scale({ w }, max_norm / norm) end
  prev[ctx.param_fqn]:copy(w)
  log[#log + 1] = { step = ctx.step, name = ctx.param_fqn, rms = update_rms, ratio = update_rms / ctx.lr,
                    norm = norm, after = w:norm(), clipped = clipped }
  print(("step %d  %-8s %-6s update rms %.5f (= %.3f x lr)  norm %.3f%s"):format(ctx.step, ctx.param_fqn,
    table.concat(ctx.logical_shape, "x"), update_rms, update_rms / ctx.lr, norm,
    clipped and (" -> clipped to %.3f"):format(w:norm()) or ""))
end

local opt = muon.optim.Muon(params, { lr = lr, weight_decay = 0, matched_adamw_rms = rms, post_update_fn = log_and_clip })
for _ = 1, steps do
  for _, p in ipairs(params) do
    p.grad:copy(p.value)
    foreach.scale({ p.grad }, -1) -- gradient -W: the update grows the weights
  end
  opt:step()
end

local min_ratio, max_ratio, max_after, nclipped = math.huge, 0, 0, 0
for _, e in ipairs(log) do
  min_ratio = math.min(min_ratio, e.ratio)
  max_ratio = math.max(max_ratio, e.ratio)
  if e.clipped then nclipped = nclipped + 1 end
  max_after = math.max(max_after, e.after)
end
print(("result: calls %d  update_rms/lr min %.4f max %.4f  clipped %d  max_norm_after %.4f")
  :format(#log, min_ratio, max_ratio, nclipped, max_after))
print((#log == steps * #params and max_after <= max_norm * (1 + 1e-5) and nclipped > 0)
  and "OK: every update was logged and every norm stays within max_norm" or "UNEXPECTED: see above")
