-- Tensor maths (src/tensor_math.c through lua/muon/tensor.lua) against
-- references computed element by element in Lua from values read with
-- :get (which addresses each element itself, without the strided loop).
--
-- Tolerances. Elementwise ops and reductions are compared bitwise for both
-- dtypes (H.same: NaN matches NaN, 0 does not match -0). The float32
-- reference rounds to float32 after every step (H.f32: exact for + - * /
-- sqrt), fused multiply-adds use H.fmaf (Lua) / the C library's fma for
-- float64, scalars are rounded to the dtype first, and reductions are summed
-- in double in the same row-major order. Matrix products (BLAS blocks and
-- fuses) must be within 2 k u sum_k |a_ik b_kj| of a double loop (u = 2^-24
-- for float32, 2^-53 for float64), and exact on small integers.
local H = require("helpers")
local T = H.T
local f32, values, same = H.f32, H.values, H.same

local DTYPES = { "float32", "float64" }
local function rounder(dt) return dt == "float32" and f32 or function(x) return x end end
local function fma_of(dt) return dt == "float32" and H.fmaf or H.fma end

-- Message of an error without its "file:line: " prefix.
local function err_of(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

-- Tensors of a shape laid out in memory in different ways (random values).
local LAYOUTS = { "contiguous", "transposed", "narrowed", "strided" }
local function make(layout, shape, seed, dt)
  local n = #shape
  if layout == "transposed" and n >= 2 then
    local s = { unpack(shape) }
    s[1], s[n] = s[n], s[1]
    return T.randn(s, seed, dt):transpose(1, n)
  elseif layout == "narrowed" and n >= 1 then
    local big = {}
    for i, d in ipairs(shape) do big[i] = d + 2 end
    local t = T.randn(big, seed, dt)
    for i, d in ipairs(shape) do t = t:narrow(i, 2, d) end
    return t
  elseif layout == "strided" and n >= 1 then -- no unit stride at all
    local big = { unpack(shape) }
    big[n + 1] = 2
    return T.randn(big, seed, dt):select(n + 1, 2)
  end
  return T.randn(shape, seed, dt)
end

-- Special values at the first flat positions (row-major).
local SPECIAL = { 0, -0.0, 1 / 0, -1 / 0, 0 / 0, 1e-40, -3.5, 2 }
local function spice(t, seed)
  local dims = t:size()
  local n = t:numel()
  for k = 1, math.min(n, #SPECIAL) do
    local idx, r = {}, (k * 7 + (seed or 0)) % n
    for i = #dims, 1, -1 do
      idx[i] = r % dims[i] + 1
      r = math.floor(r / dims[i])
    end
    t:set(SPECIAL[k], unpack(idx))
  end
  return t
end

local function numel_of(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

-- NumPy broadcast shape of operand shapes (nil entries: scalars).
local function bshape(shapes)
  local nd = 0
  for _, s in pairs(shapes) do nd = math.max(nd, #s) end
  local out = {}
  for i = 1, nd do out[i] = 1 end
  for _, s in pairs(shapes) do
    for j = 1, #s do
      local i = j + nd - #s
      if s[j] ~= 1 then out[i] = s[j] end
    end
  end
  return out
end

-- Reference elementwise result: f applied per element of the broadcast
-- shape; each operand is a number or { shape =, vals = } (row-major).
local function ref_map(f, out_shape, ops)
  local nd, n, res = #out_shape, numel_of(out_shape), {}
  for flat = 0, n - 1 do
    local idx, r = {}, flat
    for i = nd, 1, -1 do
      idx[i] = r % out_shape[i]
      r = math.floor(r / out_shape[i])
    end
    local args = {}
    for k, op in ipairs(ops) do
      if type(op) == "number" then
        args[k] = op
      else
        local s, lead, pos = op.shape, nd - #op.shape, 0
        for j = 1, #s do pos = pos * s[j] + (s[j] == 1 and 0 or idx[j + lead]) end
        args[k] = op.vals[pos + 1]
      end
    end
    res[flat + 1] = f(unpack(args, 1, #ops))
  end
  return res
end

local function operand(x)
  if type(x) == "number" then return x end
  return { shape = x:size(), vals = values(x) }
end

-- Reference formulas (scalars already rounded to the dtype by the caller).
local function formulas(dt)
  local R, FMA = rounder(dt), fma_of(dt)
  return {
    add = function(alpha) return function(a, b) return alpha == 1 and R(a + b) or FMA(R(alpha), b, a) end end,
    sub = function(alpha) return function(a, b) return alpha == 1 and R(a - b) or FMA(-R(alpha), b, a) end end,
    mul = function(a, b) return R(a * b) end,
    div = function(a, b) return R(a / b) end,
    gt = function(a, b) return a > b and 1 or 0 end,
    lt = function(a, b) return a < b and 1 or 0 end,
    ge = function(a, b) return a >= b and 1 or 0 end,
    le = function(a, b) return a <= b and 1 or 0 end,
    eq = function(a, b) return a == b and 1 or 0 end,
    ne = function(a, b) return a ~= b and 1 or 0 end,
    addcmul = function(v) return function(s, a, b) return FMA(R(R(v) * a), b, s) end end,
    addcdiv = function(v) return function(s, a, b) return R(s + R(R(R(v) * a) / b)) end end,
    lerp = function(s, e, w)
      local d = R(e - s)
      if math.abs(w) < 0.5 then return FMA(w, d, s) end
      return FMA(R(w - 1), d, e)
    end,
    where = function(c, a, b) if c ~= 0 then return a end return b end,
    neg = function(x) return -x end,
    abs = function(x) return math.abs(x) end,
    sqrt = function(x) return R(math.sqrt(x)) end,
    rsqrt = function(x) return R(1 / R(math.sqrt(x))) end,
    sign = function(x) return x > 0 and 1 or (x < 0 and -1 or 0) end,
    clamp = function(lo, hi)
      return function(x)
        if x ~= x then return x end
        local t = x < lo and lo or x
        return hi < t and hi or t
      end
    end,
  }
end

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local BINARY_CASES = {
  { { 3, 4 }, { 3, 4 } }, { { 3, 4 }, { 4 } }, { { 3, 1 }, { 1, 4 } }, { { 3, 4 }, { 3, 1 } },
  { { 2, 3, 4 }, { 3, 1 } }, { {}, { 3, 4 } }, { { 3, 4 }, {} }, { { 1 }, { 2, 3 } }, { { 0, 4 }, { 4 } },
  { { 2, 0 }, { 2, 1 } }, { { 5, 33 }, { 5, 33 } },
}

describe("tensor maths: binary elementwise ops", function()
  for _, dt in ipairs(DTYPES) do
    local F, R = formulas(dt), rounder(dt)
    local OPS = {
      { "add", F.add(1) }, { "sub", F.sub(1) }, { "mul", F.mul }, { "div", F.div }, { "gt", F.gt },
      { "lt", F.lt }, { "ge", F.ge }, { "le", F.le }, { "eq", F.eq }, { "ne", F.ne },
    }
    for _, o in ipairs(OPS) do
      local name, f = o[1], o[2]
      it(("%s %s: strided layouts, broadcasting, in place == out of place (bitwise)"):format(name, dt), function()
        local checked = 0
        for ci, case in ipairs(BINARY_CASES) do
          for li, la in ipairs(LAYOUTS) do
            local lb = LAYOUTS[li % #LAYOUTS + 1]
            local sa, sb = 100 * ci + li, 100 * ci + li + 50
            local a, b = spice(make(la, case[1], sa, dt), ci), make(lb, case[2], sb, dt)
            if name == "eq" or name == "ne" then b = spice(b, ci) end -- equal elements too
            local out = a[name](a, b)
            local want_shape = bshape({ case[1], case[2] })
            assert.same(want_shape, out:size())
            assert.equal(dt, out:dtype())
            assert.is_true(out:is_contiguous())
            local want = ref_map(f, want_shape, { operand(a), operand(b) })
            H.assert_same(values(out), want, ("%s %s %s"):format(name, la, lb))
            if same_shape(want_shape, case[1]) then
              local a2 = spice(make(la, case[1], sa, dt), ci)
              local r = a2[name .. "_"](a2, b)
              assert.is_true(rawequal(r, a2), "in-place returns self")
              H.assert_same(values(a2), want, ("%s_ %s %s"):format(name, la, lb))
            end
            checked = checked + 1
          end
        end
        assert.equal(#BINARY_CASES * #LAYOUTS, checked)
      end)

      it(("%s %s: a number operand is rounded to the dtype first"):format(name, dt), function()
        local a = spice(make("transposed", { 4, 5 }, 7, dt))
        for _, s in ipairs({ 0.1, -2.5, 0, 1e-30 }) do
          local want = ref_map(f, { 4, 5 }, { operand(a), R(s) })
          H.assert_same(values(a[name](a, s)), want, name .. " scalar " .. s)
          H.assert_same(values(T[name](a, s)), want, "T." .. name .. " scalar " .. s)
        end
      end)
    end

    it(("add/sub %s with alpha: one fused multiply-add (torch's add(alpha=))"):format(dt), function()
      for _, name in ipairs({ "add", "sub" }) do
        for _, alpha in ipairs({ 0.3, -1.7, 1, 0 }) do
          local a, b = make("narrowed", { 6, 7 }, 1, dt), make("strided", { 7 }, 2, dt)
          local want = ref_map(F[name](alpha), { 6, 7 }, { operand(a), operand(b) })
          H.assert_same(values(a[name](a, b, alpha)), want, ("%s alpha=%g"):format(name, alpha))
          a[name .. "_"](a, b, alpha)
          H.assert_same(values(a), want, ("%s_ alpha=%g"):format(name, alpha))
          local ws = ref_map(F[name](alpha), { 6, 7 }, { operand(a), R(0.1) })
          H.assert_same(values(a[name](a, 0.1, alpha)), ws, ("%s scalar alpha=%g"):format(name, alpha))
        end
      end
      -- where fused and separate roundings differ: -1 + (1+e)(1+e) is 2e + e^2
      -- fused, 2e when the product is rounded first (tie to even)
      local e = dt == "float32" and 2 ^ -12 or 2 ^ -27
      local one_e = T.from({ 1 + e }, { 1 }, dt)
      assert.equal(2 * e + e * e, T.from({ -1 }, { 1 }, dt):add(one_e, 1 + e):get(1))
      assert.equal(2 * e + e * e, T.from({ -1 }, { 1 }, dt):sub(one_e, -(1 + e)):get(1))
      assert.equal(2 * e + e * e, T.from({ -1 }, { 1 }, dt):addcmul(one_e, one_e):get(1))
      assert.equal(R(-1 + R((1 + e) * (1 + e))), 2 * e, "the unfused value differs")
    end)
  end
end)

describe("tensor maths: ternary ops, where, masked_fill", function()
  local CASES = {
    { { 3, 4 }, { 3, 4 }, { 3, 4 } }, { { 3, 4 }, { 4 }, { 3, 1 } }, { { 2, 3, 4 }, { 3, 1 }, { 4 } },
    { { 3, 4 }, {}, { 1, 4 } }, { { 0, 2 }, { 2 }, { 0, 1 } }, { { 1 }, { 1 }, { 1 } },
    { {}, { 3, 4 }, { 3, 4 } }, { { 3, 4 }, { 1 }, { 3, 4 } },
  }
  -- layouts of (self, tensor1, tensor2): each layout for self, the others
  -- rotating, and all three contiguous (the array loops)
  local COMBOS = {}
  for li, la in ipairs(LAYOUTS) do COMBOS[li] = { la, LAYOUTS[li % 4 + 1], LAYOUTS[(li + 1) % 4 + 1] } end
  COMBOS[#COMBOS + 1] = { "contiguous", "contiguous", "contiguous" }
  for _, dt in ipairs(DTYPES) do
    local F, R = formulas(dt), rounder(dt)
    for _, name in ipairs({ "addcmul", "addcdiv", "lerp" }) do
      it(("%s %s: against the reference, in place == out of place"):format(name, dt), function()
        for ci, c in ipairs(CASES) do
          for li, combo in ipairs(COMBOS) do
            local la = combo[1]
            local seed = 10 * ci + li
            local s = spice(make(la, c[1], seed, dt), ci)
            local t1 = make(combo[2], c[2], seed + 1, dt)
            local t2 = make(combo[3], c[3], seed + 2, dt)
            if name == "lerp" then -- weights around the 0.5 switch, negative, > 1
              local p = T.from({ 0.25, 0.5, 0.75, -0.3, 1.5, 0.4999 }, { 6 }, dt)
              local flat = values(t2)
              local dims = t2:size()
              for k = 1, #flat do
                local idx, r = {}, k - 1
                for i = #dims, 1, -1 do
                  idx[i] = r % dims[i] + 1
                  r = math.floor(r / dims[i])
                end
                t2:set(p:get((k - 1) % 6 + 1), unpack(idx))
              end
            end
            local f = name == "lerp" and F.lerp or F[name](0.7)
            local shape = bshape({ c[1], c[2], c[3] })
            local want = ref_map(f, shape, { operand(s), operand(t1), operand(t2) })
            local got = name == "lerp" and s:lerp(t1, t2) or s[name](s, t1, t2, 0.7)
            H.assert_same(values(got), want, ("%s %s case %d"):format(name, la, ci))
            if same_shape(shape, c[1]) then
              if name == "lerp" then s:lerp_(t1, t2) else s[name .. "_"](s, t1, t2, 0.7) end
              H.assert_same(values(s), want, ("%s_ %s case %d"):format(name, la, ci))
            end
          end
        end
      end)
    end

    it(("addcmul/addcdiv default value 1, lerp with a number weight (%s)"):format(dt), function()
      local s, a, b = make("transposed", { 5, 6 }, 1, dt), make("contiguous", { 6 }, 2, dt), make("strided", { 5, 1 }, 3, dt)
      H.assert_same(values(s:addcmul(a, b)), ref_map(F.addcmul(1), { 5, 6 }, { operand(s), operand(a), operand(b) }), "addcmul")
      H.assert_same(values(T.addcdiv(s, a, b)), ref_map(F.addcdiv(1), { 5, 6 }, { operand(s), operand(a), operand(b) }), "addcdiv")
      for _, w in ipairs({ 0.1, 0.9, 0.5, -2 }) do
        local e = make("narrowed", { 5, 6 }, 4, dt)
        H.assert_same(values(s:lerp(e, w)), ref_map(F.lerp, { 5, 6 }, { operand(s), operand(e), R(w) }), "lerp " .. w)
      end
    end)

    it(("where and masked_fill %s: comparison masks, any non-zero (NaN too) is true"):format(dt), function()
      local x = spice(make("transposed", { 4, 6 }, 5, dt))
      local y = make("narrowed", { 6 }, 6, dt)
      local cond = x:gt(0.5)
      H.assert_same(values(T.where(cond, x, y)), ref_map(F.where, { 4, 6 }, { operand(cond), operand(x), operand(y) }), "where")
      H.assert_same(values(x:where(cond, y)), values(T.where(cond, x, y)), "x:where")
      H.assert_same(values(T.where(x, 1, 0)), ref_map(F.where, { 4, 6 }, { operand(x), 1, 0 }), "raw condition")
      local xc = x:contiguous()
      H.assert_same(values(T.where(xc, 1, -2)), ref_map(F.where, { 4, 6 }, { operand(xc), 1, -2 }), "contiguous condition")
      H.assert_same(values(T.where(xc:ge(0), 0.5, xc)), ref_map(F.where, { 4, 6 }, { operand(xc:ge(0)), R(0.5), operand(xc) }),
        "contiguous, number input")
      H.assert_same(values(T.where(cond, R(0.1), y)), ref_map(F.where, { 4, 6 }, { operand(cond), R(0.1), operand(y) }), "number input")
      local m = x:lt(0)
      local want = ref_map(F.where, { 4, 6 }, { operand(m), R(-0.25), operand(x) })
      H.assert_same(values(x:masked_fill(m, -0.25)), want, "masked_fill")
      local x2 = spice(make("transposed", { 4, 6 }, 5, dt))
      assert.is_true(rawequal(x2:masked_fill_(m, -0.25), x2))
      H.assert_same(values(x2), want, "masked_fill_")
      -- a broadcast mask (one per column)
      local col = T.from({ 1, 0, 0, 1, 0, 1 }, { 6 }, dt)
      H.assert_same(values(x:masked_fill(col, 9)), ref_map(F.where, { 4, 6 }, { operand(col), 9, operand(x) }), "column mask")
      assert.equal(dt, x:gt(0):dtype())
    end)
  end
end)

describe("tensor maths: unary ops and clamp", function()
  for _, dt in ipairs(DTYPES) do
    local F, R = formulas(dt), rounder(dt)
    for _, name in ipairs({ "neg", "abs", "sqrt", "rsqrt", "sign" }) do
      it(("%s %s: every layout, special values, in place"):format(name, dt), function()
        for _, shape in ipairs({ { 3, 5 }, { 2, 3, 4 }, {}, { 0, 3 }, { 1 } }) do
          for li, la in ipairs(LAYOUTS) do
            local x = spice(make(la, shape, li, dt), li)
            if name == "sqrt" or name == "rsqrt" then x = x:abs() end
            local want = ref_map(F[name], shape, { operand(x) })
            H.assert_same(values(x[name](x)), want, name .. " " .. la)
            H.assert_same(values(T[name](x)), want, "T." .. name .. " " .. la)
            x[name .. "_"](x)
            H.assert_same(values(x), want, name .. "_ " .. la)
          end
        end
        -- negative inputs of sqrt give NaN; sign(-0) and sign(NaN) are +0
        if name == "sqrt" then
          local v = T.from({ -1 }, { 1 }, dt):sqrt():get(1)
          assert.is_true(v ~= v, "sqrt(-1) is NaN")
        end
        if name == "sign" then
          H.assert_same(values(T.from({ -0.0, 0 / 0, -7, 3 }, { 4 }, dt):sign()), { 0, 0, -1, 1 }, "sign")
        end
      end)
    end

    it(("clamp %s: min and max, one of them, NaN stays, min > max gives max"):format(dt), function()
      for li, la in ipairs(LAYOUTS) do
        local x = spice(make(la, { 4, 5 }, li, dt))
        -- signed zeros as torch (std::max/min): clamp(-0, min=0) = -0, clamp(0, max=-0) = 0
        for _, b in ipairs({ { -0.5, 0.5 }, { nil, 0.3 }, { 0.1, nil }, { 1, -1 }, { 0, nil }, { nil, -0.0 } }) do
          local lo, hi = b[1], b[2]
          local want = ref_map(F.clamp(lo and R(lo) or -1 / 0, hi and R(hi) or 1 / 0), { 4, 5 }, { operand(x) })
          H.assert_same(values(x:clamp(lo, hi)), want, ("clamp %s %s"):format(tostring(lo), tostring(hi)))
          local x2 = spice(make(la, { 4, 5 }, li, dt))
          x2:clamp_(lo, hi)
          H.assert_same(values(x2), want, "clamp_")
        end
      end
    end)
  end
end)

describe("tensor maths: operators", function()
  for _, dt in ipairs(DTYPES) do
    it(("+ - * / and unary minus on tensors and numbers, either side (%s)"):format(dt), function()
      local F, R = formulas(dt), rounder(dt)
      local x, y = make("transposed", { 3, 4 }, 1, dt), make("narrowed", { 4 }, 2, dt)
      local cases = {
        { x + y, x:add(y) }, { x - y, x:sub(y) }, { x * y, x:mul(y) }, { x / y, x:div(y) },
        { x + 2, x:add(2) }, { 2 + x, x:add(2) }, { x - 0.1, x:sub(0.1) }, { x * 3, x:mul(3) },
        { 3 * x, x:mul(3) }, { x / 3, x:div(3) }, { -x, x:neg() },
      }
      for i, c in ipairs(cases) do
        assert.is_true(T.is_tensor(c[1]), "case " .. i)
        H.assert_same(values(c[1]), values(c[2]), "operator case " .. i)
      end
      -- number - tensor and number / tensor: one operation each
      H.assert_same(values(1 - x), ref_map(F.sub(1), { 3, 4 }, { 1, operand(x) }), "1 - x")
      H.assert_same(values(2 / x), ref_map(F.div, { 3, 4 }, { 2, operand(x) }), "2 / x")
      H.assert_same(values(0.1 / x), ref_map(F.div, { 3, 4 }, { R(0.1), operand(x) }), "0.1 / x")
      -- the expression NorMuon needs
      local O, v = make("contiguous", { 4, 6 }, 3, dt), make("strided", { 4, 1 }, 4, dt):abs()
      local got = O:div(v:sqrt():add(1e-10))
      local d = ref_map(F.add(1), { 4, 1 }, { { shape = { 4, 1 }, vals = ref_map(F.sqrt, { 4, 1 }, { operand(v) }) }, R(1e-10) })
      H.assert_same(values(got), ref_map(F.div, { 4, 6 }, { operand(O), { shape = { 4, 1 }, vals = d } }), "O / (sqrt(v) + eps)")
      H.assert_same(values(O / (v:sqrt() + 1e-10)), values(got), "as operators")
    end)
  end

  it("a tensor is not a pointer: no pointer arithmetic, no pointer difference", function()
    local x = T.from({ 1, 2 }, { 2 })
    assert.same({ 2, 3 }, (x + 1):flat())
    assert.same({ 0, 0 }, (x - x):flat())
    assert.equal("add: other must be a tensor or a number, got string", err_of(function() return x + "a" end))
    assert.equal("add: cannot combine a table with a tensor", err_of(function() return {} + x end))
  end)
end)

-- Reference reduction of shape along dim d (1-based) in row-major order.
local function ref_reduce(op, vals, shape, d, R)
  local outer, n, inner = 1, shape[d], 1
  for i = 1, d - 1 do outer = outer * shape[i] end
  for i = d + 1, #shape do inner = inner * shape[i] end
  local res = {}
  for o = 0, outer - 1 do
    for q = 0, inner - 1 do
      local acc = op == "amax" and -1 / 0 or 0
      for k = 0, n - 1 do
        local v = vals[(o * n + k) * inner + q + 1]
        if op == "norm" then acc = acc + v * v
        elseif op == "amax" then if v > acc or v ~= v then acc = v end
        else acc = acc + v end
      end
      if op == "mean" then acc = n > 0 and acc / n or 0 / 0 end
      if op == "norm" then acc = math.sqrt(acc) end
      res[#res + 1] = R(acc)
    end
  end
  return res
end

describe("tensor maths: reductions", function()
  local SHAPES = { { 3, 4 }, { 2, 3, 5 }, { 7 }, { 1 }, { 0, 3 }, { 3, 0 }, { 1, 40 } }
  for _, dt in ipairs(DTYPES) do
    local R = rounder(dt)
    for _, op in ipairs({ "sum", "mean", "amax", "norm" }) do
      it(("%s %s along every dim (also negative), keepdim true/false, strided inputs"):format(op, dt), function()
        local n = 0
        for si, shape in ipairs(SHAPES) do
          for li, la in ipairs(LAYOUTS) do
            local x = make(la, shape, 10 * si + li, dt)
            if op ~= "norm" then spice(x, si) end
            local vals = values(x)
            for d = 1, #shape do
              for _, keep in ipairs({ false, true }) do
                local dim = (keep and d % 2 == 0) and d - #shape - 1 or d -- negative every other time
                local want_shape = {}
                for i = 1, #shape do
                  if i ~= d then want_shape[#want_shape + 1] = shape[i] elseif keep then want_shape[#want_shape + 1] = 1 end
                end
                local empty_max = op == "amax" and shape[d] == 0 and numel_of(want_shape) > 0
                if empty_max then
                  assert.equal(("amax: dim %d has size 0 (no identity)"):format(d),
                    err_of(function() return x:amax(dim, keep) end))
                else
                  local got = op == "norm" and x:norm(2, dim, keep) or x[op](x, dim, keep)
                  assert.same(want_shape, got:size())
                  assert.equal(dt, got:dtype())
                  H.assert_same(values(got), ref_reduce(op, vals, shape, d, R), ("%s %s dim %d keep %s"):format(op, la, dim, tostring(keep)))
                  n = n + 1
                end
              end
            end
          end
        end
        assert.is_true(n > 80, "cases run: " .. n)
      end)

      it(("%s %s over every element: a Lua number (double, not rounded) or keepdim ones"):format(op, dt), function()
        for _, shape in ipairs({ { 3, 4 }, { 2, 3, 5 }, {}, { 1 }, { 0, 2 } }) do
          local x = make("transposed", shape, 3, dt)
          local vals = values(x)
          if op == "amax" and #vals == 0 then
            assert.equal("amax: the tensor is empty (no identity)", err_of(function() return x:amax() end))
          else
            local want = ref_reduce(op, vals, { #vals }, 1, function(v) return v end)[1]
            local got = op == "norm" and x:norm() or x[op](x)
            assert.equal("number", type(got))
            assert.is_true(same(want, got), ("%s: %.17g vs %.17g"):format(op, got, want))
            local k = op == "norm" and x:norm(2, nil, true) or x[op](x, nil, true)
            local ones = {}
            for i = 1, #shape do ones[i] = 1 end
            assert.same(ones, k:size())
            assert.is_true(same(R(want), k:get(unpack(ones))))
          end
        end
      end)
    end

    it(("float32 sums accumulate in double (%s)"):format(dt), function()
      -- 2^24 + 1 + 1 ...: a float32 accumulator would stay at 2^24
      local x = T.from({ 2 ^ 24, 1, 1, 1, 1 }, { 1, 5 }, dt)
      assert.equal(2 ^ 24 + 4, x:sum())
      assert.equal(2 ^ 24 + 4, x:sum(2):get(1))
      assert.equal(R((2 ^ 24 + 4) / 5), x:mean(-1):get(1))
    end)

    it(("amax propagates NaN (%s)"):format(dt), function()
      local x = T.from({ 1, 0 / 0, 3, 2 }, { 2, 2 }, dt)
      local a = x:amax(2)
      assert.is_true(a:get(1) ~= a:get(1))
      assert.equal(3, a:get(2))
      assert.is_true(x:amax() ~= x:amax())
    end)
  end

  it("norm takes p = 2 only; dims and keepdim are checked", function()
    local x = T.zeros({ 2, 3 })
    assert.equal("norm: only p = 2 (\"fro\") is supported, got 1", err_of(function() return x:norm(1) end))
    assert.equal(0, x:norm("fro"))
    assert.equal("sum: dim 3 out of range for a 2-D tensor (1..2 or -2..-1)", err_of(function() return x:sum(3) end))
    assert.equal("mean: dim -3 out of range for a 2-D tensor (1..2 or -2..-1)", err_of(function() return x:mean(-3) end))
    assert.equal("sum: dim 0 out of range for a 2-D tensor (1..2 or -2..-1)", err_of(function() return x:sum(0) end))
    assert.equal("amax: keepdim must be a boolean, got number", err_of(function() return x:amax(1, 1) end))
    assert.equal("sum: a 0-D tensor has no dim 1 (reduce it with dim = nil)", err_of(function() return T.zeros({}):sum(1) end))
    local m = T.zeros({ 0 }):mean()
    assert.is_true(m ~= m, "mean of nothing is NaN")
    assert.equal(0, T.zeros({ 0 }):sum())
    assert.same({ 0, 0, 0 }, T.zeros({ 3, 0 }):sum(2):flat())
    assert.same({ 0 }, T.zeros({ 3, 0 }):norm(2, 1):size())
  end)
end)

-- Reference product: a double loop over values read with :get.
local function ref_mm(a, b)
  local n, k, m = a:size(1), a:size(2), b:size(2)
  local res, bound = {}, {}
  for i = 1, n do
    for j = 1, m do
      local acc, mag = 0, 0
      for l = 1, k do
        local p = a:get(i, l) * b:get(l, j)
        acc, mag = acc + p, mag + math.abs(p)
      end
      res[#res + 1], bound[#bound + 1] = acc, mag
    end
  end
  return res, bound
end

local function assert_product(got, want, bound, k, dt, what)
  local u = dt == "float32" and 2 ^ -24 or 2 ^ -53
  local g = values(got)
  assert.equal(#want, #g, what)
  for i = 1, #want do
    local tol = 2 * (k + 1) * u * bound[i]
    assert(math.abs(g[i] - want[i]) <= tol,
      ("%s: element %d: %.17g vs %.17g (tol %.3g)"):format(what, i, g[i], want[i], tol))
  end
end

describe("tensor maths: matmul, mm, bmm", function()
  for _, dt in ipairs(DTYPES) do
    it(("mm %s against a double loop, every operand layout (incl. copies for no unit stride)"):format(dt), function()
      for _, s in ipairs({ { 3, 5, 4 }, { 1, 7, 1 }, { 6, 1, 5 }, { 17, 33, 9 } }) do
        local n, k, m = s[1], s[2], s[3]
        for li, la in ipairs(LAYOUTS) do
          for lj, lb in ipairs(LAYOUTS) do
            local a, b = make(la, { n, k }, li, dt), make(lb, { k, m }, 10 + lj, dt)
            local want, bound = ref_mm(a, b)
            local got = a:mm(b)
            assert.same({ n, m }, got:size())
            assert_product(got, want, bound, k, dt, ("mm %s x %s %dx%dx%d"):format(la, lb, n, k, m))
            H.assert_same(values(T.matmul(a, b)), values(got), "matmul == mm")
          end
        end
      end
    end)

    it(("small integers multiply exactly (%s)"):format(dt), function()
      local a = T.from({ { 1, 2, 3 }, { 4, 5, 6 } }, dt)
      local b = T.from({ { 7, 8 }, { 9, 10 }, { 11, 12 } }, dt)
      assert.same({ { 58, 64 }, { 139, 154 } }, a:mm(b):totable())
      assert.same({ { 58, 139 }, { 64, 154 } }, b:transpose(1, 2):mm(a:transpose(1, 2)):totable())
      assert.same({ 14, 32 }, a:matmul(T.from({ 1, 2, 3 }, { 3 }, dt)):flat()) -- matrix @ vector
      assert.same({ 9, 12, 15 }, T.from({ 1, 2 }, { 2 }, dt):matmul(a):flat()) -- vector @ matrix
      local dot = T.from({ 1, 2, 3 }, { 3 }, dt):matmul(T.from({ 4, 5, 6 }, { 3 }, dt))
      assert.equal(0, dot:dim())
      assert.equal(32, dot:get())
    end)

    it(("bmm %s: batches, transposed and batch-narrowed operands; matmul broadcasts a 2-D side"):format(dt), function()
      local B, n, k, m = 3, 4, 5, 2
      local cases = {
        { T.randn({ B, n, k }, 1, dt), T.randn({ B, k, m }, 2, dt) },
        { T.randn({ B, k, n }, 3, dt):transpose(2, 3), T.randn({ B, m, k }, 4, dt):transpose(2, 3) },
        { T.randn({ B + 2, n, k + 1 }, 5, dt):narrow(1, 2, B):narrow(3, 2, k), T.randn({ B, k, m, 2 }, 6, dt):select(4, 1) },
      }
      for ci, c in ipairs(cases) do
        local a, b = c[1], c[2]
        local got = a:bmm(b)
        assert.same({ B, n, m }, got:size())
        for i = 1, B do
          local want, bound = ref_mm(a:select(1, i), b:select(1, i))
          assert_product(got:select(1, i), want, bound, k, dt, ("bmm case %d batch %d"):format(ci, i))
        end
        H.assert_same(values(T.matmul(a, b)), values(got), "matmul 3-D == bmm")
      end
      local a, w = T.randn({ B, n, k }, 7, dt), T.randn({ k, m }, 8, dt)
      local got = a:matmul(w)
      for i = 1, B do
        local want, bound = ref_mm(a:select(1, i), w)
        assert_product(got:select(1, i), want, bound, k, dt, "3-D @ 2-D batch " .. i)
      end
      local left = w:transpose(1, 2):matmul(a:transpose(2, 3)) -- (m x k) @ (B x k x n)
      assert.same({ B, m, n }, left:size())
      for i = 1, B do
        local want, bound = ref_mm(w:transpose(1, 2), a:select(1, i):transpose(1, 2))
        assert_product(left:select(1, i), want, bound, k, dt, "2-D @ 3-D batch " .. i)
      end
    end)

    it(("C API: k = 0 writes zeros into out; out must not share storage (%s)"):format(dt), function()
      local C = require("muon.core").C
      local out = T.zeros({ 2, 3 }, dt):fill(7)
      assert.equal(0, C.mu_tensor_matmul(T.zeros({ 2, 0 }, dt), T.zeros({ 0, 3 }, dt), out))
      assert.same({ 0, 0, 0, 0, 0, 0 }, out:flat())
      local a = T.zeros({ 2, 2 }, dt)
      assert.is_true(C.mu_tensor_matmul(a, T.zeros({ 2, 2 }, dt), a) < 0)
      assert.equal("matmul: the output shares storage with an input", require("ffi").string(C.mu_last_error()))
    end)

    it(("empty products (%s): zero rows, zero columns, k = 0 gives zeros, empty batch"):format(dt), function()
      -- the result of a product of huge (empty) operands is refused before allocating
      assert.equal("mm: shape too large", err_of(function() return T.zeros({ 2 ^ 31, 0 }, dt):mm(T.zeros({ 0, 2 ^ 31 }, dt)) end))
      assert.same({ 0, 4 }, T.zeros({ 0, 3 }, dt):mm(T.zeros({ 3, 4 }, dt)):size())
      assert.same({ 3, 0 }, T.zeros({ 3, 2 }, dt):mm(T.zeros({ 2, 0 }, dt)):size())
      local z = T.randn({ 3, 0 }, 1, dt):mm(T.randn({ 0, 4 }, 2, dt))
      assert.same({ 3, 4 }, z:size())
      assert.equal(0, z:norm())
      assert.same({ 0, 2, 2 }, T.zeros({ 0, 2, 3 }, dt):bmm(T.zeros({ 0, 3, 2 }, dt)):size())
    end)
  end

  it("shape and dtype errors name the op and the shapes", function()
    local a, b = T.zeros({ 2, 3 }), T.zeros({ 4, 5 })
    assert.equal("mm: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)", err_of(function() return a:mm(b) end))
    assert.equal("matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)", err_of(function() return a:matmul(b) end))
    assert.equal("mm: expected 2-D tensors, got [2, 3, 4] and [4, 5]", err_of(function() return T.zeros({ 2, 3, 4 }):mm(b) end))
    assert.equal("bmm: expected 3-D tensors, got [2, 3] and [4, 5]", err_of(function() return a:bmm(b) end))
    assert.equal("bmm: batch sizes differ: [2, 3, 4] and [3, 4, 5]",
      err_of(function() return T.zeros({ 2, 3, 4 }):bmm(T.zeros({ 3, 4, 5 })) end))
    assert.equal("matmul: batch sizes of [2, 3, 4] and [3, 4, 5] differ",
      err_of(function() return T.zeros({ 2, 3, 4 }):matmul(T.zeros({ 3, 4, 5 })) end))
    assert.equal("mm: dtype mismatch: self is float32 but other is float64",
      err_of(function() return a:mm(T.zeros({ 3, 2 }, "float64")) end))
    assert.equal("matmul: other must be a tensor, got number", err_of(function() return a:matmul(2) end))
    assert.equal("matmul: self has shape []; 1-D, 2-D and 3-D tensors are supported",
      err_of(function() return T.zeros({}):matmul(a) end))
    assert.equal("matmul: other has shape [1, 1, 1, 1]; 1-D, 2-D and 3-D tensors are supported",
      err_of(function() return a:matmul(T.zeros({ 1, 1, 1, 1 })) end))
  end)
end)

describe("tensor maths: errors", function()
  local x = T.zeros({ 2, 3 })
  local cases = {
    { function() return x:add(T.zeros({ 4 })) end, "add: shapes self [2, 3] and other [4] are not broadcastable" },
    { function() return x:mul(T.zeros({ 3, 2 })) end, "mul: shapes self [2, 3] and other [3, 2] are not broadcastable" },
    { function() return x:addcmul(T.zeros({ 3 }), T.zeros({ 4, 1, 2 })) end,
      "addcmul: shapes self [2, 3], tensor1 [3] and tensor2 [4, 1, 2] are not broadcastable" },
    { function() return x:add_(T.zeros({ 3, 2, 3 })) end,
      "add_: self's shape [2, 3] does not match the broadcast shape [3, 2, 3] (in-place ops cannot grow self)" },
    { function() return T.zeros({ 2, 1 }):div_(x) end,
      "div_: self's shape [2, 1] does not match the broadcast shape [2, 3] (in-place ops cannot grow self)" },
    { function() return x:add(T.zeros({ 3 }, "float64")) end, "add: dtype mismatch: other is float64 but self is float32" },
    { function() return x:lerp(x, T.zeros({ 3 }, "float64")) end, "lerp: dtype mismatch: weight is float64 but self is float32" },
    { function() return T.where(T.zeros({ 3 }, "float64"), x, 0) end,
      "where: dtype mismatch: condition is float64 but input is float32" },
    { function() return x:masked_fill_(T.zeros({ 3 }, "float64"), 1) end,
      "masked_fill_: dtype mismatch: mask is float64 but self is float32" },
    { function() return x:add({}) end, "add: other must be a tensor or a number, got table" },
    { function() return x:add(1, "2") end, "add: alpha must be a number, got string" },
    { function() return x:addcmul(x, x, {}) end, "addcmul: value must be a number, got table" },
    { function() return x:lerp(1, 0.5) end, "lerp: end must be a tensor, got number" },
    { function() return T.where(1, x, x) end, "where: condition must be a tensor, got number" },
    { function() return x:masked_fill(x, x) end, "masked_fill: value must be a number, got cdata" },
    { function() return x:clamp() end, "clamp: at least one of min and max must be given" },
    { function() return x:clamp(0 / 0) end, "clamp: min and max must not be NaN" },
    { function() return x:clamp_("a") end, "clamp_: min must be a number, got string" },
    { function() return T.sqrt(4) end, "sqrt: self must be a tensor, got number" },
    { function() return T.add_(2, x) end, "add_: self must be a tensor, got number" },
    { function() return x:add_(x:narrow(1, 1, 1)) end,
      "add: other (x[1]) shares memory with the output in a different layout (partial overlap); clone() it first" },
    { function() local y = T.zeros({ 3, 3 }); return y:transpose(1, 2):add_(y) end,
      "add: other (x[1]) shares memory with the output in a different layout (partial overlap); clone() it first" },
    { function() return x:masked_fill_(x:narrow(1, 2, 1), 1) end,
      "masked_fill_: where: condition (x[0]) shares memory with the output in a different layout (partial overlap); clone() it first" },
  }
  for i, c in ipairs(cases) do
    it("case " .. i .. ": " .. c[2], function() assert.equal(c[2], err_of(c[1])) end)
  end

  it("errors blame the line that called the op (methods, module functions, operators)", function()
    local calls = {
      function() local r = x:add({}) return r end, function() local r = x:add_(T.zeros({ 3, 3 })) return r end,
      function() local r = T.where(x, x, {}) return r end, function() local r = x:sum(5) return r end,
      function() local r = x:norm(2, 1, 1) return r end, function() local r = x:mm(x) return r end,
      function() local r = x:matmul(x) return r end, function() local r = x:clamp("a") return r end,
      function() local r = x + {} return r end, function() local r = {} - x return r end,
      function() local r = x * T.zeros({ 4 }) return r end, function() local r = x:lerp(x, "w") return r end,
    }
    for i, f in ipairs(calls) do
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("^[^:]*tensor_math_spec%.lua:%d+: "), "call " .. i .. ": " .. tostring(err))
    end
  end)

  it("exact in-place aliasing is fine: x op= x, and disjoint views of one storage", function()
    local y = T.from({ { 1, 2 }, { 3, 4 } })
    y:mul_(y)
    assert.same({ { 1, 4 }, { 9, 16 } }, y:totable())
    y:select(2, 1):add_(y:select(2, 2)) -- columns: not dense, disjoint
    assert.same({ { 5, 4 }, { 25, 16 } }, y:totable())
    y:narrow(1, 1, 1):sub_(y:narrow(1, 2, 1)) -- rows: dense, disjoint
    assert.same({ { -20, -12 }, { 25, 16 } }, y:totable())
  end)
end)

describe("tensor maths: copy, fill, all_finite on strided views", function()
  it("all_finite reports the row-major index of the first NaN/Inf", function()
    local ffi, C = require("ffi"), require("muon.core").C
    for _, dt in ipairs(DTYPES) do
      local x = make("transposed", { 4, 5 }, 1, dt)
      local where = ffi.new("int64_t[1]")
      assert.equal(1, C.mu_tensor_all_finite(x, where))
      x:set(1 / 0, 3, 2)
      x:set(0 / 0, 4, 1)
      assert.equal(0, C.mu_tensor_all_finite(x, where))
      assert.equal(11, tonumber(where[0])) -- (3, 2): 2 * 5 + 1
      assert.is_false(x:all_finite())
    end
  end)

  it("copy converts dtypes between strided views; fill reaches every element", function()
    for _, a in ipairs(DTYPES) do
      for _, b in ipairs(DTYPES) do
        local src = spice(make("strided", { 3, 4 }, 2, a))
        local dst = make("transposed", { 3, 4 }, 3, b)
        dst:copy(src)
        local want = values(src)
        for i, v in ipairs(want) do want[i] = rounder(b)(v) end
        H.assert_same(values(dst), want, a .. " -> " .. b)
        dst:fill(0.1)
        for _, v in ipairs(values(dst)) do assert.equal(rounder(b)(0.1), v) end
      end
    end
  end)
end)

describe("tensor maths: kernel variants", function()
  -- The AVX2+FMA kernels (picked when the CPU has them) and the portable ones
  -- (MU_TENSOR_NOSIMD=1) must agree bit for bit; sizes with vector tails.
  local ffi = require("ffi")
  after_each(function() ffi.C.setenv("MU_TENSOR_NOSIMD", "", 1) end)

  local function battery(dt)
    local x, y = spice(make("contiguous", { 37, 19 }, 1, dt)), make("contiguous", { 37, 19 }, 2, dt)
    local xs, c = make("strided", { 37, 19 }, 3, dt), make("contiguous", { 37, 1 }, 4, dt):abs()
    local w = make("contiguous", { 19 }, 5, dt):abs()
    local out = {
      x:add(y), x:add(y, 0.3), x:sub(y, -1.7), x:mul(y), x:div(y), x:div(c), x:add(0.1), xs:mul(y),
      x:addcmul(y, c, 0.7), x:addcdiv(y, c, 0.3), x:lerp(y, 0.3), x:lerp(y, 0.8), x:lerp(y, w),
      T.where(x:gt(0), x, y), x:masked_fill(x:lt(0), 2), x:gt(y), x:le(0), x:ne(x),
      x:neg(), x:abs(), x:abs():sqrt(), x:abs():rsqrt(), x:sign(), x:clamp(-0.5, 0.5),
      x:sum(1), x:sum(2), x:mean(1), x:amax(2), x:norm(2, 1), xs:sum(2), x:clone():mul_(y):add_(y, 0.5),
    }
    local vals = H.values_of(out)
    vals[#vals + 1] = x:sum()
    vals[#vals + 1] = xs:norm()
    return vals
  end

  for _, dt in ipairs(DTYPES) do
    it(dt .. ": AVX2+FMA and portable kernels agree bitwise", function()
      local portable, simd = H.portable_then_simd(function() return battery(dt) end)
      assert.is_true(#simd > 15000, #simd)
      H.assert_same(simd, portable, dt)
    end)
  end
end)

describe("tensor maths: handles whose fields were changed through the FFI", function()
  -- Trusted code can write a tensor's fields; every op checks that the
  -- elements it would touch lie inside the storage before touching memory.
  local KINDS = {
    dims = { function(t) t.dims[0] = 1e9 end, "tensor addresses elements 0..2999999999 outside its storage of 24 bytes" },
    stride = { function(t) t.strides[1] = 1000 end, "tensor addresses elements 0..2003 outside its storage of 24 bytes" },
    ["negative stride"] = { function(t) t.strides[1] = -1 end,
      "tensor has a bad layout (negative size or stride, or sizes and strides that overflow)" },
    ndim = { function(t) t.ndim = 9 end, "tensor has 9 dims (0..8 allowed)" },
    offset = { function(t) t.offset = 1 end, "tensor: data pointer and offset disagree" },
    overflow = { function(t) t.dims[0], t.strides[0] = 2 ^ 62, 2 ^ 62 end,
      "tensor has a bad layout (negative size or stride, or sizes and strides that overflow)" },
    data = { function(t) t.data = t.data end, nil },
  }
  local function corrupt(kind)
    local t = T.zeros({ 2, 3 })
    KINDS[kind][1](t)
    return t
  end

  for kind, k in pairs(KINDS) do
    it("mu_tensor_check: " .. kind, function()
      local rc = H.muon.core and 0 or 0
      local C = require("muon.core").C
      local t = corrupt(kind)
      rc = C.mu_tensor_check(t)
      if k[2] == nil then
        assert.equal(0, rc)
      else
        assert.is_true(rc < 0)
        assert.equal(k[2], require("ffi").string(C.mu_last_error()))
      end
    end)
  end
  local good = T.zeros({ 2, 3 })
  local ops = {
    add = function(t) return t:add(good) end, add_other = function(t) return good:add(t) end,
    add_ = function(t) return t:add_(1) end, sum = function(t) return t:sum(1) end,
    sum_all = function(t) return t:sum() end, mm = function(t) return t:mm(T.zeros({ 3, 2 })) end,
    copy = function(t) return good:copy(t) end, fill = function(t) return t:fill(1) end,
    get = function(t) return t:get(1, 1) end, narrow = function(t) return t:narrow(1, 1, 1) end,
    transpose = function(t) return t:transpose(1, 2) end, all_finite = function(t) return t:all_finite() end,
    foreach = function(t) return require("muon.foreach").scale({ t }, 2) end,
  }
  for _, kind in ipairs({ "dims", "stride", "negative stride", "ndim", "offset", "overflow" }) do
    it(kind .. ": every op fails before touching memory", function()
      for name, f in pairs(ops) do
        local ok, err = pcall(f, corrupt(kind))
        assert.is_false(ok, kind .. " -> " .. name)
        -- a message: a string, or a muon error object (core.check's)
        assert.is_true(type(err) == "string" or require("muon.errors").is(err), name)
      end
    end)
  end
end)
