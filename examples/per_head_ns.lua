-- Hook experiment: Newton-Schulz per attention head with reshape_fn.
--
-- A query projection W_q of shape (heads*head_dim x d) holds one
-- (head_dim x d) block per head. reshape_fn returns a 3-D view
-- (heads, head_dim, d) of the NS input; Muon treats a 3-D tensor as a batch
-- of its last two dims, so each head is orthogonalized on its own (and
-- scaled by sqrt(max(head_dim, d)) * matched_adamw_rms). The script checks
-- that this equals training one parameter per head, and differs from NS on
-- the whole matrix.
--
--   build/muon run examples/per_head_ns.lua [steps] [heads] [head_dim] [d]
local muon = require("muon")
local T = muon.tensor

local steps = tonumber(arg and arg[1]) or 4
local heads = tonumber(arg and arg[2]) or 4
local hd = tonumber(arg and arg[3]) or 8
local d = tonumber(arg and arg[4]) or 32

local function per_head(name, x)
  if name:match("%.wq$") then return { x:view({ heads, hd, d }) } end
  return nil -- other parameters: NS on the whole matrix
end

local function opts(extra)
  local o = { lr = 0.02, weight_decay = 0, momentum = 0.95, nesterov = true }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local w0 = T.randn({ heads * hd, d }, 7)
local grads = {}
for s = 1, steps do grads[s] = T.randn({ heads * hd, d }, 200 + s) end

local hw, hg = w0:clone(), T.zeros({ heads * hd, d })
local ww, wg = w0:clone(), T.zeros({ heads * hd, d })
local sw, sg, sp = {}, {}, {}
for h = 1, heads do
  sw[h] = w0:narrow(1, (h - 1) * hd + 1, hd):clone()
  sg[h] = T.zeros({ hd, d })
  sp[h] = muon.param(("blocks.0.head%d.wq"):format(h), sw[h], sg[h])
end
local with_hook = muon.optim.Muon({ muon.param("blocks.0.attn.wq", hw, hg) }, opts({ reshape_fn = per_head }))
local whole = muon.optim.Muon({ muon.param("blocks.0.attn.wq", ww, wg) }, opts())
local split = muon.optim.Muon(sp, opts())

local function max_diff_heads(w)
  local m = 0
  for h = 1, heads do
    local a, b = w:narrow(1, (h - 1) * hd + 1, hd):flat(), sw[h]:flat()
    for i = 1, #a do m = math.max(m, math.abs(a[i] - b[i])) end
  end
  return m
end

-- Rows of an orthogonalized (hd x d) head block are near-orthonormal up to
-- one common scale: report max |cos| between two different rows of the
-- update of head 1 after the first step (1e-1 or less; 0 would be exact).
local function max_row_cos(u)
  local r = u:totable()
  local m = 0
  for i = 1, #r do
    for j = i + 1, #r do
      local dot, ni, nj = 0, 0, 0
      for k = 1, #r[i] do
        dot = dot + r[i][k] * r[j][k]
        ni = ni + r[i][k] ^ 2
        nj = nj + r[j][k] ^ 2
      end
      m = math.max(m, math.abs(dot) / math.sqrt(ni * nj))
    end
  end
  return m
end

print(("W_q %dx%d = %d heads of %dx%d; %d Muon steps"):format(heads * hd, d, heads, hd, d, steps))
local cos
for s = 1, steps do
  hg:copy(grads[s])
  wg:copy(grads[s])
  for h = 1, heads do sg[h]:copy(grads[s]:narrow(1, (h - 1) * hd + 1, hd)) end
  local before = hw:narrow(1, 1, hd):clone()
  with_hook:step()
  whole:step()
  split:step()
  if s == 1 then
    local upd = hw:narrow(1, 1, hd):clone()
    local a, b = upd:flat(), before:flat()
    local delta = {}
    for i = 1, #a do delta[i] = a[i] - b[i] end
    cos = max_row_cos(T.from(delta, { hd, d }))
  end
  print(("step %d  max|per-head hook - one param per head| = %.3e   max|whole-matrix NS - per head| = %.3e")
    :format(s, max_diff_heads(hw), max_diff_heads(ww)))
end
local a, b = max_diff_heads(hw), max_diff_heads(ww)
print(("result: hook_vs_heads %.3e  whole_vs_heads %.3e  head1_max_row_cos %.3f"):format(a, b, cos))
print(a < 1e-6 and b > 1e-4 and "OK: reshape_fn runs Newton-Schulz per head" or "UNEXPECTED: see the differences above")
