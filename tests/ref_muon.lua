-- An independent double-precision Muon in plain Lua (small matrices only):
-- the seed's algorithm written from its formulas, for the specs to compare
-- the C/LuaJIT engine against. Matrices are Lua arrays of rows.
local R = {}

function R.matmul(a, b)
  local n, k, m = #a, #b, #b[1]
  local c = {}
  for i = 1, n do
    local row, ai = {}, a[i]
    for j = 1, m do
      local s = 0
      for t = 1, k do s = s + ai[t] * b[t][j] end
      row[j] = s
    end
    c[i] = row
  end
  return c
end

function R.transpose(a)
  local t = {}
  for j = 1, #a[1] do
    t[j] = {}
    for i = 1, #a do t[j][i] = a[i][j] end
  end
  return t
end

function R.frob(a)
  local s = 0
  for i = 1, #a do
    for j = 1, #a[i] do s = s + a[i][j] ^ 2 end
  end
  return math.sqrt(s)
end

R.LEGACY = { 3.4445, -4.7750, 2.0315 }
R.ASYM5 = {
  { 4.0848, -6.8946, 2.9270 }, { 3.9505, -6.3029, 2.6377 }, { 3.7418, -5.5913, 2.3037 },
  { 2.8769, -3.1427, 1.2046 }, { 2.8366, -3.0525, 1.2012 },
}

function R.schedule(variant, steps, custom)
  local s = {}
  for i = 1, steps do
    if variant == "legacy" then s[i] = R.LEGACY
    elseif variant == "asym5" then s[i] = R.ASYM5[i]
    else s[i] = custom[i] end
  end
  return s
end

-- The seed's zeropower_via_newtonschulz5 on one matrix.
function R.ns(x, coeffs, eps, norm_scale)
  local transposed = #x > #x[1]
  if transposed then x = R.transpose(x) end
  local nrm = (norm_scale or 1) * R.frob(x) + eps
  local X = {}
  for i = 1, #x do
    X[i] = {}
    for j = 1, #x[1] do X[i][j] = x[i][j] / nrm end
  end
  for _, c in ipairs(coeffs) do
    local A = R.matmul(X, R.transpose(X))
    local AA = R.matmul(A, A)
    local B = {}
    for i = 1, #A do
      B[i] = {}
      for j = 1, #A do B[i][j] = c[2] * A[i][j] + c[3] * AA[i][j] end
    end
    local BX = R.matmul(B, X)
    for i = 1, #X do
      for j = 1, #X[1] do X[i][j] = c[1] * X[i][j] + BX[i][j] end
    end
  end
  if transposed then X = R.transpose(X) end
  return X
end

-- Singular values of a matrix (rows of doubles), ascending: sqrt of the
-- eigenvalues of X X^T (the smaller side), cyclic Jacobi in double.
function R.singular_values(x)
  if #x > #x[1] then x = R.transpose(x) end
  local S = R.matmul(x, R.transpose(x))
  local n = #S
  for _ = 1, 50 do
    local off = 0
    for p = 1, n - 1 do for q = p + 1, n do off = off + S[p][q] ^ 2 end end
    if off < 1e-26 then break end
    for p = 1, n - 1 do
      for q = p + 1, n do
        if math.abs(S[p][q]) > 1e-300 then
          local theta = (S[q][q] - S[p][p]) / (2 * S[p][q])
          local tt = (theta >= 0 and 1 or -1) / (math.abs(theta) + math.sqrt(theta * theta + 1))
          local c = 1 / math.sqrt(tt * tt + 1)
          local s = tt * c
          for k = 1, n do
            local skp, skq = S[k][p], S[k][q]
            S[k][p] = c * skp - s * skq
            S[k][q] = s * skp + c * skq
          end
          for k = 1, n do
            local spk, sqk = S[p][k], S[q][k]
            S[p][k] = c * spk - s * sqk
            S[q][k] = s * spk + c * sqk
          end
        end
      end
    end
  end
  local sv = {}
  for i = 1, n do sv[i] = math.sqrt(math.max(S[i][i], 0)) end
  table.sort(sv)
  return sv
end

-- Core (A, B) slices of a flat row-major array of the given shape.
local function core(shape)
  local n = #shape
  if n == 2 then return shape[1], shape[2] end
  if n == 3 and shape[2] == 1 then return shape[1], shape[3] end
  return shape[n - 1], shape[n]
end
R.core = core

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end
R.numel = numel

-- The core matrices of a shape: (count, rows, cols); nd_mode "flatten"
-- makes an N-D parameter one rows x (the rest) matrix (KellerJordan / dion).
function R.cores(shape, nd_mode)
  local n = numel(shape)
  if nd_mode == "flatten" and #shape >= 3 then return 1, shape[1], n / shape[1] end
  local a, b = core(shape)
  return n / (a * b), a, b
end

-- The momentum of one parameter on flat arrays (p.buf from 0, updated):
-- buf = m2 buf + g; the update u = g + m1 buf (the old buf), then m1 u + g
-- with nesterov. Returns u.
function R.momentum(p, m1, m2, nesterov)
  p.buf = p.buf or {}
  local u = {}
  for i = 1, #p.value do
    local b, g = p.buf[i] or 0, p.grad[i]
    u[i] = g + m1 * b
    p.buf[i] = m2 * b + g
    if nesterov then u[i] = m1 * u[i] + g end
  end
  return u
end

-- Core matrix s (0-based) of a flat array of A x B matrices, as rows.
function R.core_matrix(u, s, A, B)
  local X = {}
  for i = 1, A do
    X[i] = {}
    for j = 1, B do X[i][j] = u[s * A * B + (i - 1) * B + j] end
  end
  return X
end

-- One Muon step in double precision on flat arrays.
-- params: { value = flat, grad = flat, shape = {...}, buf = flat or nil, v = NorMuon state or nil }
-- o: the seed's options, plus the variants:
--   scale_mode = "matched_adamw_rms" | "keller" | "spectral" (sqrt(rows / cols))
--   weight_decay_mode = "decoupled" | "cautious" (decay where step * p > 0)
--   nd_mode = "batch" | "flatten"
--   normuon = { beta2, eps } (after Newton-Schulz, per core matrix O:
--     v = b2 v + (1 - b2) mean(O^2 along cols); O' = O / (sqrt(v) + eps);
--     O' = O' ||O||_F / (||O'||_F + eps))
-- Updates p.value, p.buf (and p.v).
function R.muon_step(params, o)
  local m = o.momentum or 0.95
  local m1, m2
  if type(m) == "table" then m1, m2 = m[1], m[#m] else m1, m2 = m, m end
  local nesterov = o.nesterov ~= false
  local lr, wd = o.lr or 2e-2, o.weight_decay or 0.1
  local rms = o.matched_adamw_rms == nil and 0.2 or o.matched_adamw_rms
  local coeffs = R.schedule(o.ns_variant or "asym5", o.ns_steps or 5, o.ns_coefficients)
  local eps = o.ns_epsilon or 1e-10
  for _, p in ipairs(params) do
    local n = #p.value
    local u = R.momentum(p, m1, m2, nesterov)
    local count, A, B = R.cores(p.shape, o.nd_mode)
    local scale
    if o.scale_mode == "keller" then scale = math.sqrt(math.max(1, A / B))
    elseif o.scale_mode == "spectral" then scale = math.sqrt(A / B)
    elseif rms == 0 then scale = o.zero_rms_scale_mode == "use_lr" and 1 or 0
    else scale = math.sqrt(math.max(A, B)) * rms end
    local step = {} -- the scaled update the seed subtracts: p = p (1 - lr wd) - lr step
    for s = 0, count - 1 do
      local O = R.ns(R.core_matrix(u, s, A, B), coeffs, eps)
      if o.normuon then
        local b2, e = o.normuon.beta2, o.normuon.eps
        p.v = p.v or {}
        local norm_o = R.frob(O)
        local Op = {}
        for i = 1, A do
          local ms = 0
          for j = 1, B do ms = ms + O[i][j] ^ 2 end
          local key = s * A + i
          p.v[key] = b2 * (p.v[key] or 0) + (1 - b2) * (ms / B)
          Op[i] = {}
          for j = 1, B do Op[i][j] = O[i][j] / (math.sqrt(p.v[key]) + e) end
        end
        local f = norm_o / (R.frob(Op) + e)
        for i = 1, A do
          for j = 1, B do Op[i][j] = Op[i][j] * f end
        end
        O = Op
      end
      for i = 1, A do
        for j = 1, B do step[s * A * B + (i - 1) * B + j] = scale * O[i][j] end
      end
    end
    for k = 1, n do
      local x = p.value[k]
      if o.weight_decay_mode == "cautious" then
        local mask = (step[k] * x > 0) and 1 or 0
        p.value[k] = x - lr * wd * (x * mask) - lr * step[k]
      else -- (apply_lr_in_update moves -lr into the scale: the same in exact arithmetic)
        p.value[k] = x * (1 - lr * wd) - lr * step[k]
      end
    end
  end
end

-- AdamW as torch.optim.AdamW, double precision, flat arrays.
function R.adamw_step(p, o, step)
  local lr, b1, b2, eps, wd = o.lr, o.betas[1], o.betas[2], o.eps, o.weight_decay
  p.m = p.m or {}
  p.v = p.v or {}
  local bc1, bc2 = 1 - b1 ^ step, 1 - b2 ^ step
  for i = 1, #p.value do
    local g = p.grad[i]
    p.value[i] = p.value[i] * (1 - lr * wd)
    p.m[i] = (p.m[i] or 0) + (1 - b1) * (g - (p.m[i] or 0))
    p.v[i] = b2 * (p.v[i] or 0) + (1 - b2) * g * g
    local denom = math.sqrt(p.v[i]) / math.sqrt(bc2) + eps
    p.value[i] = p.value[i] - (lr / bc1) * p.m[i] / denom
  end
end

return R
