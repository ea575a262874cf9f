-- Fused multi-tensor ops (src/foreach.c via lua/muon/foreach.lua) against
-- element-by-element Lua references: bit-exact float32 mirrors where the
-- operation order is defined, double-precision math otherwise.
local ffi = require("ffi")
local H = require("helpers")
local T = H.T
local F = require("muon.foreach")
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
pcall(ffi.cdef, "int unsetenv(const char *name);")

-- float32 rounding and fma mirrors (shared with the tensor maths spec).
local f32, fmaf = H.f32, H.fmaf

local function vals(t)
  return t:flat()
end

-- Max relative difference |a-b| / max(|b|, floor).
local function max_rel(a, b, floor)
  local fa, fb = type(a) == "table" and a or a:flat(), type(b) == "table" and b or b:flat()
  assert(#fa == #fb)
  local m = 0
  for i = 1, #fa do
    local d = math.abs(fa[i] - fb[i]) / math.max(math.abs(fb[i]), floor or 1e-300)
    if d ~= d then return math.huge end
    if d > m then m = d end
  end
  return m
end

local function assert_exact(got, want, what)
  local g = type(got) == "table" and got or got:flat()
  assert(#g == #want, what .. ": element counts differ")
  for i = 1, #want do
    if g[i] ~= want[i] then
      error(("%s: element %d: got %.9g, want %.9g"):format(what, i, g[i], want[i]), 2)
    end
  end
end

local SHAPES = { { 7, 5 }, { 13 }, { 3, 1, 9 }, { 1 }, { 0 }, { 64, 33 } }

local function rand_list(seed, dtype, scale)
  local list = {}
  for i, s in ipairs(SHAPES) do
    local t = T.randn(s, seed * 100 + i, dtype)
    if scale then
      local p = t:ptr()
      for k = 0, t:numel() - 1 do p[k] = p[k] * scale end
    end
    list[i] = t
  end
  return list
end

local clones = H.clones

local function zeros_like(list)
  local out = {}
  for i, t in ipairs(list) do out[i] = T.zeros(t:size(), t:dtype()) end
  return out
end

describe("foreach.momentum", function()
  it("matches a hand-computed step", function()
    local g, b, u = T.from({ 1, -2 }, { 2 }), T.from({ 2, 4 }, { 2 }), T.zeros({ 2 })
    F.momentum({ g }, { b }, nil, { u }, 0.5, 0.25, false)
    assert_exact(u, { 1 + 0.5 * 2, -2 + 0.5 * 4 }, "u")
    assert_exact(b, { 0.25 * 2 + 1, 0.25 * 4 - 2 }, "buf")
    b = T.from({ 2, 4 }, { 2 })
    F.momentum({ g }, { b }, nil, { u }, 0.5, 0.25, true)
    assert_exact(u, { 0.5 * 2 + 1, 0.5 * 0 - 2 }, "nesterov u")
  end)

  for _, nest in ipairs({ false, true }) do
    for _, m in ipairs({ { 0.95, 0.95 }, { 0.9, 0.7 } }) do
      local m1, m2 = m[1], m[2]
      it(("float32 is bit-exact vs the seed's op order (nesterov=%s, m1=%g, m2=%g)")
        :format(tostring(nest), m1, m2), function()
        local grads, bufs = rand_list(1, "float32"), rand_list(2, "float32")
        local old = clones(bufs)
        local new_bufs, ups = zeros_like(grads), zeros_like(grads)
        F.momentum(grads, bufs, new_bufs, ups, m1, m2, nest)
        local m1f, m2f = f32(m1), f32(m2)
        for i = 1, #grads do
          local g, b = vals(grads[i]), vals(old[i])
          local wu, wb = {}, {}
          for k = 1, #g do
            local u = fmaf(m1f, b[k], g[k])           -- _foreach_add(g, buf, alpha=m1)
            wb[k] = f32(f32(b[k] * m2f) + g[k])       -- _foreach_mul_(buf, m2); add_(g)
            if nest then u = f32(f32(u * m1f) + g[k]) end -- mul_(u, m1); add_(g)
            wu[k] = u
          end
          assert_exact(ups[i], wu, "updates[" .. i .. "]")
          assert_exact(new_bufs[i], wb, "new_bufs[" .. i .. "]")
          H.assert_equal_bits(bufs[i], old[i], "bufs untouched")
          -- and close to the exact double-precision math
          local du = {}
          for k = 1, #g do
            du[k] = g[k] + m1 * b[k]
            if nest then du[k] = g[k] + m1 * du[k] end
          end
          assert(H.max_abs_diff(ups[i], du) < 1e-5)
        end
        -- in place (new_bufs nil) gives the same buffers
        F.momentum(grads, old, nil, zeros_like(grads), m1, m2, nest)
        for i = 1, #grads do H.assert_equal_bits(old[i], new_bufs[i], "in-place bufs") end
      end)
    end
  end

  it("float64 matches double math", function()
    local grads, bufs = rand_list(3, "float64"), rand_list(4, "float64")
    local old = clones(bufs)
    local ups = zeros_like(grads)
    F.momentum(grads, bufs, nil, ups, 0.9, 0.8, true)
    for i = 1, #grads do
      local g, b = vals(grads[i]), vals(old[i])
      local wu, wb = {}, {}
      for k = 1, #g do
        wu[k] = 0.9 * (g[k] + 0.9 * b[k]) + g[k]
        wb[k] = 0.8 * b[k] + g[k]
      end
      assert(max_rel(ups[i], wu, 1) < 1e-15, "u")
      assert(max_rel(bufs[i], wb, 1) < 1e-15, "buf")
    end
  end)

  it("rejects mismatched shapes, dtypes and aliasing, touching nothing", function()
    local grads, bufs = rand_list(5, "float32"), rand_list(6, "float32")
    local ups = zeros_like(grads)
    local before = clones(bufs)
    local bad = clones(bufs)
    bad[3] = T.zeros({ 5 })
    local ok, err = pcall(F.momentum, grads, bad, nil, ups, 0.9, 0.9, true)
    assert.is_false(ok)
    assert.matches("bufs%[3%] has 5 elements but grads%[3%] has 27", err)
    bad[3] = T.zeros({ 3, 1, 9 }, "float64")
    ok, err = pcall(F.momentum, grads, bad, nil, ups, 0.9, 0.9, true)
    assert.is_false(ok)
    assert.matches("bufs%[3%] is float64", err)
    -- updates aliasing a gradient (C check)
    local ups2 = zeros_like(grads)
    ups2[6] = grads[6]
    ok, err = pcall(F.momentum, grads, bufs, nil, ups2, 0.9, 0.9, true)
    assert.is_false(ok)
    assert.matches("updates%[5%] aliases", err)
    -- non-contiguous
    local nc = clones(grads)
    nc[6] = T.zeros({ 33, 64 }):transpose(1, 2)
    ok, err = pcall(F.momentum, nc, bufs, nil, ups, 0.9, 0.9, true)
    assert.is_false(ok)
    assert.matches("not contiguous", err)
    local mixed = clones(grads)
    mixed[2] = mixed[2]:clone("float64")
    ok, err = pcall(F.momentum, mixed, bufs, nil, ups, 0.9, 0.9, true)
    assert.is_false(ok)
    assert.matches("grads%[2%] is float64 but grads%[1%] is float32", err)
    ok, err = pcall(F.momentum, grads, bufs, nil, ups, 0.9, 0.9, nil)
    assert.is_false(ok)
    assert.matches("nesterov must be a boolean", err)
    ok, err = pcall(F.momentum, grads, { bufs[1] }, nil, ups, 0.9, 0.9, true)
    assert.is_false(ok)
    assert.matches("bufs has 1 tensors, expected 6", err)
    for i = 1, #bufs do
      H.assert_equal_bits(bufs[i], before[i], "bufs unchanged")
      assert.are.equal(0, ups[i]:norm())
    end
  end)
end)

describe("foreach.apply", function()
  local function ref32(p, u, decay, s, alpha)
    local df, sf, af = f32(decay), f32(s), f32(alpha)
    local out = {}
    for k = 1, #p do
      local t = f32(p[k] * df)           -- p.mul_(decay)
      local us = f32(u[k] * sf)          -- update.mul_(scale)
      out[k] = fmaf(af, us, t)           -- p.add_(update, alpha=alpha)
    end
    return out
  end

  for _, case in ipairs({
    { "per-tensor scales", function(n) local s = {} for i = 1, n do s[i] = 0.5 + i / 7 end return s end },
    { "no scales", function() return nil end },
    { "one scale", function() return 3.7 end },
  }) do
    it("float32 is bit-exact vs mul_/mul_/add_(alpha), " .. case[1], function()
      local params, ups = rand_list(7, "float32"), rand_list(8, "float32")
      local old = clones(params)
      local scales = case[2](#params)
      local lr, wd = 0.02, 0.1
      F.apply(params, ups, scales, 1 - lr * wd, -lr)
      for i = 1, #params do
        local s = type(scales) == "table" and scales[i] or scales or 1
        local want = ref32(vals(old[i]), vals(ups[i]), 1 - lr * wd, s, -lr)
        assert_exact(params[i], want, "params[" .. i .. "]")
        -- double math
        local p, u, d = vals(old[i]), vals(ups[i]), {}
        for k = 1, #p do d[k] = p[k] * (1 - lr * wd) - lr * s * u[k] end
        assert(H.max_abs_diff(params[i], d) < 1e-6)
      end
    end)
  end

  it("float64 matches double math; decay 1 and alpha 1 leave p + s*u", function()
    local params, ups = rand_list(9, "float64"), rand_list(10, "float64")
    local old = clones(params)
    F.apply(params, ups, { 1, 2, 3, 4, 5, 6 }, 0.998, -0.02)
    for i = 1, #params do
      local p, u, d = vals(old[i]), vals(ups[i]), {}
      for k = 1, #p do d[k] = p[k] * 0.998 - 0.02 * i * u[k] end
      assert(max_rel(params[i], d, 1) < 1e-15)
    end
    local p2 = clones(old)
    F.apply(p2, ups, nil, 1, 1)
    for i = 1, #p2 do
      local p, u, d = vals(old[i]), vals(ups[i]), {}
      for k = 1, #p do d[k] = p[k] + u[k] end
      assert_exact(p2[i], d, "p + u")
    end
  end)

  it("rejects a numel mismatch and a bad scales array, touching nothing", function()
    local params, ups = rand_list(11, "float32"), rand_list(12, "float32")
    local old = clones(params)
    local bad = clones(ups)
    bad[2] = T.zeros({ 12 })
    local ok, err = pcall(F.apply, params, bad, nil, 0.9, -1)
    assert.is_false(ok)
    assert.matches("updates%[2%] has 12 elements but params%[2%] has 13", err)
    ok, err = pcall(F.apply, params, ups, { 1, 2 }, 0.9, -1)
    assert.is_false(ok)
    assert.matches("scales has 2 values, expected 6", err)
    ok, err = pcall(F.apply, params, ups, { 1, 2, 3, 4, 5, 0 / 0 }, 0.9, -1)
    assert.is_false(ok)
    assert.matches("scales%[6%] = %-?nan is not finite", err)
    for i = 1, #params do H.assert_equal_bits(params[i], old[i], "params unchanged") end
  end)
end)

describe("foreach.scale", function()
  it("multiplies in the tensor dtype, per tensor or uniformly", function()
    for _, dt in ipairs({ "float32", "float64" }) do
      local xs = rand_list(13, dt)
      local old = clones(xs)
      local sc = { 0.1, 2, -3, 0.3, 1e3, 0.7 }
      F.scale(xs, sc)
      for i = 1, #xs do
        local o, w = vals(old[i]), {}
        for k = 1, #o do w[k] = dt == "float32" and f32(o[k] * f32(sc[i])) or o[k] * sc[i] end
        assert_exact(xs[i], w, dt .. " xs[" .. i .. "]")
      end
      F.scale(xs, 0.5)
      for i = 1, #xs do
        local o, w = vals(old[i]), {}
        for k = 1, #o do w[k] = (dt == "float32" and f32(o[k] * f32(sc[i])) or o[k] * sc[i]) * 0.5 end
        assert_exact(xs[i], w, dt .. " uniform xs[" .. i .. "]")
      end
    end
  end)
end)

-- Double-precision AdamW as torch.optim.AdamW documents it.
local function adamw_ref(p, g, m, v, o)
  local b1, b2 = o.beta1, o.beta2
  local bc1, bc2 = 1 - b1 ^ o.step, 1 - b2 ^ o.step
  for k = 1, #p do
    p[k] = p[k] * (1 - o.lr * o.weight_decay)
    m[k] = b1 * m[k] + (1 - b1) * g[k]
    v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k]
    local mh, vh = m[k] / bc1, v[k] / bc2
    p[k] = p[k] - o.lr * mh / (math.sqrt(vh) + o.eps)
  end
end

-- float32 mirror of the op order in src/foreach.c (torch single-tensor path).
local function adamw_ref32(p, g, m, v, o)
  local bc1, bc2 = 1 - o.beta1 ^ o.step, 1 - o.beta2 ^ o.step
  local decay, w = f32(1 - o.lr * o.weight_decay), f32(1 - o.beta1)
  local wm1 = f32(w - 1)
  local b2, c2 = f32(o.beta2), f32(1 - o.beta2)
  local bc2s, eps, nss = f32(math.sqrt(bc2)), f32(o.eps), f32(-(o.lr / bc1))
  for k = 1, #p do
    local pv = f32(p[k] * decay)
    local diff = f32(g[k] - m[k])
    if 1 - o.beta1 < 0.5 then m[k] = fmaf(w, diff, m[k]) else m[k] = fmaf(wm1, diff, g[k]) end
    v[k] = f32(f32(v[k] * b2) + f32(f32(c2 * g[k]) * g[k]))
    local den = f32(f32(f32(math.sqrt(v[k])) / bc2s) + eps)
    p[k] = f32(pv + f32(f32(nss * m[k]) / den))
  end
end

describe("foreach.adamw", function()
  it("step 1 is bias-corrected: p*(1-lr*wd) - lr*g/(|g|+eps)", function()
    local p, g = T.from({ 1, -2, 0.5 }, { 3 }, "float64"), T.from({ 0.3, -4, 1e-3 }, { 3 }, "float64")
    local m, v = T.zeros({ 3 }, "float64"), T.zeros({ 3 }, "float64")
    F.adamw({ p }, { g }, { m }, { v }, { lr = 0.1, beta1 = 0.9, beta2 = 0.999, eps = 1e-8,
      weight_decay = 0.01, step = 1 })
    local want = {}
    local p0, g0 = { 1, -2, 0.5 }, { 0.3, -4, 1e-3 }
    for k = 1, 3 do want[k] = p0[k] * (1 - 0.1 * 0.01) - 0.1 * g0[k] / (math.abs(g0[k]) + 1e-8) end
    assert(max_rel(p, want, 1) < 1e-14)
    assert(max_rel(m, { 0.1 * 0.3, -0.4, 1e-4 }, 1e-300) < 1e-15)
    assert(max_rel(v, { 0.001 * 0.09, 0.001 * 16, 0.001 * 1e-6 }, 1e-300) < 1e-12)
  end)

  for _, dt in ipairs({ "float64", "float32" }) do
    for _, b1 in ipairs({ 0.9, 0.3 }) do
      it(("%s over 6 steps matches double AdamW (beta1=%g, weight decay)"):format(dt, b1), function()
        local params = rand_list(20, dt)
        local m, v = zeros_like(params), zeros_like(params)
        local rp, rm, rv, r32 = {}, {}, {}, {}
        for i = 1, #params do
          rp[i], rm[i], rv[i] = vals(params[i]), vals(m[i]), vals(v[i])
          r32[i] = { vals(params[i]), vals(m[i]), vals(v[i]) }
        end
        local o = { lr = 0.01, beta1 = b1, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1 }
        for step = 1, 6 do
          local grads = rand_list(100 + step, dt, 0.5)
          o.step = step
          F.adamw(params, grads, m, v, o)
          for i = 1, #params do
            local g = vals(grads[i])
            adamw_ref(rp[i], g, rm[i], rv[i], o)
            if dt == "float32" then adamw_ref32(r32[i][1], g, r32[i][2], r32[i][3], o) end
          end
        end
        -- float64: rounding only (~1e-16 per op). float32: each step's
        -- update has relative error ~ a few 2^-24 of lr (~1e-9 absolute),
        -- p itself carries 2^-24 relative (~2e-7 for |p| <= 3); 1e-6 bounds
        -- both over 6 steps while a wrong formula (e.g. no bias correction,
        -- off by ~lr) fails by 1e-3.
        local tol = dt == "float64" and 1e-13 or 1e-6
        for i = 1, #params do
          assert(H.max_abs_diff(params[i], rp[i]) <= tol, "params " .. i)
          assert(H.max_abs_diff(m[i], rm[i]) <= tol, "exp_avg " .. i)
          assert(H.max_abs_diff(v[i], rv[i]) <= tol, "exp_avg_sq " .. i)
          if dt == "float32" then
            assert_exact(params[i], r32[i][1], "float32 mirror params[" .. i .. "]")
            assert_exact(m[i], r32[i][2], "float32 mirror exp_avg[" .. i .. "]")
            assert_exact(v[i], r32[i][3], "float32 mirror exp_avg_sq[" .. i .. "]")
          end
        end
      end)
    end
  end

  it("validates options and shapes before touching anything", function()
    local params = rand_list(30, "float32")
    local old = clones(params)
    local g, m, v = rand_list(31, "float32"), zeros_like(params), zeros_like(params)
    local ok, err = pcall(F.adamw, params, g, m, v, { lr = 0.1, step = 1, betaa = 0.9 })
    assert.is_false(ok)
    assert.matches("unknown option 'betaa'", err)
    ok, err = pcall(F.adamw, params, g, m, v, { lr = 0.1, step = 0 })
    assert.is_false(ok)
    assert.matches("step must be an integer >= 1", err)
    ok, err = pcall(F.adamw, params, g, m, v, { lr = 0.1, step = 1, beta2 = 1 })
    assert.is_false(ok)
    assert.matches("beta2 = 1 is not in", err)
    local bad = zeros_like(params)
    bad[4] = T.zeros({ 2 })
    ok, err = pcall(F.adamw, params, g, m, bad, { lr = 0.1, step = 1 })
    assert.is_false(ok)
    assert.matches("exp_avg_sqs%[4%] has 2 elements but params%[4%] has 1", err)
    for i = 1, #params do
      H.assert_equal_bits(params[i], old[i], "params unchanged")
      assert.are.equal(0, m[i]:norm())
    end
  end)
end)

describe("foreach.all_finite", function()
  it("finds the first tensor holding NaN or Inf", function()
    for _, dt in ipairs({ "float32", "float64" }) do
      local xs = rand_list(40, dt)
      assert.are.same({ true }, { F.all_finite(xs) })
      xs[6]:set(1 / 0, 64, 33)
      local ok, bad = F.all_finite(xs)
      assert.is_false(ok)
      assert.are.equal(6, bad)
      xs[3]:set(0 / 0, 2, 1, 9)
      ok, bad = F.all_finite(xs)
      assert.are.equal(3, bad)
      xs[1]:set(-1 / 0, 1, 1)
      ok, bad = F.all_finite(xs)
      assert.are.equal(1, bad)
      -- a huge finite value is fine
      local ys = { T.from({ 3.4e38, -3.4e38, 0 }, { 3 }, dt) }
      assert.is_true((F.all_finite(ys)))
    end
  end)

  it("threaded scan over large tensors reports the first bad one", function()
    local xs = { T.zeros({ 100000 }), T.zeros({ 300000 }), T.zeros({ 200000 }) }
    xs[3]:set(0 / 0, 1)
    xs[2]:set(1 / 0, 299999)
    local ok, bad = F.all_finite(xs)
    assert.is_false(ok)
    assert.are.equal(2, bad)
    xs[2]:set(0, 299999)
    ok, bad = F.all_finite(xs)
    assert.are.equal(3, bad)
  end)
end)

describe("foreach.first_nonfinite", function()
  it("gives the lowest index over mixed dtypes (one fused pass per dtype), bfloat16 as stored", function()
    local xs = { T.zeros({ 5 }), T.zeros({ 3 }, "bfloat16"), T.zeros({ 4 }, "float64"), T.zeros({ 2 }, "bfloat16"),
      T.zeros({ 6 }) }
    assert.is_nil(F.first_nonfinite(xs))
    assert.is_nil(F.first_nonfinite({}))
    xs[5]:set(0 / 0, 6)
    assert.equal(5, F.first_nonfinite(xs))
    xs[4]:copy(T.from({ 1, 3.397e38 }, { 2 }):clone("bfloat16")) -- finite in float32, Inf in bfloat16
    assert.equal(4, F.first_nonfinite(xs))
    xs[3]:set(-1 / 0, 2)
    assert.equal(3, F.first_nonfinite(xs))
    xs[1]:set(1 / 0, 1)
    assert.equal(1, F.first_nonfinite(xs))
    assert.equal(1, F.first_nonfinite({ xs[4], xs[4] }))
  end)
end)

describe("foreach.pack / unpack", function()
  it("round-trips at explicit and packed offsets", function()
    for _, dt in ipairs({ "float32", "float64" }) do
      local xs = rand_list(50, dt)
      local n = F.numel(xs)
      local batch = T.zeros({ n + 20 }, dt)
      local offs = {}
      local o = 20
      for i = #xs, 1, -1 do offs[i] = o; o = o + xs[i]:numel() end
      F.pack(xs, batch, offs)
      local flat = batch:flat()
      for i = 1, #xs do
        local xv = vals(xs[i])
        for k = 1, #xv do assert.are.equal(xv[k], flat[offs[i] + k]) end
      end
      for k = 1, 20 do assert.are.equal(0, flat[k]) end
      local back = zeros_like(xs)
      F.unpack(batch, back, offs)
      for i = 1, #xs do H.assert_equal_bits(back[i], xs[i], "roundtrip " .. i) end
      -- nil offsets: back to back
      local b2 = T.zeros({ n }, dt)
      local used, total = F.pack(xs, b2)
      assert.are.equal(n, total)
      assert.are.equal(0, used[1])
      assert.are.equal(35, used[2])
      back = zeros_like(xs)
      F.unpack(b2, back)
      for i = 1, #xs do H.assert_equal_bits(back[i], xs[i], "packed roundtrip " .. i) end
    end
  end)

  it("rejects out-of-range offsets and dtype mismatch, touching nothing", function()
    local xs = rand_list(51, "float32")
    local n = F.numel(xs)
    local batch = T.zeros({ n })
    local offs = {}
    local o = 0
    for i = 1, #xs do offs[i] = o; o = o + xs[i]:numel() end
    offs[6] = offs[6] + 1
    local ok, err = pcall(F.pack, xs, batch, offs)
    assert.is_false(ok)
    assert.matches("exceeds dst", err)
    assert.are.equal(0, batch:norm())
    ok, err = pcall(F.pack, xs, T.zeros({ n }, "float64"))
    assert.is_false(ok)
    assert.matches("dtype", err)
  end)
end)

describe("foreach threading", function()
  -- With MU_FOREACH_MT_MIN=65536 and MU_FOREACH_THREADS=3 (an uneven split),
  -- calls of >= 65536 elements run on 3 threads; chunks of 30000 elements
  -- (narrow views) run on one. Results must be bitwise equal.
  -- (An empty value means unset to the C side.)
  before_each(function()
    ffi.C.setenv("MU_FOREACH_MT_MIN", "65536", 1)
    ffi.C.setenv("MU_FOREACH_THREADS", "3", 1)
  end)
  after_each(function()
    ffi.C.setenv("MU_FOREACH_MT_MIN", "", 1)
    ffi.C.setenv("MU_FOREACH_THREADS", "", 1)
  end)
  local N = 333333
  local function chunks(t)
    local out, s = {}, 1
    while s <= N do
      local len = math.min(30000, N - s + 1)
      out[#out + 1] = t:narrow(1, s, len)
      s = s + len
    end
    return out
  end

  it("momentum, apply, adamw and scale equal the single-threaded result bitwise", function()
    for _, dt in ipairs({ "float32", "float64" }) do
      local g, b = T.randn({ N }, 60, dt), T.randn({ N }, 61, dt)
      local b1, b2 = b:clone(), b:clone()
      local u1, u2 = T.zeros({ N }, dt), T.zeros({ N }, dt)
      F.momentum({ g }, { b1 }, nil, { u1 }, 0.9, 0.8, true)
      F.momentum(chunks(g), chunks(b2), nil, chunks(u2), 0.9, 0.8, true)
      H.assert_equal_bits(u1, u2, dt .. " momentum u")
      H.assert_equal_bits(b1, b2, dt .. " momentum buf")

      local p1, p2 = g:clone(), g:clone()
      F.apply({ p1 }, { u1 }, { 1.7 }, 0.998, -0.02)
      local cs = chunks(p2)
      local sc = {}
      for i = 1, #cs do sc[i] = 1.7 end
      F.apply(cs, chunks(u1), sc, 0.998, -0.02)
      H.assert_equal_bits(p1, p2, dt .. " apply")

      local m1, v1, m2, v2 = T.zeros({ N }, dt), T.zeros({ N }, dt), T.zeros({ N }, dt), T.zeros({ N }, dt)
      for step = 1, 2 do
        local o = { lr = 1e-3, beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.1, step = step }
        F.adamw({ p1 }, { u1 }, { m1 }, { v1 }, o)
        F.adamw(chunks(p2), chunks(u1), chunks(m2), chunks(v2), o)
      end
      H.assert_equal_bits(p1, p2, dt .. " adamw p")
      H.assert_equal_bits(v1, v2, dt .. " adamw v")

      F.scale({ p1 }, 0.3)
      F.scale(chunks(p2), 0.3)
      H.assert_equal_bits(p1, p2, dt .. " scale")
    end
  end)

  it("float32 threaded momentum equals the float32 reference", function()
    local g, b = T.randn({ N }, 70), T.randn({ N }, 71)
    local u = T.zeros({ N })
    local b0 = b:clone()
    local gp, bp = g:ptr(), b0:ptr()
    F.momentum({ g }, { b }, nil, { u }, 0.95, 0.95, false)
    local up = u:ptr()
    local m = f32(0.95)
    for k = 0, N - 1, 7 do
      assert(up[k] == fmaf(m, bp[k], gp[k]), "element " .. k)
    end
  end)
end)

describe("foreach kernel variants", function()
  -- MU_FOREACH_SIMD selects the portable kernels (libm fmaf/fma, used on
  -- CPUs without AVX2+FMA), the AVX2 or the AVX-512 ones (where the CPU has
  -- them; else the widest it has), MU_FOREACH_NOSIMD=1 the portable ones:
  -- all must give the bits of the default choice, on sizes that leave tails.
  after_each(function()
    ffi.C.setenv("MU_FOREACH_NOSIMD", "", 1)
    ffi.C.setenv("MU_FOREACH_SIMD", "", 1)
  end)
  local VARIANTS = { { "SIMD", "" }, { "SIMD", "portable" }, { "SIMD", "avx2" }, { "SIMD", "avx512" }, { "NOSIMD", "1" } }

  it("momentum, apply, adamw, scale and all_finite equal the default kernels bitwise", function()
    for _, dt in ipairs({ "float32", "float64" }) do
      local res = {}
      for pass, var in ipairs(VARIANTS) do
        ffi.C.setenv("MU_FOREACH_" .. var[1], var[2], 1)
        local grads, bufs, params = rand_list(80, dt), rand_list(81, dt), rand_list(82, dt)
        local ups = zeros_like(grads)
        F.momentum(grads, bufs, nil, ups, 0.9, 0.8, true)
        F.apply(params, ups, { 1, 2, 3, 4, 5, 6 }, 0.99, -0.1)
        F.apply_cautious(params, bufs, { 1, 2, 3, 4, 5, 6 }, 0.9, 0.1)
        local m, v = zeros_like(params), zeros_like(params)
        for step = 1, 3 do
          F.adamw(params, grads, m, v, { lr = 0.01, beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1, step = step })
          F.adamw(params, ups, m, v, { lr = 0.01, beta1 = 0.3, beta2 = 0.95, weight_decay = 0.1, step = step })
        end
        F.scale(ups, 0.7)
        grads[4]:set(0 / 0, 1)
        local ok, bad = F.all_finite(grads)
        assert.is_false(ok)
        assert.are.equal(4, bad)
        for _, at in ipairs({ { 1, 1 }, { 2, 5 }, { 64, 33 } }) do -- vector steps and the tail
          local x = grads[6]:clone()
          assert.is_true((F.all_finite({ x })))
          x:set(-1 / 0, at[1], at[2])
          ok, bad = F.all_finite({ grads[1], x })
          assert.are.same({ false, 2 }, { ok, bad })
        end
        local nm, nv, du = zeros_like(params), zeros_like(params), zeros_like(params)
        F.adamw_update(grads, m, v, nm, nv, du, { lr = 0.01, beta1 = 0.8, beta2 = 0.9, step = 2 })
        local lm, lu = clones(bufs), zeros_like(params)
        lm[2]:set(0, 3)
        F.lion_update(grads, lm, lm, lu, 0.9, 0.99)
        res[pass] = { ups, bufs, params, m, v, nm, nv, du, lm, lu }
        ffi.C.setenv("MU_FOREACH_" .. var[1], "", 1)
      end
      for pass = 2, #VARIANTS do
        for k = 1, #res[1] do
          for i = 1, #SHAPES do
            H.assert_equal_bits(res[pass][k][i], res[1][k][i], ("%s %s result %d"):format(dt, VARIANTS[pass][2], k))
          end
        end
      end
    end
  end)
end)

describe("foreach.adamw_update", function()
  -- The moments and the update, then apply with decay 1 - lr*wd and alpha 1,
  -- give exactly the bits of the fused in-place foreach.adamw (which matches
  -- torch, see above), for sizes below and above the threading threshold
  -- and in both dtypes; new moments may be written in place or apart.
  for _, dt in ipairs({ "float32", "float64" }) do
    for _, n in ipairs({ 7, 1000, 2500000 }) do
      it(("%s, %d elements, step 3"):format(dt, n), function()
        local o = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1, step = 3 }
        local p1, g = T.randn({ n }, 1, dt), T.randn({ n }, 2, dt)
        local m1, v1 = T.randn({ n }, 3, dt), T.zeros({ n }, dt)
        -- a second moment >= 0: one AdamW step from zeros gives (1 - beta2) g^2
        F.adamw({ T.zeros({ n }, dt) }, { T.randn({ n }, 4, dt) }, { T.zeros({ n }, dt) }, { v1 }, o)
        local p2, m2, v2 = p1:clone(), m1:clone(), v1:clone()
        F.adamw({ p1 }, { g }, { m1 }, { v1 }, o)
        local nm, nv, u = T.zeros({ n }, dt), T.zeros({ n }, dt), T.zeros({ n }, dt)
        F.adamw_update({ g }, { m2 }, { v2 }, { nm }, { nv }, { u }, o)
        F.apply({ p2 }, { u }, nil, 1 - o.lr * o.weight_decay, 1)
        H.assert_equal_bits(p1, p2, "params")
        H.assert_equal_bits(m1, nm, "exp_avg")
        H.assert_equal_bits(v1, nv, "exp_avg_sq")
        -- in place (new moments over the old ones) gives the same
        local u2 = T.zeros({ n }, dt)
        F.adamw_update({ g }, { m2 }, { v2 }, { m2 }, { v2 }, { u2 }, o)
        H.assert_equal_bits(u, u2, "update in place")
        H.assert_equal_bits(m1, m2, "exp_avg in place")
      end)
    end
  end
  it("rejects an update that aliases an input", function()
    local a, b, c = T.zeros({ 3 }), T.zeros({ 3 }), T.zeros({ 3 })
    local ok, err = pcall(F.adamw_update, { a }, { b }, { c }, { b }, { c }, { a },
      { lr = 1, step = 1 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("updates[0] aliases grads[0]", 1, true), tostring(err))
  end)
end)

describe("foreach.apply_cautious", function()
  -- p = fma(alpha, u s, q), q = p * decay where (alpha u s) * p < 0 (the
  -- subtracted update has p's sign), q = p elsewhere: a float32 mirror per
  -- element, the portable and the AVX2 kernels alike, and the decoupled
  -- apply's bits where the mask is all ones.
  local n = 3001
  local function run(nosimd, dt)
    if nosimd then ffi.C.setenv("MU_FOREACH_NOSIMD", "1", 1) else ffi.C.unsetenv("MU_FOREACH_NOSIMD") end
    local p, u = T.randn({ n }, 1, dt), T.randn({ n }, 2, dt)
    F.apply_cautious({ p }, { u }, { 0.7 }, 1 - 0.05 * 0.3, -0.05)
    ffi.C.unsetenv("MU_FOREACH_NOSIMD")
    return p
  end
  it("matches a float32 mirror, in both kernels", function()
    local p0, u = T.randn({ n }, 1):flat(), T.randn({ n }, 2):flat()
    local decay, alpha, s = H.f32(1 - 0.05 * 0.3), H.f32(-0.05), H.f32(0.7)
    local want = {}
    for i = 1, n do
      local pv = p0[i]
      local us = H.f32(u[i] * s)
      local t = H.f32(pv * decay)
      if H.f32(H.f32(alpha * us) * pv) >= 0 then t = pv end -- (no NaN here)
      want[i] = H.fmaf(alpha, us, t)
    end
    assert.are.same(want, run(true, "float32"):flat())
    assert.are.same(want, run(false, "float32"):flat())
    H.assert_equal_bits(run(true, "float64"), run(false, "float64"), "float64 kernels")
  end)
  it("is the decoupled apply where every update shrinks |p|, and leaves p undecayed where none does", function()
    local p = T.from({ 1, -2, 3, -4 })
    local u = T.from({ 1, -1, 2, -3 }) -- same signs as p: alpha < 0 moves p towards 0
    local a, b = p:clone(), p:clone()
    F.apply_cautious({ a }, { u }, nil, 0.9, -0.1)
    F.apply({ b }, { u }, nil, 0.9, -0.1)
    H.assert_equal_bits(a, b, "all decayed")
    local c = p:clone()
    F.apply_cautious({ c }, { u:mul(-1) }, nil, 0.9, -0.1) -- every update grows |p|: no decay
    assert.are.same({ H.f32(1 + 0.1), H.f32(-2 - 0.1), H.f32(3 + H.f32(0.1 * 2)), H.f32(-4 - H.f32(0.1 * 3)) }, c:flat())
  end)
end)

describe("momentum in two parts (Muon's momentum written in place at the commit)", function()
  local TT = require("muon.tensor")
  local function list(shapes, seed, dt, scale)
    local out = {}
    for i, s in ipairs(shapes) do
      out[i] = TT.randn(s, seed + i):mul(scale or 1)
      if dt then out[i] = out[i]:to(dt) end
    end
    return out
  end
  local PART_SHAPES = { { 37, 5 }, { 3 }, { 64, 33 }, { 0, 4 } }

  for _, case in ipairs({ { "float32" }, { "float64" }, { "float32", "bfloat16" } }) do
    local dt, sdt = case[1], case[2] or case[1]
    it(("%s, %s state: the updates alone, then the buffers alone in place, give momentum's bits"):format(dt, sdt), function()
      for _, nesterov in ipairs({ true, false }) do
        local g = list(PART_SHAPES, 1, dt)
        local b1, b2 = list(PART_SHAPES, 50, sdt), list(PART_SHAPES, 50, sdt)
        local nb, u1, u2 = {}, {}, {}
        for i, s in ipairs(PART_SHAPES) do
          nb[i], u1[i], u2[i] = TT.zeros(s, sdt), TT.zeros(s, dt), TT.zeros(s, dt)
        end
        F.momentum(g, b1, nb, u1, 0.9, 0.95, nesterov)
        assert.is_nil(F.momentum_updates(g, b2, u2, 0.9, 0.95, nesterov))
        for i = 1, #PART_SHAPES do H.assert_equal_bits(u2[i], u1[i], "update " .. i) end
        assert.is_nil(F.momentum_buffers(g, b2, b2, 0.9, 0.95))
        for i = 1, #PART_SHAPES do H.assert_equal_bits(b2[i], nb[i], "buffer " .. i) end
      end
    end)
  end

  it("the updates' call reports the first tensor whose new buffer would overflow, storing nothing of it", function()
    local g, b = list(PART_SHAPES, 1, "float32"), list(PART_SHAPES, 50, "float32")
    g[3]:set(3e38, 2, 2)
    b[3]:set(3e38, 2, 2) -- 0.95 * 3e38 + 3e38 overflows; u = g + 0 * b stays finite with m1 = 0
    local before = b[3]:clone()
    local u = {}
    for i, s in ipairs(PART_SHAPES) do u[i] = TT.zeros(s) end
    assert.are.equal(3, F.momentum_updates(g, b, u, 0, 0.95, false))
    H.assert_equal_bits(b[3], before, "bufs untouched")
    assert.truthy(u[3]:all_finite())
    -- bfloat16 state: a float32 value that rounds past bfloat16's largest (3.3895e38; halfway to 2^128 is 3.3962e38) is caught too
    local gb, bb = { TT.zeros({ 4 }):fill(3.397e38) }, { TT.zeros({ 4 }, "bfloat16") }
    assert.are.equal(1, F.momentum_updates(gb, bb, { TT.zeros({ 4 }) }, 0, 1, false))
  end)
end)

describe("the update passes check what they write", function()
  -- momentum, adamw_update and lion_update write everything and return nil,
  -- or the first tensor where a value they wrote (the update, or with
  -- `against` the value apply would write instead; the state as stored, so
  -- rounded for bfloat16) is NaN or Inf: the same answer as separate
  -- all_finite / apply_finite passes over what they wrote, for each kernel
  -- variant, at vector steps, in tails, and split over threads.
  after_each(function()
    for _, k in ipairs({ "MU_FOREACH_SIMD", "MU_FOREACH_MT_MIN", "MU_FOREACH_THREADS" }) do ffi.C.setenv(k, "", 1) end
  end)
  local MAX = 3.4028234663852886e38
  -- The first index where any list holds a NaN/Inf (the separate checks).
  local function first_bad(...)
    local first
    for _, l in ipairs({ ... }) do
      local bad = F.first_nonfinite(l)
      if bad and (first == nil or bad < first) then first = bad end
    end
    return first
  end
  -- apply_finite's answer as an index (nil: all finite).
  local function apply_bad(p, u, decay, alpha)
    local ok, i = F.apply_finite(p, u, nil, decay, alpha)
    return not ok and i or nil
  end
  -- 64 x 33 tensors: a bad value at a vector step and in the tail.
  local AT = { { 1, 1 }, { 40, 9 }, { 64, 33 } }

  for _, simd in ipairs({ "portable", "avx2", "avx512" }) do
    it("momentum (" .. simd .. "): finite, a NaN/Inf gradient, an overflow in u or in the new buffer only", function()
      ffi.C.setenv("MU_FOREACH_SIMD", simd, 1)
      local function run(g, b, m1, m2, state)
        local gs, bs = { T.randn({ 5 }, 1), T.randn({ 64, 33 }, 2), g }, { T.randn({ 5 }, 3), T.randn({ 64, 33 }, 4), b }
        if state then for i = 1, 3 do bs[i] = bs[i]:clone(state) end end
        local nb, u = zeros_like(bs), zeros_like(gs)
        local _, bad = F.momentum(gs, bs, nb, u, m1, m2, true)
        -- everything written: the bits of a run without the check's report
        local nb2, u2 = zeros_like(bs), zeros_like(gs)
        F.momentum(gs, bs, nb2, u2, m1, m2, true)
        for i = 1, 3 do
          H.assert_equal_bits(nb[i], nb2[i], "new buf " .. i)
          H.assert_equal_bits(u[i], u2[i], "update " .. i)
        end
        assert.are.equal(first_bad(u, nb), bad)
        -- in two parts (the buffers written in place at the step's commit):
        -- the same bits, the same report, the buffers untouched by the first
        local bs2, u3 = {}, zeros_like(gs)
        for i = 1, 3 do bs2[i] = bs[i]:clone() end
        assert.are.equal(bad, F.momentum_updates(gs, bs2, u3, m1, m2, true))
        for i = 1, 3 do H.assert_equal_bits(bs2[i], bs[i], "buf " .. i .. " before the commit's part") end
        assert.are.equal(first_bad(nb), F.momentum_buffers(gs, bs2, bs2, m1, m2))
        for i = 1, 3 do
          H.assert_equal_bits(u3[i], u[i], "update " .. i .. " (parts)")
          H.assert_equal_bits(bs2[i], nb[i], "new buf " .. i .. " (parts, in place)")
        end
        return bad
      end
      assert.is_nil(run(T.randn({ 64, 33 }, 5), T.randn({ 64, 33 }, 6), 0.9, 0.8))
      for _, v in ipairs({ 0 / 0, math.huge, -math.huge }) do
        for _, at in ipairs(AT) do
          local g = T.randn({ 64, 33 }, 7)
          g:set(v, at[1], at[2])
          assert.are.equal(3, run(g, T.randn({ 64, 33 }, 8), 0.9, 0.8))
        end
      end
      for _, at in ipairs(AT) do
        local g, b = T.zeros({ 64, 33 }), T.zeros({ 64, 33 })
        g:set(MAX, at[1], at[2])
        b:set(MAX, at[1], at[2])
        assert.are.equal(3, run(g, b, 0.9, 0.8)) -- u = g + 0.9 b overflows
        assert.are.equal(3, run(g, b, 0, 1))     -- u = g, b' = b + g overflows
        -- a float32 3.397e38 is finite; as bfloat16 it rounds to Inf
        g = T.zeros({ 64, 33 })
        g:set(3.397e38, at[1], at[2])
        assert.is_nil(run(g, T.zeros({ 64, 33 }), 0, 0.5))
        assert.are.equal(3, run(g, T.zeros({ 64, 33 }), 0, 0.5, "bfloat16"))
      end
    end)

    it("adamw_update and lion_update (" .. simd .. "): the update, the state as stored, and the apply they check", function()
      ffi.C.setenv("MU_FOREACH_SIMD", simd, 1)
      local o = { lr = 1e-2, betas = { 0.9, 0.95 }, eps = 1e-8, step = 2 }
      local function lists(state)
        local g, p = { T.randn({ 5 }, 11), T.randn({ 64, 33 }, 12) }, { T.randn({ 5 }, 13), T.randn({ 64, 33 }, 14) }
        local m = { T.randn({ 5 }, 15), T.randn({ 64, 33 }, 16) }
        local v = { T.randn({ 5 }, 17):mul(T.randn({ 5 }, 17)), T.randn({ 64, 33 }, 18):mul(T.randn({ 64, 33 }, 18)) }
        for i = 1, 2 do m[i], v[i] = m[i]:clone(state), v[i]:clone(state) end
        return g, p, m, v
      end
      -- adamw: its report against separate checks of what it wrote
      local function adamw(g, p, m, v, decay, alpha)
        local nm, nv, u = zeros_like(m), zeros_like(v), zeros_like(g)
        local bad = F.adamw_update(g, m, v, nm, nv, u, o, p and { params = p, decay = decay, alpha = alpha })
        local want = first_bad(nm, nv, u)
        local ab = p and apply_bad(p, u, decay, alpha)
        if ab and (want == nil or ab < want) then want = ab end
        assert.are.equal(want, bad)
        return bad
      end
      local function lion(g, p, m, decay, alpha, beta2)
        local nm, u = zeros_like(m), zeros_like(g)
        local bad = F.lion_update(g, m, nm, u, 0.9, beta2 or 0.99, p and { params = p, decay = decay, alpha = alpha })
        local want = first_bad(nm, u)
        local ab = p and apply_bad(p, u, decay, alpha)
        if ab and (want == nil or ab < want) then want = ab end
        assert.are.equal(want, bad)
        return bad
      end
      for _, state in ipairs({ "float32", "bfloat16" }) do
        local g, p, m, v = lists(state)
        assert.is_nil(adamw(g, p, m, v, 0.999, 1))
        assert.is_nil(adamw(g, nil, m, v))
        assert.is_nil(lion(g, p, m, 0.999, -0.01))
        for _, at in ipairs(AT) do
          for _, bad in ipairs({ 0 / 0, math.huge }) do
            g, p, m, v = lists(state)
            g[2]:set(bad, at[1], at[2]) -- a NaN/Inf gradient: Lion's update is a sign, its moment shows it
            assert.are.equal(2, adamw(g, p, m, v, 0.999, 1))
            assert.are.equal(2, lion(g, p, m, 0.999, -0.01))
            assert.are.equal(2, lion(g, nil, m))
            g, p, m, v = lists(state)
            p[2]:set(bad, at[1], at[2]) -- a NaN/Inf parameter: the apply's value
            assert.are.equal(2, adamw(g, p, m, v, 0.999, 1))
            assert.is_nil(adamw(g, nil, m, v))
            assert.are.equal(2, lion(g, p, m, 0.999, -0.01))
          end
          g, p, m, v = lists(state)
          p[2]:set(MAX, at[1], at[2]) -- p * decay + alpha * u overflows
          assert.are.equal(2, adamw(g, p, m, v, 1.5, 1))
          assert.are.equal(2, lion(g, p, m, 1.5, -0.01))
          assert.is_nil(lion(g, p, m, 1, 0))
        end
      end
      -- the moment (beta2 = 0: m' = g) rounds to Inf only as bfloat16
      local g, m = { T.zeros({ 64, 33 }) }, { T.zeros({ 64, 33 }) }
      g[1]:set(3.397e38, 9, 9)
      assert.is_nil(lion(g, nil, m, nil, nil, 0))
      assert.are.equal(1, lion(g, nil, { m[1]:clone("bfloat16") }, nil, nil, 0))
    end)
  end

  it("split over threads: the first bad tensor, every element written", function()
    ffi.C.setenv("MU_FOREACH_MT_MIN", "4096", 1)
    ffi.C.setenv("MU_FOREACH_THREADS", "3", 1)
    local gs, bs = {}, {}
    for i = 1, 6 do gs[i], bs[i] = T.randn({ 3001 }, 30 + i), T.randn({ 3001 }, 40 + i) end
    gs[5]:set(0 / 0, 3001)
    gs[2]:set(math.huge, 1)
    local nb, u = zeros_like(bs), zeros_like(gs)
    local _, bad = F.momentum(gs, bs, nb, u, 0.9, 0.9, false)
    assert.are.equal(2, bad)
    ffi.C.setenv("MU_FOREACH_THREADS", "1", 1)
    local nb1, u1 = zeros_like(bs), zeros_like(gs)
    F.momentum(gs, bs, nb1, u1, 0.9, 0.9, false)
    for i = 1, 6 do
      H.assert_equal_bits(nb[i], nb1[i], "new buf " .. i)
      H.assert_equal_bits(u[i], u1[i], "update " .. i)
    end
  end)

  it("float64 state: a new buffer or moment that overflows (a tail element)", function()
    local g, b = { T.zeros({ 37 }, "float64") }, { T.zeros({ 37 }, "float64") }
    g[1]:set(1.7e308, 36)
    b[1]:set(1.7e308, 36)
    local _, bad = F.momentum(g, b, zeros_like(b), zeros_like(g), 0, 1, false) -- u = g; b' = b + g overflows
    assert.are.equal(1, bad)
    assert.is_nil(select(2, F.momentum(g, b, zeros_like(b), zeros_like(g), 0, 0, false))) -- b' = g
    -- (1 - beta2) g^2 overflows; Lion's m' = g (beta2 = 0) stays finite
    assert.are.equal(1, F.adamw_update(g, b, zeros_like(b), zeros_like(b), zeros_like(b), zeros_like(g),
      { lr = 0.1, beta1 = 0.9, beta2 = 0.5, eps = 1e-8, step = 1 }))
    assert.is_nil(F.lion_update(g, b, zeros_like(b), zeros_like(g), 0.9, 0))
  end)

  it("rejects params that are written, of another size or dtype, touching nothing", function()
    local g, m, v = { T.randn({ 4 }, 1) }, { T.randn({ 4 }, 2) }, { T.zeros({ 4 }) }
    local nm, nv, u = zeros_like(m), zeros_like(v), zeros_like(g)
    local o = { lr = 1e-2, step = 1 }
    local cases = {
      { { params = u, decay = 1, alpha = 1 }, "params[0] overlaps updates[0] (params are read only)" },
      { { params = nm, decay = 1, alpha = 1 }, "params[0] overlaps new_exp_avgs[0]" },
      { { params = { T.zeros({ 5 }) }, decay = 1, alpha = 1 }, "against.params[1] has 5 elements but grads[1] has 4" },
      { { params = { T.zeros({ 4 }, "float64") }, decay = 1, alpha = 1 }, "against.params[1] is float64" },
      { { params = g, decay = math.huge, alpha = 1 }, "decay = inf is not finite" },
      { { params = g, alpha = 1 }, "against.decay must be a number" },
      { { params = g, decay = 1, alpha = 1, scale = 2 }, "unknown key 'scale'" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(F.adamw_update, g, m, v, nm, nv, u, o, c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
      assert.are.equal(0, u[1]:norm())
      assert.are.equal(0, nm[1]:norm())
    end
    local ok, err = pcall(F.lion_update, g, m, nm, u, 0.9, 0.99, { params = nm, decay = 1, alpha = 1 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("params[0] overlaps new_exp_avgs[0]", 1, true), tostring(err))
  end)
end)
