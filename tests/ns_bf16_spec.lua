-- Newton-Schulz in bfloat16 (ns.zeropower dtype = "bfloat16", the Muon
-- option ns_dtype): against an independent float64 emulation of the seed's
-- bfloat16 rounding, bits across threads, workers and batching, the option
-- in a Muon group and its checkpoint, and the errors.
local H = require("helpers")
local T = H.T
local ns = require("muon.ns")
local muon = require("muon")

-- Round-to-nearest-even of a double to `bits` significant bits (float32:
-- 24, bfloat16: 8), by arithmetic (no float32 hardware involved); the
-- values here are normal numbers of either format.
local function rne(v, bits)
  if v == 0 then return v end
  local _, e = math.frexp(v)
  local ulp = 2 ^ (e - bits)
  local q = v / ulp
  local f = math.floor(q)
  local d = q - f
  if d > 0.5 or (d == 0.5 and f % 2 == 1) then f = f + 1 end
  return f * ulp
end
-- bf16(float32(v)): how a float32 result (or torch's bf16 scalar) is rounded
local function rb(v) return rne(rne(v, 24), 8) end

-- The seed's bfloat16 iteration in float64 on bf16(x), rounding where its
-- torch code holds bfloat16 tensors (products summed exactly, then rounded
-- as a float32 result is). x: rows of a rows x cols matrix. Returns rows.
local function ref_bf16(x, coeffs, eps)
  local rows, cols = #x, #x[1]
  local tall = rows > cols
  local n, m = tall and cols or rows, tall and rows or cols
  -- the seed's input is bf16(x); its norm a bfloat16 tensor, + eps in
  -- bfloat16; the division in float32, rounded to bfloat16
  local ss = 0
  for i = 1, rows do for j = 1, cols do ss = ss + rb(x[i][j]) ^ 2 end end
  local d = rb(rb(math.sqrt(ss)) + rb(eps))
  local X = {}
  for i = 1, n do
    X[i] = {}
    for j = 1, m do X[i][j] = rb(rb(tall and x[j][i] or x[i][j]) / d) end
  end
  for _, c in ipairs(coeffs) do
    local a, b, cc = rb(c[1]), rb(c[2]), rb(c[3])
    local A, AA, B = {}, {}, {}
    for i = 1, n do
      A[i] = {}
      for j = 1, n do
        local acc = 0
        for k = 1, m do acc = acc + X[i][k] * X[j][k] end
        A[i][j] = rb(acc)
      end
    end
    for i = 1, n do
      AA[i], B[i] = {}, {}
      for j = 1, n do
        local acc = 0
        for k = 1, n do acc = acc + A[i][k] * A[k][j] end
        AA[i][j] = rb(acc)
        B[i][j] = rb(rb(b * A[i][j]) + rb(cc * AA[i][j]))
      end
    end
    local Y = {}
    for i = 1, n do
      Y[i] = {}
      for j = 1, m do
        local acc = 0
        for k = 1, n do acc = acc + B[i][k] * X[k][j] end
        Y[i][j] = rb(rb(a * X[i][j]) + rb(acc))
      end
    end
    X = Y
  end
  local out = {}
  for i = 1, rows do
    out[i] = {}
    for j = 1, cols do out[i][j] = tall and X[j][i] or X[i][j] end
  end
  return out
end

local function rows_of(t) -- 2-D tensor -> rows of doubles
  local p, r, c = t:contiguous():ptr(), t:size()[1], t:size()[2]
  local out = {}
  for i = 1, r do
    out[i] = {}
    for j = 1, c do out[i][j] = p[(i - 1) * c + j - 1] end
  end
  return out
end

describe("ns bfloat16", function()
  local coeffs = ns.coefficients("asym5", 5)

  -- Bitwise against the emulation except where oneDNN's float32 sum and
  -- the exact one round to different bfloat16 neighbours (rare on these
  -- short sums, and then it carries through): at least 90% of the
  -- elements bitwise, every one within 2^-6 of it (a few bf16 ulps of
  -- the largest); rounding the coefficients or any product differently
  -- breaks both.
  for _, shape in ipairs({ { 6, 10 }, { 10, 6 }, { 16, 40 }, { 33, 17 } }) do
    it(("matches the float64 emulation of its rounding at %dx%d"):format(shape[1], shape[2]), function()
      local x = T.randn(shape, 7 + shape[1])
      local got = rows_of(ns.zeropower(x, { dtype = "bfloat16" }))
      local want = ref_bf16(rows_of(x), coeffs, 1e-10)
      local same, total, worst = 0, 0, 0
      for i = 1, shape[1] do
        for j = 1, shape[2] do
          total = total + 1
          if got[i][j] == want[i][j] then same = same + 1 end
          worst = math.max(worst, math.abs(got[i][j] - want[i][j]))
          assert.equal(rb(got[i][j]), got[i][j]) -- a bfloat16 value
        end
      end
      assert.truthy(same >= 0.9 * total, ("%d of %d bitwise"):format(same, total))
      assert.truthy(worst <= 2 ^ -6, "max diff " .. worst)
    end)
  end

  it("is not the float32 iteration (and close to it)", function()
    local x = T.randn({ 24, 40 }, 3)
    local d = H.max_abs_diff(ns.zeropower(x, { dtype = "bfloat16" }), ns.zeropower(x, {}))
    assert.truthy(d > 1e-4 and d < 0.05, d)
  end)

  it("0 steps: the normalized input rounded to bfloat16", function()
    local x = T.randn({ 5, 7 }, 4)
    local got = rows_of(ns.zeropower(x, { dtype = "bfloat16", steps = 0 }))
    local want = ref_bf16(rows_of(x), {}, 1e-10)
    for i = 1, 5 do assert.same(want[i], got[i]) end
  end)

  describe("bits", function()
    local with_threads = H.keep_threads(before_each, after_each)

    -- 300x520 and its transpose split into tiles (2 x 2 Gram blocks of
    -- 160, column blocks of 272 and 248): alone shared by the workers, in a batch
    -- one worker each; 40x24 is one tile.
    for _, case in ipairs({ { 300, 520 }, { 520, 300 }, { 40, 24 }, { 300, 520, "gram" }, { 520, 300, "gram" },
                            { 40, 24, "gram" } }) do
      local shape, method = { case[1], case[2] }, case[3] or "standard"
      it(("%dx%d, %s: the same bits for 1/2 OpenBLAS threads, 1/2/3 workers, alone or batched"):format(
        shape[1], shape[2], method), function()
        local x = T.randn(shape, 11)
        -- (5 steps: the Gram iteration restarts before steps 2 and 4)
        local r = ns.resolve({ dtype = "bfloat16", steps = method == "gram" and 5 or 3, method = method })
        local want = with_threads(1, 1, function() return ns.zeropower(x, r) end)
        for _, s in ipairs({ { 2, nil }, { 1, 2 }, { 2, 3 } }) do
          H.assert_equal_bits(want, with_threads(s[1], s[2], function() return ns.zeropower(x, r) end),
            ("blas %d workers %s"):format(s[1], tostring(s[2])))
        end
        -- a batch of three (the middle one x) and zeropower_many
        local y, z = T.randn(shape, 12), T.randn(shape, 13)
        local b = T.zeros({ 3, shape[1], shape[2] })
        b:select(1, 1):copy(y)
        b:select(1, 2):copy(x)
        b:select(1, 3):copy(z)
        local bo = with_threads(2, 2, function() return ns.zeropower(b, r) end)
        H.assert_equal_bits(want, bo:select(1, 2):contiguous(), "batched")
        local outs = { T.zeros(shape), T.zeros(shape), T.zeros(shape) }
        with_threads(2, 2, function() ns.zeropower_many(outs, { y, x, z }, r) end)
        H.assert_equal_bits(want, outs[2], "zeropower_many")
        H.assert_equal_bits(bo:select(1, 1):contiguous(), outs[1], "zeropower_many vs batch")
      end)
    end
  end)

  it("resolves auto by the cost model (Gram on wide shapes) and refuses aol, cans and float64", function()
    assert.equal("gram", ns.method_for(1024, 4096, { dtype = "bfloat16", method = "auto" }))
    assert.equal("standard", ns.method_for(1024, 1024, { dtype = "bfloat16", method = "auto" }))
    local ok, err = pcall(ns.zeropower, T.randn({ 4, 6 }, 1), { dtype = "bfloat16", variant = "aol" })
    assert.truthy(not ok and err:find("runs in float32 only", 1, true), err)
    ok, err = pcall(ns.zeropower, T.randn({ 4, 6 }, 1), { dtype = "bfloat16", variant = "cans" })
    assert.truthy(not ok and err:find("variant 'cans' diverges in bfloat16", 1, true), err)
    ok, err = pcall(ns.zeropower, T.randn({ 4, 6 }, 1, "float64"), { dtype = "bfloat16" })
    assert.truthy(not ok and err:find("dtype bfloat16 takes float32 tensors, got float64", 1, true), err)
    ok, err = pcall(ns.zeropower, T.randn({ 4, 6 }, 1), { dtype = "float16" })
    assert.truthy(not ok and err:find("dtype must be 'float32' or 'bfloat16', got 'float16'", 1, true), err)
  end)

  it("names its path in blas_info", function()
    assert.truthy(muon.blas_info().bf16:find("^oneDNN %d") or muon.blas_info().bf16:find("^none"))
  end)
end)

describe("Muon ns_dtype", function()
  local Muon = muon.optim.Muon
  local function params(seed)
    return { muon.param("w", T.randn({ 12, 20 }, seed), T.randn({ 12, 20 }, seed + 1)),
             muon.param("v", T.randn({ 20, 8 }, seed + 2), T.randn({ 20, 8 }, seed + 3)) }
  end

  it("steps with the bfloat16 iteration: the update is ns.zeropower's in bfloat16", function()
    local p = params(20)
    local w0, g = p[1].value:clone(), p[1].grad:clone()
    local opt = Muon(p, { ns_dtype = "bfloat16", weight_decay = 0, momentum = 0.0, nesterov = false })
    opt:step()
    -- momentum 0: the NS input is the gradient; the update is -lr * scale * U
    local u = ns.zeropower(g, { dtype = "bfloat16" })
    local u32 = ns.zeropower(g, {})
    local step = rows_of(p[1].value)
    local w = rows_of(w0)
    local U, U32 = rows_of(u), rows_of(u32)
    local k -- the per-parameter scale, from one element
    local d16, d32 = 0, 0
    for i = 1, 12 do
      for j = 1, 20 do
        local du = step[i][j] - w[i][j]
        k = k or du / U[i][j]
        d16 = math.max(d16, math.abs(du - k * U[i][j]))
        d32 = math.max(d32, math.abs(du - k * U32[i][j]))
      end
    end
    assert.truthy(d16 < 1e-6 and d32 > 1e-5, ("%g %g"):format(d16, d32))
  end)

  it("checkpoints the option (a load restores it, as torch), and a bad value names it", function()
    local p = params(30)
    local opt = Muon(p, { ns_dtype = "bfloat16" })
    opt:step()
    local path = H.tmpname(".safetensors")
    opt:save(path)
    local q, r = params(30), params(30)
    local ob = Muon(q, { ns_dtype = "bfloat16" })
    ob:load(path)
    local oc = Muon(r) -- float32 until the load
    oc:load(path)
    os.remove(path)
    assert.equal("bfloat16", ob.param_groups[1].ns_dtype)
    assert.equal("bfloat16", oc.param_groups[1].ns_dtype)
    for i = 1, 2 do -- the parameters themselves are not in the optimizer's checkpoint
      q[i].value:copy(p[i].value)
      r[i].value:copy(p[i].value)
    end
    opt:step()
    ob:step()
    oc:step()
    for i = 1, 2 do
      H.assert_equal_bits(p[i].value, q[i].value, "resumed " .. i)
      H.assert_equal_bits(p[i].value, r[i].value, "restored into float32 group " .. i)
    end
    local ok, err = pcall(Muon, params(30), { ns_dtype = "half" })
    assert.is_false(ok)
    assert.truthy(err:find("ns_dtype", 1, true) and err:find("half", 1, true), err)
    -- a float64 parameter in a bfloat16 group: the step fails naming both, nothing changes
    local w = muon.param("w64", T.randn({ 6, 8 }, 40, "float64"), T.randn({ 6, 8 }, 41, "float64"))
    local before = w.value:clone()
    local od = Muon({ w }, { ns_dtype = "bfloat16" })
    ok, err = pcall(od.step, od)
    assert.is_false(ok)
    assert.truthy(err:find("parameter 'w64' is float64: ns_dtype = 'bfloat16' runs on float32 parameters", 1, true), err)
    H.assert_equal_bits(before, w.value, "unchanged")
  end)
end)
