-- The Newton-Schulz presets of issues 20 and 30: "cans", "polar_express_8",
-- "aol" (Turbo-Muon's AOL preconditioning in place of the Frobenius
-- normalization) and "cubic5" (c = 0). Their triples against the published tables (NVIDIA
-- Emerging-Optimizers' _COEFFICIENT_SETS, which cite the CANS paper, the
-- Polar Express paper and flash-newton-schulz), and the AOL iteration
-- against a double-precision reference written from its formula.
local H = require("helpers")
local T = H.T
local R = require("ref_muon")
local ns = require("muon.ns")
local muon = require("muon")

local PUBLISHED = {
  cans = { { 8.4703, -25.1081, 18.6293 }, { 4.1828, -3.1087, 0.5806 }, { 3.9619, -2.9541, 0.5630 },
    { 3.2866, -2.4647, 0.5074 }, { 2.2737, -1.6447, 0.4162 } },
  polar_express_8 = { { 8.2051, -22.9019, 16.4607 }, { 4.0664, -2.8612, 0.5184 }, { 3.9096, -2.8234, 0.5250 },
    { 3.2856, -2.4153, 0.4853 }, { 2.2779, -1.6198, 0.3985 }, { 1.8726, -1.2307, 0.3585 },
    { 1.8564, -1.2132, 0.3568 }, { 1.8750, -1.2500, 0.3750 } },
  aol = { { 4.0098, -7.0585, 2.4635 }, { 3.4585, -5.5479, 2.5959 }, { 2.7573, -3.2939, 1.4254 },
    { 2.7215, -3.0494, 1.3169 } },
  cubic5 = { { 3.3656576, -3.3420992, 0 }, { 2.5744352, -1.4957376, 0 }, { 2.5368962, -1.4312570, 0 },
    { 2.4418906, -1.2764040, 0 }, { 2.2230472, -0.9630650, 0 } },
}

-- AOL then Newton-Schulz in double precision: x (rows of rows), wide
-- orientation; D = diag(1 / sqrt(max(sum_j |x x^T|_ij, eps))).
local function ref_aol_ns(x, coeffs, eps)
  local tall = #x > #x[1]
  if tall then x = R.transpose(x) end
  local A = R.matmul(x, R.transpose(x))
  local X = {}
  for i = 1, #x do
    local r = 0
    for j = 1, #A do r = r + math.abs(A[i][j]) end
    local d = r > 0 and 1 / math.sqrt(math.max(r, eps)) or 0
    X[i] = {}
    for j = 1, #x[1] do X[i][j] = d * x[i][j] end
  end
  -- the seed's iteration on an already scaled input: R.ns with a unit norm
  local norm = R.frob(X)
  for i = 1, #X do for j = 1, #X[1] do X[i][j] = X[i][j] * norm end end
  local out = R.ns(X, coeffs, 0, 1 / norm)
  if tall then out = R.transpose(out) end
  return out
end

local function rows_of(t)
  local a, b = t:size(1), t:size(2)
  local f, out = t:flat(), {}
  for i = 1, a do
    out[i] = {}
    for j = 1, b do out[i][j] = f[(i - 1) * b + j] end
  end
  return out
end

local function flat_of(rows)
  local out = {}
  for i = 1, #rows do for j = 1, #rows[1] do out[#out + 1] = rows[i][j] end end
  return out
end

describe("Newton-Schulz presets cans, polar_express_8, aol", function()
  it("hold the published triples, at their natural lengths, and stop there as the fixed presets do", function()
    for name, want in pairs(PUBLISHED) do
      local got = ns.coefficients(name)
      assert.are.same(want, got, name)
      assert.are.same(want, (ns.coefficients(name, #want + 3)), name .. " past its length")
    end
  end)

  it("are ns_variant values of Muon groups, and unknown names list them", function()
    for _, v in ipairs({ "cans", "polar_express_8", "aol", "cubic5" }) do
      assert.has_no.errors(function() muon.engine.new({ groups = { { ns_variant = v } } }) end)
    end
    local ok, err = pcall(muon.engine.new, { groups = { { ns_variant = "aoll" } } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("'cans', 'polar_express_8', 'aol', 'cubic5', or 'custom', got 'aoll'", 1, true),
      tostring(err))
  end)

  for _, dtype in ipairs({ "float64", "float32" }) do
    it("aol: AOL scaling then its four steps match a float64 reference (" .. dtype .. ", wide and tall)", function()
      local tol = dtype == "float64" and 1e-12 or 2e-5
      for _, shape in ipairs({ { 5, 9 }, { 9, 5 }, { 6, 6 }, { 1, 7 } }) do
        local x = T.randn(shape, 11 * shape[1] + shape[2], dtype)
        local got = ns.zeropower(x, { variant = "aol" })
        local want = ref_aol_ns(rows_of(x:to("float64")), PUBLISHED.aol, 1e-10)
        H.assert_close(got, flat_of(want), tol, ("aol %dx%d"):format(shape[1], shape[2]))
      end
    end)
  end

  it("aol: a zero row stays zero, steps = 0 gives D X, a huge input is fine, and gram is refused", function()
    local x = T.randn({ 4, 6 }, 3, "float64")
    x:narrow(1, 2, 1):zero()
    local u = ns.zeropower(x, { variant = "aol" })
    for j = 1, 6 do assert.equal(0, u:get(2, j)) end
    local d = ns.zeropower(x, { variant = "aol", steps = 0 })
    local want = rows_of(x)
    local A = R.matmul(want, R.transpose(want))
    for i = 1, 4 do
      local r = 0
      for j = 1, 4 do r = r + math.abs(A[i][j]) end
      for j = 1, 6 do want[i][j] = r > 0 and want[i][j] / math.sqrt(r) or 0 end
    end
    H.assert_close(d, flat_of(want), 1e-15, "D X")
    -- scale invariance: 1e30 x gives the same result (the Gram matrix of the
    -- input scaled by a power of two), in float32 too (to its rounding of 1e30 y)
    local y = T.randn({ 5, 8 }, 4)
    H.assert_close(ns.zeropower(y:mul(1e30), { variant = "aol" }), ns.zeropower(y, { variant = "aol" }), 4e-6, "1e30 x")
    local ok, err = pcall(ns.zeropower, y, { variant = "aol", method = "gram" })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("method must be 'standard' or 'auto'", 1, true), tostring(err))
    -- auto never picks the Gram iteration for it
    assert.equal("standard", ns.method_for(2048, 4096, { variant = "aol", method = "auto" }))
  end)

  it("cans, polar_express_8 and cubic5 run the Frobenius-normalized iteration (float64 reference)", function()
    for _, v in ipairs({ "cans", "polar_express_8", "cubic5" }) do
      local x = T.randn({ 6, 10 }, 8, "float64")
      local want = R.ns(rows_of(x), PUBLISHED[v], 1e-10)
      H.assert_close(ns.zeropower(x, { variant = v }), flat_of(want), 1e-12, v)
    end
  end)

  it("cubic5 (c = 0, no A A product) in both dtypes, standard and Gram, against float64", function()
    local x = T.randn({ 48, 120 }, 9)
    local want = ns.zeropower(x:clone("float64"), { variant = "cubic5" })
    H.assert_close(want, flat_of(R.ns(rows_of(x:clone("float64")), PUBLISHED.cubic5, 1e-10)), 1e-12, "float64")
    for _, o in ipairs({ {}, { method = "gram" }, { dtype = "bfloat16" }, { dtype = "bfloat16", method = "gram" } }) do
      o.variant = "cubic5"
      local tol = o.dtype and 0.03 or 2e-5
      H.assert_close(ns.zeropower(x, o), want, tol, ("%s %s"):format(o.dtype or "float32", o.method or "standard"))
    end
    -- its cost has no A A: 5 (3 n^2 m) flops (symmetric float32 iteration)
    assert.are.equal(5 * 3 * 48 * 48 * 120, (ns.cost(48, 120, { variant = "cubic5" })))
  end)
end)
