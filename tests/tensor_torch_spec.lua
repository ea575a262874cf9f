-- The maths of lua/muon/tensor_math.lua (and exp, log, tanh, sigmoid in
-- tensor.lua) against torch: reference values computed once in float64 by
-- Debian's torch 1.13 (tests/fixtures/torch/maths.py wrote
-- tests/fixtures/torch/maths.lua; no torch is needed here). Inputs are
-- exact in float32, so both dtypes are checked against the same float64
-- values: float64 within a few ulp (torch's vectorized exp/log/pow/tanh
-- are SLEEF's, ours the C library's: both within 1 ulp of the true value),
-- float32 within a few float32 ulp. Exact ops (argmax, gather, cat, stack)
-- and the repr's text must match exactly. Every case runs on contiguous,
-- transposed, narrowed and stride-2 tensors whose storage around the view
-- holds a sentinel, which in-place forms must leave alone.
local H = require("helpers")
local T = H.T
local REF = dofile(H.fixtures .. "/torch/maths.lua")

local DTYPES = { "float32", "float64" }
local LAYOUTS = { "contiguous", "transposed", "narrowed", "strided" }
local SENTINEL = 777.25

local function parse(s)
  local t = {}
  for w in s:gmatch("%S+") do t[#t + 1] = assert(tonumber(w), w) end
  return t
end

-- A tensor with the values (row-major) of fixture entry ref in a layout,
-- and the base tensor whose storage it views (the rest holds SENTINEL).
local function place(ref, layout, dt)
  local shape = ref.shape
  local n = #shape
  local base, t
  if layout == "transposed" and n >= 2 then
    local s = { unpack(shape) }
    s[1], s[n] = s[n], s[1]
    base = T.full(s, SENTINEL, dt)
    t = base:transpose(1, n)
  elseif layout == "narrowed" and n >= 1 then
    local big = {}
    for i, d in ipairs(shape) do big[i] = d + 2 end
    base = T.full(big, SENTINEL, dt)
    t = base
    for i, d in ipairs(shape) do t = t:narrow(i, 2, d) end
  elseif layout == "strided" and n >= 1 then
    local big = { unpack(shape) }
    big[n + 1] = 2
    base = T.full(big, SENTINEL, dt)
    t = base:select(n + 1, 2)
  else
    base = T.full(shape, SENTINEL, dt)
    t = base
  end
  t:copy(T.from(parse(ref.v), shape, dt))
  return t, base
end

-- The storage around a view still holds only SENTINEL.
local function untouched_margin(t, base, what)
  local n = 0
  for _, v in ipairs(base:flat()) do
    if v == SENTINEL then n = n + 1 end
  end
  assert(n >= base:numel() - t:numel(), what .. ": an in-place op wrote outside its view")
end

-- Tolerances against the float64 reference: |got - want| <= rtol |want| + atol.
local TOL = { float64 = { rtol = 4 * 2 ^ -52, atol = 1e-300 }, float32 = { rtol = 4 * 2 ^ -23, atol = 1e-37 } }

local function assert_close(got, ref, dt, what, tol)
  tol = tol or TOL[dt]
  assert.same(ref.shape, got:size(), what .. ": shape")
  assert.equal(dt, got:dtype(), what .. ": dtype")
  local want, vals = parse(ref.v), H.values(got)
  assert(#vals == #want, what .. ": element count")
  for i = 1, #want do
    local g, w = vals[i], want[i]
    local ok
    if w ~= w then ok = g ~= g
    elseif w == math.huge or w == -math.huge then ok = g == w
    else ok = math.abs(g - w) <= tol.rtol * math.abs(w) + tol.atol end
    if not ok then error(("%s: element %d is %.17g, torch says %.17g"):format(what, i, g, w), 2) end
  end
end

local function assert_exact(got, ref, what)
  assert.same(ref.shape, got:size(), what .. ": shape")
  H.assert_same(H.values(got), parse(ref.v), what)
end

-- Message of an error without its "file:line: " prefix.
local function err_of(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return (tostring(err):gsub("^[^:]*:%d+: ", ""))
end

describe("tensor maths against torch: exp, log, tanh, sigmoid", function()
  for _, dt in ipairs(DTYPES) do
    for _, case in ipairs(REF.unary) do
      local op = case.op
      it(("%s %s: every layout, module form, in place"):format(op, dt), function()
        for _, layout in ipairs(LAYOUTS) do
          local x, base = place(case.x, layout, dt)
          local what = ("%s %s %s"):format(op, dt, layout)
          local out = x[op](x)
          assert.is_true(out:is_contiguous())
          assert_close(out, case.out, dt, what)
          assert_close(T[op](x), case.out, dt, "T." .. what)
          assert.is_true(rawequal(x[op .. "_"](x), x), "in place returns self")
          assert_close(x, case.out, dt, what .. " in place")
          untouched_margin(x, base, what)
        end
      end)
    end

    it(("exp, log, tanh, sigmoid %s: empty and 0-D tensors"):format(dt), function()
      for _, op in ipairs({ "exp", "log", "tanh", "sigmoid" }) do
        assert.same({ 0, 3 }, T.zeros({ 0, 3 }, dt)[op](T.zeros({ 0, 3 }, dt)):size())
        assert.same({ 4, 0 }, T.zeros({ 0, 4 }, dt):transpose(1, 2)[op](T.zeros({ 0, 4 }, dt):transpose(1, 2)):size())
      end
      assert.equal(1, T.zeros({}, dt):exp():get())
      assert.equal(-math.huge, T.zeros({}, dt):log():get())
      assert.equal(0.5, T.zeros({}, dt):sigmoid():get())
    end)
  end
end)

describe("tensor maths against torch: pow", function()
  for _, dt in ipairs(DTYPES) do
    it(("pow %s: tensor exponents broadcast ([4, 5] ^ [5], [4, 5] ^ [4, 1]), in place"):format(dt), function()
      for ci, case in ipairs(REF.pow) do
        for li, layout in ipairs(LAYOUTS) do
          local a, base = place(case.a, layout, dt)
          local b = place(case.b, LAYOUTS[li % 4 + 1], dt)
          local what = ("pow %s case %d %s"):format(dt, ci, layout)
          assert_close(a:pow(b), case.out, dt, what)
          assert_close(T.pow(a, b), case.out, dt, "T." .. what)
          assert_close(a ^ b, case.out, dt, what .. " (^)")
          a:pow_(b)
          assert_close(a, case.out, dt, what .. " in place")
          untouched_margin(a, base, what)
        end
      end
    end)

    it(("pow %s: number exponents as torch computes them (x*x, x*x*x, sqrt, 1/x, ...)"):format(dt), function()
      local R = REF.pow_scalar
      for _, case in ipairs(R) do
        for _, layout in ipairs(LAYOUTS) do
          local a, base = place(R.a, layout, dt)
          local what = ("pow %s ^ %g %s"):format(dt, case.e, layout)
          assert_close(a:pow(case.e), case.out, dt, what)
          assert_close(a ^ case.e, case.out, dt, what .. " (^)")
          a:pow_(case.e)
          assert_close(a, case.out, dt, what .. " in place")
          untouched_margin(a, base, what)
        end
      end
      -- the products are the rounded products, not pow (which rounds once)
      local x = T.from({ 1 + 2 ^ -20, 3 + 2 ^ -21 }, { 2 }, dt)
      for i, v in ipairs(x:flat()) do
        local R32 = dt == "float32" and H.f32 or function(y) return y end
        assert.equal(R32(R32(v * v) * v), x:pow(3):get(i))
        assert.equal(R32(1 / R32(v * v)), x:pow(-2):get(i))
      end
    end)

    it(("pow %s: a number base (T.pow(2, x), 2 ^ x)"):format(dt), function()
      local R = REF.scalar_pow
      for _, case in ipairs(R) do
        for _, layout in ipairs(LAYOUTS) do
          local b = place(R.b, layout, dt)
          local what = ("pow %s %g ^ x %s"):format(dt, case.s, layout)
          assert_close(T.pow(case.s, b), case.out, dt, what)
          assert_close(case.s ^ b, case.out, dt, what .. " (^)")
        end
      end
    end)
  end

  it("pow: errors name the operand", function()
    local x = T.zeros({ 2, 3 })
    assert.truthy(err_of(T.pow, x, T.zeros({ 4 }))
      :find("pow: shapes self [2, 3] and exponent [4] are not broadcastable", 1, true))
    assert.truthy(err_of(T.pow, x, "2"):find("pow: exponent must be a tensor or a number, got string", 1, true))
    assert.truthy(err_of(T.pow, 2, 3):find("pow: no tensor among the arguments", 1, true))
    assert.truthy(err_of(x.pow_, x, T.zeros({ 3, 2, 3 })):find("pow_: self's shape [2, 3] does not match", 1, true))
    assert.truthy(err_of(T.pow, x, T.zeros({ 3 }, "float64")):find("pow: dtype mismatch", 1, true))
  end)
end)

describe("tensor maths against torch: softmax and log_softmax", function()
  for _, dt in ipairs(DTYPES) do
    -- a float32 result is within 1 ulp of the double result; log_softmax
    -- near 0 is a difference of O(1) terms, so it gets an absolute tolerance
    local tol = dt == "float32" and { rtol = 2 * 2 ^ -23, atol = 1e-37 } or { rtol = 8 * 2 ^ -52, atol = 1e-300 }
    local ltol = dt == "float32" and { rtol = 2 ^ -23, atol = 2 ^ -22 } or { rtol = 8 * 2 ^ -52, atol = 2 ^ -49 }
    it(("softmax, log_softmax %s: along every dim, -inf, inf, NaN and large slices"):format(dt), function()
      for gi, group in ipairs(REF.softmax) do
        for _, case in ipairs(group) do
          local dim = case.dim >= 0 and case.dim + 1 or case.dim
          for _, layout in ipairs(LAYOUTS) do
            local x = place(group.x, layout, dt)
            local what = ("%s group %d dim %d %s"):format(dt, gi, dim, layout)
            assert_close(x:softmax(dim), case.out, dt, "softmax " .. what, tol)
            assert_close(T.softmax(x, dim), case.out, dt, "T.softmax " .. what, tol)
            assert_close(x:log_softmax(dim), case.log, dt, "log_softmax " .. what, ltol)
          end
        end
      end
    end)

    it(("softmax %s: empty slices and tensors, 0-D tensors"):format(dt), function()
      assert.same({ 0, 4 }, T.zeros({ 0, 4 }, dt):softmax(2):size())
      assert.same({ 3, 0 }, T.zeros({ 3, 0 }, dt):softmax(2):size())
      assert.same({ 3, 0 }, T.zeros({ 3, 0 }, dt):log_softmax(1):size())
      assert.equal(1, T.from({ -3 }, dt):view({}):softmax(1):get())
      assert.equal(0, T.from({ 5 }, dt):view({}):log_softmax(-1):get())
    end)
  end

  it("softmax: the dim is required and checked", function()
    local x = T.zeros({ 2, 3 })
    assert.truthy(err_of(x.softmax, x):find("softmax: dim is required", 1, true))
    assert.truthy(err_of(x.log_softmax, x, 3):find("log_softmax: dim 3 out of range for a 2-D tensor", 1, true))
    assert.truthy(err_of(T.softmax, "x", 1):find("softmax: self must be a tensor, got string", 1, true))
    assert.truthy(err_of(T.softmax, T.zeros({}), 2):find("softmax: dim 2 out of range for a 0-D tensor", 1, true))
  end)
end)

describe("tensor maths against torch: argmax", function()
  for _, dt in ipairs(DTYPES) do
    it(("argmax %s: whole and along each dim; ties go to the first, NaN counts as largest"):format(dt), function()
      for ci, case in ipairs(REF.argmax) do
        for _, layout in ipairs(LAYOUTS) do
          local x = place(case.x, layout, dt)
          local what = ("argmax %s case %d %s"):format(dt, ci, layout)
          assert.equal(case.whole + 1, x:argmax(), what)
          assert.equal(case.whole + 1, T.argmax(x), what)
          local kept = x:argmax(nil, true)
          assert.equal(x:dim(), kept:dim())
          assert.equal(1, kept:numel())
          assert.equal(case.whole + 1, kept:flat()[1])
          for d, ref in ipairs(case.dims) do
            local want = { shape = ref.shape, v = table.concat((function()
              local l = {}
              for i, v in ipairs(parse(ref.v)) do l[i] = ("%d"):format(v + 1) end
              return l
            end)(), " ") }
            local got = x:argmax(d)
            assert.equal(dt, got:dtype())
            assert_exact(got, want, what .. " dim " .. d)
            assert_exact(x:argmax(d - x:dim() - 1), want, what .. " dim " .. (d - x:dim() - 1))
            local k = x:argmax(d, true)
            local ks = x:size()
            ks[d] = 1
            assert.same(ks, k:size())
            H.assert_same(H.values(k), parse(want.v), what .. " keepdim")
          end
        end
      end
    end)
  end

  it("argmax: empty tensors and dims are errors; a 1-element dim gives 1", function()
    local ok, err = pcall(T.argmax, T.zeros({ 0, 3 }))
    assert.is_false(ok)
    assert.equal(H.muon.errors.ESHAPE, err.code)
    assert.truthy(err_of(T.argmax, T.zeros({ 3, 0 }), 2):find("argmax: dim 2 has size 0", 1, true))
    assert.same({ 0 }, T.zeros({ 3, 0 }):argmax(1):size()) -- no slices: fine, as torch
    H.assert_same({ 1, 1 }, T.zeros({ 2, 1 }):argmax(2):flat())
    assert.equal(1, T.from({ 4 }):view({}):argmax())
    assert.truthy(err_of(T.argmax, T.zeros({ 2 }), 2):find("argmax: dim 2 out of range", 1, true))
  end)

  it("argmax float32: indices beyond 2^24 are refused (not exact in float32)", function()
    -- a stride-0 view of one element: 2^24 + 2 elements without the memory
    local one = T.zeros({ 1 })
    local wide = T.wrap(one:ptr(), { 2, 2 ^ 24 + 2 }, "float32", { 0, 0 })
    local ok, err = pcall(wide.argmax, wide, 2)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("float32 holds exact indices only up to 16777216", 1, true), tostring(err))
    assert.equal(1, wide:argmax()) -- the flat index is a Lua number: exact
  end)
end)

describe("tensor maths against torch: gather", function()
  for _, dt in ipairs(DTYPES) do
    it(("gather %s: along each dim, index smaller than the input, strided input and index"):format(dt), function()
      for ci, case in ipairs(REF.gather) do
        local idx1 = { shape = case.index.shape, v = table.concat((function()
          local l = {}
          for i, v in ipairs(parse(case.index.v)) do l[i] = ("%d"):format(v + 1) end
          return l
        end)(), " ") }
        for li, layout in ipairs(LAYOUTS) do
          for _, idt in ipairs(DTYPES) do
            local x = place(case.x, layout, dt)
            local index = place(idx1, LAYOUTS[li % 4 + 1], idt)
            local what = ("gather %s case %d %s index %s"):format(dt, ci, layout, idt)
            assert_exact(x:gather(case.dim + 1, index), case.out, what)
            assert_exact(T.gather(x, case.dim - x:dim(), index), case.out, what .. " (negative dim)")
          end
        end
      end
    end)
  end

  it("gather: argmax's indices pick the maxima (x:gather(d, x:argmax(d, true)))", function()
    local x = T.randn({ 5, 7 }, 3)
    local m = x:gather(2, x:argmax(2, true))
    H.assert_same(m:flat(), x:amax(2, true):flat(), "row maxima")
  end)

  it("gather: bad indices are refused before anything is written, naming the position", function()
    local x = T.from({ { 1, 2, 3 }, { 4, 5, 6 } })
    local function msg(...) return err_of(x.gather, x, ...) end
    assert.truthy(msg(2, T.from({ { 1, 4 }, { 1, 1 } })):find("gather: index[1, 2] is 4, not an integer in 1..3 (dim 2 of the tensor)", 1, true))
    assert.truthy(msg(2, T.from({ { 1, 1 }, { 0, 1 } })):find("index[2, 1] is 0, not an integer in 1..3", 1, true))
    assert.truthy(msg(1, T.from({ { 1.5, 1 } })):find("index[1, 1] is 1.5, not an integer in 1..2", 1, true))
    assert.truthy(msg(1, T.from({ { 0 / 0, 1 } })):find("index[1, 1] is nan, not an integer in 1..2", 1, true))
    assert.truthy(msg(2, T.from({ 1, 2 })):find("gather: index [2] and tensor [2, 3] must have the same number of dims", 1, true))
    assert.truthy(msg(2, T.from({ { 1 }, { 1 }, { 1 } })):find("gather: index [3, 1] is larger than the tensor [2, 3] in dim 1", 1, true))
    assert.truthy(msg(3, T.from({ { 1 } })):find("gather: dim 3 out of range", 1, true))
    assert.truthy(msg(1, "i"):find("gather: index must be a tensor, got string", 1, true))
    assert.same({ 0, 3 }, x:gather(1, T.zeros({ 0, 3 })):size())
    assert.truthy(err_of(T.zeros({ 0, 2 }).gather, T.zeros({ 0, 2 }), 1, T.ones({ 1, 2 })):find("dim 1 of the tensor has size 0", 1, true))
  end)
end)

describe("tensor maths against torch: cat and stack", function()
  for _, dt in ipairs(DTYPES) do
    it(("cat %s: along each dim, negative dims, empty parts (torch skips 1-D empty ones)"):format(dt), function()
      for ci, case in ipairs(REF.cat) do
        for li = 1, #LAYOUTS do
          local xs = {}
          for k, ref in ipairs(case.xs) do xs[k] = place(ref, LAYOUTS[(li + k) % 4 + 1], dt) end
          local dim = case.dim >= 0 and case.dim + 1 or case.dim
          assert_exact(T.cat(xs, dim), case.out, ("cat %s case %d"):format(dt, ci))
        end
      end
    end)

    it(("stack %s: a new dim at each position"):format(dt), function()
      for ci, case in ipairs(REF.stack) do
        for li = 1, #LAYOUTS do
          local xs = {}
          for k, ref in ipairs(case.xs) do xs[k] = place(ref, LAYOUTS[(li + k) % 4 + 1], dt) end
          local dim = case.dim >= 0 and case.dim + 1 or case.dim
          assert_exact(T.stack(xs, dim), case.out, ("stack %s case %d"):format(dt, ci))
        end
      end
    end)
  end

  it("cat and stack: defaults, errors naming the tensor", function()
    local a, b = T.from({ { 1, 2 } }), T.from({ { 3, 4 } })
    H.assert_same({ 1, 2, 3, 4 }, T.cat({ a, b }):flat())
    assert.same({ 2, 1, 2 }, T.stack({ a, b }):size())
    assert.same({ 0 }, T.cat({ T.zeros({ 0 }), T.zeros({ 0 }) }):size())
    assert.truthy(err_of(T.cat, { a, T.zeros({ 1, 3 }) }, 1)
      :find("cat: sizes must match except in dim 1: tensors[1] is [1, 2] but tensors[2] is [1, 3]", 1, true))
    assert.truthy(err_of(T.cat, { a, T.zeros({ 2 }) }):find("tensors[2] is [2]", 1, true))
    assert.truthy(err_of(T.cat, { a, b:to("float64") }):find("cat: dtype mismatch: tensors[2] is float64 but tensors[1] is float32", 1, true))
    assert.truthy(err_of(T.cat, { a, 3 }):find("cat: tensors[2] must be a tensor, got number", 1, true))
    assert.truthy(err_of(T.cat, {}):find("cat: tensors must be a non-empty list", 1, true))
    assert.truthy(err_of(T.cat, a):find("cat: tensors must be a list of tensors", 1, true))
    assert.truthy(err_of(T.cat, { a, b }, 3):find("cat: dim 3 out of range", 1, true))
    assert.truthy(err_of(T.cat, { T.zeros({}) }):find("cat: tensors[1] is 0-D", 1, true))
    assert.truthy(err_of(T.stack, { a, T.zeros({ 2, 1 }) })
      :find("stack: tensors must have one shape: tensors[1] is [1, 2] but tensors[2] is [2, 1]", 1, true))
    assert.truthy(err_of(T.stack, { a, b }, 4):find("stack: dim 4 out of range for 2-D tensors (1..3 or -3..-1)", 1, true))
    assert.truthy(err_of(T.stack, { [1] = a, [3] = b }):find("stack: tensors must be a list", 1, true))
  end)
end)

describe("tensor repr (tostring) against torch's", function()
  -- torch's text without its dtype suffix; ours ends with size and dtype
  local function body(s) return (s:gsub(", size=%[[%d, ]*%], dtype=%w+%)$", ")")) end
  it("prints the same text as torch 1.13: layout, precision, scientific and integer modes, summaries", function()
    for ci, case in ipairs(REF.repr) do
      for _, dt in ipairs(DTYPES) do
        local x = T.from(parse(case.x.v), case.x.shape, dt)
        assert.equal(case.text, body(tostring(x)), ("case %d %s"):format(ci, dt))
      end
      local x = place(case.x, "transposed", "float64")
      assert.equal(case.text, body(tostring(x)), ("case %d transposed"):format(ci))
    end
  end)

  it("ends with the size and the dtype", function()
    assert.equal("tensor([[1., 2.]], size=[1, 2], dtype=float32)", tostring(T.from({ { 1, 2 } })))
    assert.equal("tensor(0.5000, size=[], dtype=float64)", tostring(T.from({ 0.5 }, "float64"):view({})))
    assert.equal("tensor([], size=[2, 0], dtype=float32)", tostring(T.zeros({ 2, 0 })))
    local big = tostring(T.zeros({ 3000, 3000 })) -- summarized: reads 36 elements
    assert.truthy(big:find("...", 1, true))
    assert.truthy(big:find("size=[3000, 3000], dtype=float32)", 1, true))
  end)
end)

describe("tensor constructors, in-place names, unknown members", function()
  it("ones, full, *_like keep the shape, take the dtype from the input unless given", function()
    H.assert_same({ 1, 1, 1, 1, 1, 1 }, T.ones({ 2, 3 }):flat())
    assert.equal("float64", T.ones({ 2 }, "float64"):dtype())
    H.assert_same({ -2.5, -2.5 }, T.full({ 2 }, -2.5, "float64"):flat())
    local x = T.randn({ 3, 2 }, 1, "float64"):transpose(1, 2)
    for _, f in ipairs({ "zeros_like", "ones_like", "rand_like", "randn_like" }) do
      local y = T[f](x)
      assert.same({ 2, 3 }, y:size(), f)
      assert.equal("float64", y:dtype(), f)
      assert.is_true(y:is_contiguous(), f)
    end
    for _, f in ipairs({ "zeros_like", "ones_like" }) do assert.equal("float32", T[f](x, "float32"):dtype(), f) end
    for _, f in ipairs({ "rand_like", "randn_like" }) do assert.equal("float32", T[f](x, 1, "float32"):dtype(), f) end
    H.assert_same({ 0, 0, 0, 0, 0, 0 }, T.zeros_like(x):flat())
    H.assert_same({ 7, 7, 7, 7, 7, 7 }, T.full_like(x, 7):flat())
    assert.equal("float32", T.full_like(x, 7, "float32"):dtype())
    assert.truthy(err_of(T.full, { 2 }, "x"):find("full: value must be a number, got string", 1, true))
    assert.truthy(err_of(T.ones_like, { 2 }):find("ones_like: input must be a tensor, got table", 1, true))
    assert.truthy(err_of(T.ones, { -1 }):find("bad shape", 1, true))
  end)

  it("rand: uniform on [0, 1) on the dtype's grid, reproducible by seed and generator", function()
    for _, dt in ipairs(DTYPES) do
      local bits = dt == "float64" and 53 or 24
      local x = T.rand({ 100, 100 }, 5, dt)
      local s, s2 = 0, 0
      for _, v in ipairs(x:flat()) do
        assert(v >= 0 and v < 1, "outside [0, 1)")
        assert(v * 2 ^ bits == math.floor(v * 2 ^ bits), "not on the 2^-" .. bits .. " grid")
        s, s2 = s + v, s2 + v * v
      end
      local mean, var = s / 1e4, s2 / 1e4 - (s / 1e4) ^ 2
      assert(math.abs(mean - 0.5) < 0.015, "mean " .. mean) -- 5 standard errors
      assert(math.abs(var - 1 / 12) < 0.005, "variance " .. var)
      H.assert_same(x:flat(), T.rand({ 100, 100 }, 5, dt):flat(), "same seed")
      local g = T.generator(5)
      H.assert_same(x:flat(), g:rand({ 100, 100 }, dt):flat(), "generator")
      assert.is_false(g:rand({ 4 }, dt):get(1) == x:get(1, 1) and g:rand({ 4 }, dt):get(1) == x:get(1, 2))
    end
    T.manual_seed(11)
    local a = T.rand({ 5 })
    T.manual_seed(11)
    H.assert_same(a:flat(), T.rand({ 5 }):flat(), "default generator")
    H.assert_same(a:flat(), T.rand_like(T.zeros({ 5 }), T.generator(11)):flat(), "rand_like with a generator")
    assert.truthy(err_of(T.rand, { 2 }, 0.5):find("rand: seed must be an integer", 1, true))
  end)

  it("fill_, zero_, copy_ are fill, zero, copy", function()
    local x = T.zeros({ 2, 2 })
    assert.is_true(rawequal(x:fill_(3), x))
    H.assert_same({ 3, 3, 3, 3 }, x:flat())
    x:zero_()
    H.assert_same({ 0, 0, 0, 0 }, x:flat())
    x:copy_(T.from({ { 1, 2 }, { 3, 4 } }):transpose(1, 2))
    H.assert_same({ 1, 3, 2, 4 }, x:flat())
  end)

  it("an unknown member is an error naming the closest one, at the caller's line", function()
    local x = T.zeros({ 2 })
    local ok, err = pcall(function() return x:expp() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("tensor_torch_spec.lua:%d+: tensor has no method or field 'expp' %(did you mean 'exp'%?%)"), tostring(err))
    assert.truthy(err_of(function() return x.dimz end):find("'dimz' (did you mean 'dim'?)", 1, true))
    assert.truthy(err_of(function() return x:argmin() end):find("did you mean 'argmax'", 1, true))
    assert.equal("tensor has no method or field 'qqqqqqqq'", err_of(function() return x.qqqqqqqq end))
  end)
end)

describe("tensor maths (pow, softmax, argmax, gather) through the C API", function()
  local ffi = require("ffi")
  local C = require("muon.core").C
  local function last_error() return ffi.string(C.mu_last_error()) end

  it("mu_tensor_gather takes the index base; mu_tensor_reduce ARGMAX gives 0-based indices", function()
    local x = T.from({ { 1, 9, 3 }, { 8, 5, 6 } }, "float64")
    local out = T.zeros({ 2, 1 }, "float64")
    assert.equal(0, C.mu_tensor_gather(x, 1, T.from({ { 0 }, { 2 } }), 0, out))
    H.assert_same({ 1, 6 }, out:flat())
    assert.equal(0, C.mu_tensor_gather(x, 1, T.from({ { 3 }, { 1 } }), 1, out))
    H.assert_same({ 3, 8 }, out:flat())
    assert.is_true(C.mu_tensor_gather(x, 1, T.from({ { 3 }, { 1 } }), 0, out) < 0)
    assert.equal("gather: index[0, 0] is 3, not an integer in 0..2 (dim 1 of the tensor)", last_error())
    local am = T.zeros({ 2 }, "float64")
    assert.equal(0, C.mu_tensor_reduce(x, C.MU_REDUCE_ARGMAX, 1, am))
    H.assert_same({ 1, 0 }, am:flat())
    local v = ffi.new("double[1]")
    assert.equal(0, C.mu_tensor_reduce_all(x, C.MU_REDUCE_ARGMAX, v))
    assert.equal(1, v[0])
  end)

  it("mu_tensor_softmax works in place, refuses other overlaps, checks shape and dtype", function()
    local x = T.from({ { 1, 2 }, { 3, 5 } }, "float64")
    local want = x:softmax(2):flat()
    assert.equal(0, C.mu_tensor_softmax(x, 1, 0, x))
    H.assert_same(want, x:flat())
    assert.is_true(C.mu_tensor_softmax(x, 1, 0, x:transpose(1, 2)) < 0)
    assert.is_true(C.mu_tensor_softmax(x, 1, 0, T.zeros({ 2, 2 })) < 0)
    assert.equal("softmax: output is float32 but the tensor is float64", last_error())
    assert.is_true(C.mu_tensor_softmax(x, 2, 1, T.zeros({ 2, 2 }, "float64")) < 0)
    assert.equal("log_softmax: dim 2 out of range for 2 dims", last_error())
    assert.is_true(C.mu_tensor_softmax(x, 0, 0, T.zeros({ 4 }, "float64")) < 0)
    assert.equal("softmax: output shape [4] is not the input's [2, 2]", last_error())
  end)

  it("gather refuses an output that overlaps an input", function()
    local x = T.zeros({ 2, 2 }, "float64")
    assert.is_true(C.mu_tensor_gather(x, 0, T.zeros({ 2, 2 }, "float64"), 0, x) < 0)
    assert.equal("gather: the output shares memory with an input", last_error())
  end)
end)

describe("tensor maths (exp .. gather): kernel variants and forged handles", function()
  local ffi = require("ffi")
  after_each(function() ffi.C.setenv("MU_TENSOR_NOSIMD", "", 1) end)

  local function battery(dt)
    local x = T.randn({ 37, 19 }, 1, dt):mul_(3)
    local y = T.randn({ 37, 19 }, 2, dt)
    local xt = T.randn({ 19, 37 }, 3, dt):transpose(1, 2)
    local ax = x:abs()
    local out = {
      x:exp(), ax:log(), x:tanh(), x:sigmoid(), xt:exp(), ax:pow(y), ax:pow(2.5), x:pow(3), x:pow(-2), ax:pow(0.5),
      T.pow(2, x), x:softmax(1), x:softmax(2), xt:log_softmax(2), x:argmax(1), xt:argmax(2),
      T.cat({ x, xt }, 2), T.stack({ x, xt }, 3),
    }
    local gi = T.zeros({ 37, 5 }, dt)
    for i = 1, 37 do for j = 1, 5 do gi:set((i * 7 + j * 3) % 19 + 1, i, j) end end
    out[#out + 1] = x:gather(2, gi)
    local vals = H.values_of(out)
    vals[#vals + 1] = x:argmax()
    return vals
  end

  for _, dt in ipairs(DTYPES) do
    it(dt .. ": AVX2+FMA and portable kernels agree bitwise", function()
      local portable, simd = H.portable_then_simd(function() return battery(dt) end)
      assert.is_true(#simd > 12000, #simd)
      H.assert_same(simd, portable, dt)
    end)
  end

  it("every op fails on a handle whose fields were changed through the FFI, before touching memory", function()
    local good = T.zeros({ 2, 3 })
    local ops = {
      exp = function(t) return t:exp() end, exp_ = function(t) return t:exp_() end,
      pow = function(t) return good:pow(t) end, softmax = function(t) return t:softmax(2) end,
      argmax = function(t) return t:argmax(1) end, argmax_all = function(t) return t:argmax() end,
      gather = function(t) return t:gather(1, T.ones({ 1, 1 })) end,
      gather_index = function(t) return good:gather(1, t) end,
      cat = function(t) return T.cat({ good, t }) end, stack = function(t) return T.stack({ t, good }) end,
    }
    for _, corrupt in ipairs({ function(t) t.dims[0] = 1e9 end, function(t) t.strides[1] = 1000 end,
      function(t) t.offset = 1 end, function(t) t.dims[0], t.strides[0] = 2 ^ 62, 2 ^ 62 end }) do
      for name, f in pairs(ops) do
        local t = T.zeros({ 2, 3 })
        corrupt(t)
        local ok, err = pcall(f, t)
        assert.is_false(ok, name)
        assert.is_true(require("muon.errors").is(err), name)
      end
    end
  end)
end)

describe("tensor maths (exp .. stack) in sandboxed configs", function()
  local engine = require("muon.engine")
  -- One battery, run in a sandboxed config, in a trusted one and here:
  -- every result (as hex floats) must be bitwise the same.
  local BODY = [[
    local T = require('muon').tensor
    local x, y = T.randn({ 4, 6 }, 1), T.randn({ 6 }, 2)
    local idx = T.from({ { 1, 6 }, { 2, 2 }, { 3, 1 }, { 6, 5 } })
    local results = {
      x:exp(), x:abs():log(), x:tanh(), T.sigmoid(x), x:abs():pow(y), x ^ 2, 2 ^ x, T.pow(x:abs(), 0.5),
      x:softmax(2), T.log_softmax(x, 1), x:argmax(2), T.argmax(x, 1, true), x:gather(2, idx), T.gather(x, 2, idx),
      T.cat({ x, x:narrow(1, 1, 2) }, 1), T.stack({ y, y }, 2), T.ones({ 2, 3 }), T.full({ 2 }, 5),
      T.zeros_like(x), T.ones_like(y), T.full_like(y, -1), T.rand({ 3 }, 7), T.rand_like(y, 8), T.randn_like(y, 9),
      x:clone():exp_():log_():tanh_():sigmoid_():pow_(2), x:clone():fill_(2):zero_():copy_(x),
    }
    local parts = {}
    for _, t in ipairs(results) do
      for _, v in ipairs(t:flat()) do parts[#parts + 1] = ('%a'):format(v) end
    end
    parts[#parts + 1] = ('%a'):format(x:argmax())
    parts[#parts + 1] = tostring(T.from({ { 1, 2.5 } }))
    local ok, err = pcall(function() return x:expp() end)
    parts[#parts + 1] = tostring(err):gsub('^.-:%d+: ', '')
  ]]

  local function from_config(trusted)
    local path = H.tmpname(".lua")
    H.write_file(path, BODY .. "\nreturn { groups = { { optimizer = 'adamw' } }, name = table.concat(parts, ',') }")
    local eng = engine.new(path, trusted and { trusted = true } or nil)
    os.remove(path)
    return eng.config.name
  end

  it("ops, constructors, repr and unknown-member errors work on proxies, bitwise as trusted and as here", function()
    local host = assert(loadstring(BODY .. " return table.concat(parts, ',')"))()
    assert.equal(host, from_config(true))
    assert.equal(host, from_config(false))
    assert.truthy(host:find("tensor([[1.0000, 2.5000]], size=[1, 2], dtype=float32)", 1, true), host)
    assert.truthy(host:find("tensor has no method or field 'expp' (did you mean 'exp'?)", 1, true), host)
  end)

  it("names the config's line for an unknown method; a real method not offered is blocked", function()
    local path = H.tmpname(".lua")
    H.write_file(path, "local T = require('muon').tensor\nlocal x = T.zeros({ 2 })\nlocal y = x:softmx(1)\n"
      .. "return { groups = { { optimizer = 'adamw' } } }")
    local ok, err = pcall(engine.new, path)
    assert.is_false(ok)
    assert.truthy(tostring(err):find(path .. ":3: tensor has no method or field 'softmx' (did you mean 'softmax'?)",
      1, true), tostring(err))
    H.write_file(path, "local x = require('muon').tensor.zeros({ 2 })\nlocal p = x.ptr\n"
      .. "return { groups = { { optimizer = 'adamw' } } }")
    ok, err = pcall(engine.new, path)
    os.remove(path)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("tensor:ptr() (raw FFI pointer) is blocked", 1, true), tostring(err))
  end)
end)
