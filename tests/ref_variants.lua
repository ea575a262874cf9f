-- Independent double-precision references for the Muon variants (plain
-- Lua, small matrices), written from their formulas (not from the engine's
-- code) for the variant specs: NorMuon, cautious weight decay, spectral
-- scaling and conv flattening are options of ref_muon's muon_step; here is
-- MuonClip's QK-clip.
-- Parameters are { value = flat row-major array, grad = flat, shape = {...} }.
local R = require("ref_muon")

local V = {}

-- The variants of the Muon step itself (NorMuon, cautious decay, spectral
-- scale, flatten) are options of ref_muon's muon_step.
V.muon_step = R.muon_step

-- MuonClip's QK-clip on a (heads * head_dim, d) query or key weight: each
-- head whose max logit S_h exceeds tau has its rows scaled by sqrt(tau / S_h).
function V.qk_clip(p, heads, max_logits, tau)
  local rows, cols = p.shape[1], p.shape[2]
  local hd = rows / heads
  for h = 1, heads do
    local s = max_logits[h]
    if s > tau then
      local f = math.sqrt(tau / s)
      for i = (h - 1) * hd + 1, h * hd do
        for j = 1, cols do
          local k = (i - 1) * cols + j
          p.value[k] = p.value[k] * f
        end
      end
    end
  end
end

-- A Muon step with hooks around Newton-Schulz, double precision, written
-- from the variants' formulas: momentum as ref_muon; then per core matrix s
-- (0-based) X = pre(X, p, s) on the Newton-Schulz input (rows x cols
-- arrays), O = NS(X), O = post(O, p, s); whole(Os, p) on the list of every
-- core matrix's O (a whole-parameter hook); the seed's scale (o.scale: 1
-- when the config scales by 1), decay and apply.
function V.hooked_step(params, o, hooks)
  local m1 = o.momentum or 0.95
  local lr, wd = o.lr, o.weight_decay
  local coeffs = R.schedule("asym5", 5)
  for _, p in ipairs(params) do
    local u = R.momentum(p, m1, m1, true) -- nesterov
    local count, A, B = R.cores(p.shape)
    local scale = o.scale or math.sqrt(math.max(A, B)) * 0.2
    local Os = {}
    for s = 0, count - 1 do
      local X = R.core_matrix(u, s, A, B)
      if hooks.pre then X = hooks.pre(X, p, s) end
      local O = R.ns(X, coeffs, 1e-10)
      if hooks.post then O = hooks.post(O, p, s) end
      Os[s + 1] = O
    end
    if hooks.whole then hooks.whole(Os, p) end
    for s = 0, count - 1 do
      for i = 1, A do
        for j = 1, B do
          local k = s * A * B + (i - 1) * B + j
          p.value[k] = p.value[k] * (1 - lr * wd) - lr * scale * Os[s + 1][i][j]
        end
      end
    end
    if hooks.after then hooks.after(p) end
  end
end

local function map(X, f)
  local Y = {}
  for i = 1, #X do
    Y[i] = {}
    for j = 1, #X[i] do Y[i][j] = f(X[i][j], i, j) end
  end
  return Y
end

-- AdaMuon (configs/adamuon.lua): sign(M) into Newton-Schulz; v = b2 v + (1 - b2) O^2
-- per element (p.v, from 0); O' = O / (sqrt(v) + eps); O' = O' 0.2 sqrt(rows cols) / ||O'||_F.
function V.adamuon_hooks(beta2, eps)
  return {
    pre = function(X) return map(X, function(x) return x > 0 and 1 or (x < 0 and -1 or 0) end) end,
    post = function(O, p, s)
      p.v = p.v or {}
      local A, B = #O, #O[1]
      local Op = map(O, function(x, i, j)
        local key = s * A * B + (i - 1) * B + j
        p.v[key] = beta2 * (p.v[key] or 0) + (1 - beta2) * x * x
        return x / (math.sqrt(p.v[key]) + eps)
      end)
      local f = 0.2 * math.sqrt(A * B) / (R.frob(Op) + 1e-30)
      return map(Op, function(x) return x * f end)
    end,
  }
end

-- The inverse of a square matrix by Gauss-Jordan elimination with partial pivoting.
function V.inverse(a)
  local n = #a
  local m = {}
  for i = 1, n do
    m[i] = {}
    for j = 1, n do m[i][j] = a[i][j] end
    for j = 1, n do m[i][n + j] = i == j and 1 or 0 end
  end
  for c = 1, n do
    local best = c
    for r = c + 1, n do if math.abs(m[r][c]) > math.abs(m[best][c]) then best = r end end
    m[c], m[best] = m[best], m[c]
    local pv = m[c][c]
    for j = 1, 2 * n do m[c][j] = m[c][j] / pv end
    for r = 1, n do
      if r ~= c then
        local f = m[r][c]
        for j = 1, 2 * n do m[r][j] = m[r][j] - f * m[c][j] end
      end
    end
  end
  local inv = {}
  for i = 1, n do
    inv[i] = {}
    for j = 1, n do inv[i][j] = m[i][n + j] end
  end
  return inv
end

-- Newton-Muon (configs/newton_muon.lua): per core matrix, K = b2 K + (1 - b2) S
-- (p.K[s], from 0; S = p.zz, cols x cols), A = K + (damping tr(K) / cols + tiny) I,
-- G' = G A^-1 (the exact inverse).
function V.newton_muon_hooks(beta2, damping, tiny)
  return {
    pre = function(G, p, s)
      local B = #G[1]
      p.K = p.K or {}
      local K = p.K[s] or map(p.zz, function() return 0 end)
      K = map(K, function(x, i, j) return beta2 * x + (1 - beta2) * p.zz[i][j] end)
      p.K[s] = K
      local tr = 0
      for i = 1, B do tr = tr + K[i][i] end
      local gamma = damping * tr / B + tiny
      local Am = map(K, function(x, i, j) return x + (i == j and gamma or 0) end)
      return R.matmul(G, V.inverse(Am))
    end,
  }
end

-- MuonH (configs/muonh.lua): O <- R O / max(||O||_F, eps) over the whole
-- parameter; W <- W - lr O; W <- R W / max(||W||_F, eps); R = sqrt(rows).
function V.muonh_hooks(radius, eps)
  return {
    whole = function(Os, p)
      local ss = 0
      for _, O in ipairs(Os) do ss = ss + R.frob(O) ^ 2 end
      local f = radius(p.shape) / math.max(math.sqrt(ss), eps)
      for k, O in ipairs(Os) do Os[k] = map(O, function(x) return x * f end) end
    end,
    after = function(p)
      local ss = 0
      for _, x in ipairs(p.value) do ss = ss + x * x end
      local f = radius(p.shape) / math.max(math.sqrt(ss), eps)
      for k, x in ipairs(p.value) do p.value[k] = x * f end
    end,
  }
end

return V
