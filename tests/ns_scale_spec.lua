-- Newton-Schulz at every scale: the seed's normalization X / (norm_scale
-- ||X|| + eps) keeps its eps and norm_scale for inputs from 1e-45 to 3e38
-- (float32 and bfloat16, every preset, standard and Gram), against the
-- float64 iteration on the same float32 values; and a Muon step on a
-- gradient scaled to 1e-20 and 5e-43 moves the parameter as a float64
-- reference does (by almost nothing, eps dominating), not by a full-size
-- update in the gradient's noise direction.
local H = require("helpers")
local T = H.T
local ns = require("muon.ns")
local R = require("ref_muon")
local muon = require("muon")

local SCALES = H.NS_SCALES
local input = H.scaled_randn

describe("Newton-Schulz at every scale", function()
  local base = { { 24, 40 }, { 40, 24 } }
  for _, dtype in ipairs({ "float32", "bfloat16" }) do
    for _, method in ipairs({ "standard", "gram" }) do
      for _, variant in ipairs(ns.VARIANTS) do
        local refused = variant == "custom" or (variant == "aol" and (dtype == "bfloat16" or method == "gram"))
          or (variant == "cans" and dtype == "bfloat16")
          or (dtype == "bfloat16" and method == "gram" and not pcall(ns.resolve, { dtype = dtype, method = method }))
        if not refused then
          it(("%s, %s, %s: within its own error of the float64 iteration from 1e-45 to 3e38"):format(dtype, method,
            variant), function()
            local opts = { dtype = dtype, method = method, variant = variant }
            local ref_opts = { variant = variant } -- float64 tensors, the standard iteration
            for k, shape in ipairs(base) do
              -- the error at scale 1 bounds it at every scale (bfloat16:
              -- its rounding; float32: the float32 iteration's)
              local x1 = input(shape, 10 + k, 1)
              local err1 = H.max_abs_diff(ns.zeropower(x1, opts), ns.zeropower(x1:clone("float64"), ref_opts))
              local tol = 4 * err1 + 1e-5
              for _, s in ipairs(SCALES) do
                local x = input(shape, 10 + k, s)
                local got = ns.zeropower(x, opts)
                local want = ns.zeropower(x:clone("float64"), ref_opts)
                local d = H.max_abs_diff(got, want)
                assert.is_true(d <= tol, ("%dx%d at %g: max |got - float64| = %g > %g; |got| %g, |float64| %g"):format(
                  shape[1], shape[2], s, d, tol, got:abs():amax(), want:abs():amax()))
              end
            end
          end)
        end
      end
    end
  end

  it("keeps eps where it matters: 1e-16 x, 64x160 (the seed gives norm 0.050, not 7.99)", function()
    local x = T.randn({ 64, 160 }, 4):mul(1e-16)
    for _, dtype in ipairs({ "float32", "bfloat16" }) do
      local y = ns.zeropower(x, { dtype = dtype })
      local norm = math.sqrt(y:clone("float64"):pow(2):sum())
      assert.is_true(math.abs(norm - 0.0500) < 0.002, dtype .. ": norm " .. norm)
    end
    -- and polar_express's norm_scale above 2^40: as at 1
    local big = T.randn({ 24, 40 }, 5)
    local want = ns.zeropower(big, { variant = "polar_express" })
    local got = ns.zeropower(big:clone():mul(0x1p50), { variant = "polar_express" })
    assert.is_true(H.max_abs_diff(got, want) < 1e-5)
  end)

  it("bfloat16: an input whose norm exceeds bfloat16's range is orthogonalized, not zeroed", function()
    local x = input({ 64, 160 }, 6, 3e38) -- ||x|| ~ 1e40
    local y = ns.zeropower(x, { dtype = "bfloat16" })
    local want = ns.zeropower(x:clone("float64"), {})
    assert.is_true(y:abs():amax() > 0.3)
    assert.is_true(H.max_abs_diff(y, want) < 0.1)
  end)
end)

describe("a Muon step on a tiny gradient", function()
  for _, s in ipairs({ 1e-20, 5e-43 }) do
    it(("6x4 gradient scaled to %g moves the parameter as the float64 reference does"):format(s), function()
      local g = input({ 6, 4 }, 21, s)
      local w = T.zeros({ 6, 4 })
      local p = muon.param("w", w, g)
      local ref = { { value = w:flat(), grad = g:flat(), shape = { 6, 4 } } }
      local opt = muon.optim.Muon({ p }, { lr = 0.02, weight_decay = 0 })
      opt:step()
      R.muon_step(ref, { lr = 0.02, weight_decay = 0 })
      local want = ref[1].value
      local big = 0
      for _, v in ipairs(want) do big = math.max(big, math.abs(v)) end
      -- eps dominates: the update is tiny (a subnormal gradient keeps few bits)
      assert.is_true(big < 1e-6, "reference update " .. big)
      local tol = (s < 1e-38 and 1e-2 or 1e-4) * big
      assert.is_true(H.max_abs_diff(p.value, want) <= tol,
        ("max |update - float64| %g, float64 update %g"):format(H.max_abs_diff(p.value, want), big))
    end)
  end
end)
