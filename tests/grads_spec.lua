-- The everyday helpers (muon.grads, muon.engine, muon.optim classes, C):
-- zero_grad, clip_grad_norm against torch.nn.utils.clip_grad_norm_'s
-- formulas computed here in float64, set_lr and its precedence.
local H = require("helpers")
local ffi = require("ffi")
local muon = H.muon
local T = muon.tensor
local E = require("muon.errors")
local C = require("muon.core").C

-- torch.nn.utils.clip_grad_norm_(grads, max_norm) (norm_type 2) in float64,
-- on flat tables: total = sqrt(sum g^2); coef = max_norm / (total + 1e-6);
-- grads * coef when coef < 1. Returns total and the clipped grads.
local function torch_clip(flats, max_norm)
  local s = 0
  for _, f in ipairs(flats) do
    for _, x in ipairs(f) do s = s + x * x end
  end
  local total = math.sqrt(s)
  local coef = max_norm / (total + 1e-6)
  local out = {}
  for i, f in ipairs(flats) do
    out[i] = {}
    for j, x in ipairs(f) do out[i][j] = coef < 1 and x * coef or x end
  end
  return total, out
end

local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-300) end

local function fails(code, want, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error: " .. want)
  assert.equal(code, E.code(err))
  assert.truthy(tostring(err):find(want, 1, true), tostring(err))
end

local function two_groups(extra)
  local cfg = { groups = { { name = "hidden", optimizer = "muon", lr = 0.02, match = "%.w$" },
    { name = "rest", optimizer = "adamw", lr = 1e-3 } } }
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return cfg
end

describe("clip_grad_norm", function()
  local function setup()
    local eng = muon.engine.new(two_groups())
    local specs = { { "l1.w", { 16, 12 }, "float32" }, { "l2.w", { 12, 8 }, "float32" }, { "bias", { 12 }, "float64" },
      { "frozen.w", { 4, 4 }, "float32", nograd = true } }
    local grads = {}
    for i, s in ipairs(specs) do
      local g = not s.nograd and T.randn(s[2], 100 + i, s[3]):mul(3) or nil
      eng:add_param(s[1], T.randn(s[2], i, s[3]), g)
      if g then grads[#grads + 1] = g end
    end
    return eng, grads
  end

  it("returns the total norm before clipping and scales by max_norm / (norm + 1e-6), as torch (float64 by hand)", function()
    local eng, grads = setup()
    local flats = {}
    for i, g in ipairs(grads) do flats[i] = g:flat() end
    local want, clipped = torch_clip(flats, 1.0)
    assert.is_true(want > 10) -- (the test clips)
    local norm = eng:clip_grad_norm(1.0)
    -- exact sum of the float32 squares, rounded once: the float64 sum above is within a few ulps
    assert.is_true(rel(norm, want) < 1e-14, ("%.17g vs %.17g"):format(norm, want))
    for i, g in ipairs(grads) do
      local tol = g:dtype() == "float64" and 1e-15 or 2e-7 -- (one float32 multiply by the float32 coef)
      local f = g:flat()
      for j = 1, #f do
        assert.is_true(math.abs(f[j] - clipped[i][j]) <= tol * math.abs(clipped[i][j]) + 1e-30,
          ("grad %d element %d: %.9g vs %.9g"):format(i, j, f[j], clipped[i][j]))
      end
    end
    -- after clipping, the norm is max_norm (to the float rounding)
    local again = eng:clip_grad_norm(1e9)
    assert.is_true(math.abs(again - 1.0) < 1e-6, again)
  end)

  it("leaves the grads bit for bit when max_norm / (norm + 1e-6) >= 1, and when the norm is NaN or Inf", function()
    local eng, grads = setup()
    local before = {}
    for i, g in ipairs(grads) do before[i] = g:clone() end
    eng:clip_grad_norm(1e6)
    for i, g in ipairs(grads) do H.assert_equal_bits(g, before[i], "grad " .. i) end
    for _, bad in ipairs({ 0 / 0, math.huge }) do
      local g1 = grads[1]:clone()
      grads[2]:set(bad, 1, 1)
      local n = eng:clip_grad_norm(1.0)
      if bad ~= bad then assert.is_true(n ~= n) else assert.equal(math.huge, n) end
      H.assert_equal_bits(grads[1], g1, "untouched")
    end
  end)

  it("max_norm is checked: a finite number >= 0; 0 zeroes the grads", function()
    local eng, grads = setup()
    for _, v in ipairs({ -1, 0 / 0, math.huge }) do
      fails(E.EINVAL, "clip_grad_norm: max_norm must be a finite number >= 0, got " .. tostring(v), eng.clip_grad_norm, eng, v)
    end
    fails(E.EINVAL, "clip_grad_norm: max_norm must be a finite number >= 0, got nil", eng.clip_grad_norm, eng)
    eng:clip_grad_norm(0)
    for _, g in ipairs(grads) do assert.equal(0, g:norm()) end
  end)

  it("on the optimizer classes: Muon, AdamW, Lion", function()
    for _, cls in ipairs({ "Muon", "AdamW", "Lion" }) do
      local p = muon.param("w", T.zeros({ 2, 2 }), T.from({ 3, 0, 0, 4 }, { 2, 2 }))
      local opt = muon.optim[cls]({ p })
      assert.equal(5, opt:clip_grad_norm(2.5))
      H.assert_close(p.grad, { 1.5, 0, 0, 2 }, 1e-6, cls)
      fails(E.EINVAL, cls .. ".clip_grad_norm: max_norm must be a finite number >= 0", opt.clip_grad_norm, opt, -2)
      opt:zero_grad()
      assert.same({ 0, 0, 0, 0 }, p.grad:flat())
    end
  end)
end)

describe("zero_grad", function()
  it("sets every registered grad to 0 (NaN too), skips parameters without one, in Lua and C", function()
    local eng = muon.engine.new(two_groups())
    local g = T.randn({ 4, 3 }, 1)
    g:set(0 / 0, 2, 2)
    local gb = T.randn({ 3 }, 2, "float64")
    local frozen = T.randn({ 2, 2 }, 3)
    eng:add_param("a.w", T.randn({ 4, 3 }, 4), g)
    eng:add_param("b", T.randn({ 3 }, 5, "float64"), gb)
    eng:add_param("frozen.w", frozen, nil)
    local fv = frozen:clone()
    eng:zero_grad()
    assert.same({ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, g:flat())
    assert.same({ 0, 0, 0 }, gb:flat())
    H.assert_equal_bits(frozen, fv, "a parameter without grad")
  end)
end)

describe("set_lr", function()
  local function one_step(cfg, lr)
    local eng = muon.engine.new(cfg)
    local w = T.randn({ 6, 4 }, 7)
    eng:add_param("l.w", w, T.randn({ 6, 4 }, 8))
    if lr then eng:set_lr("hidden", lr) end
    eng:step()
    return w, eng
  end

  it("replaces the group's config lr from the next step: the same bits as a config with that lr", function()
    local cfg = two_groups()
    local want = one_step((function() local c = two_groups(); c.groups[1].lr = 0.05 return c end)())
    local got, eng = one_step(cfg, 0.05)
    H.assert_equal_bits(got, want, "set_lr(0.05) vs lr = 0.05")
    assert.equal(0.05, eng:get("lr:hidden"))
    eng:set_lr(2, 0.25) -- by index
    assert.equal(0.25, eng:get("lr:rest"))
    assert.equal(0.25, eng:get("lr:2"))
  end)

  it("precedence: a schedule runs on top (it sees the new base_lr; an lr it returns wins), lr_scale multiplies", function()
    local seen = {}
    local cfg = two_groups({ schedule = function(step, g)
      seen[#seen + 1] = g.base_lr
      if g.name == "rest" then return 0.125 end -- an absolute lr: set_lr does not change it
      return g.base_lr * 0.5
    end })
    local eng = muon.engine.new(cfg)
    eng:add_param("l.w", T.randn({ 6, 4 }, 7), T.randn({ 6, 4 }, 8))
    eng:add_param("b", T.randn({ 4 }, 9), T.randn({ 4 }, 10))
    eng:set_lr("hidden", 0.4)
    eng:set_lr("rest", 0.9)
    eng:set("lr_scale", 0.5)
    eng:step()
    assert.same({ 0.4, 0.9 }, seen)
    assert.equal(0.4 * 0.5 * 0.5, eng:get("lr:hidden"))
    assert.equal(0.125 * 0.5, eng:get("lr:rest"))
  end)

  it("checks the group and the lr; nothing changes on failure", function()
    local eng = muon.engine.new(two_groups())
    fails(E.EINVAL, "set_lr: unknown group 'hiden' (did you mean 'hidden'?); valid groups: hidden, rest", eng.set_lr, eng, "hiden", 1)
    fails(E.EINVAL, "set_lr: unknown group '3'", eng.set_lr, eng, 3, 1)
    for _, v in ipairs({ -1, 0 / 0, math.huge, "0.1" }) do
      fails(E.EINVAL, "set_lr: group 1 ('hidden'): lr must be a finite number >= 0, got " .. E.value(v), eng.set_lr, eng, "hidden", v)
    end
    assert.equal(0.02, eng:get("lr:hidden"))
  end)
end)

describe("C: mu_engine_zero_grad, mu_engine_clip_grad_norm, mu_engine_set_lr", function()
  it("do what the Lua methods do, with status codes", function()
    local path = H.tmpname(".lua")
    H.write_file(path, "return { groups = { { name = 'hidden', optimizer = 'muon', lr = 0.02 } } }")
    local rc, e = H.c_engine_open(path)
    assert.equal(0, rc)
    local shape = ffi.new("int64_t[2]", { 2, 2 })
    local w, g = ffi.new("float[4]", { 1, 2, 3, 4 }), ffi.new("float[4]", { 3, 0, 0, 4 })
    assert.equal(0, C.mu_engine_add_param(e, "w", C.MU_F32, 2, shape, w, g))
    local norm = ffi.new("double[1]")
    assert.equal(0, C.mu_engine_clip_grad_norm(e, 2.5, norm))
    assert.equal(5, norm[0])
    assert.is_true(math.abs(g[0] - 1.5) < 1e-6 and math.abs(g[3] - 2) < 1e-6)
    assert.equal(0, C.mu_engine_clip_grad_norm(e, 100, nil)) -- (norm may be NULL)
    assert.equal(C.MU_EINVAL, C.mu_engine_clip_grad_norm(e, -1, norm))
    assert.truthy(ffi.string(C.mu_engine_error(e)):find("max_norm must be a finite number >= 0, got -1", 1, true))
    assert.equal(0, C.mu_engine_set_lr(e, "hidden", 0.5))
    local v = ffi.new("double[1]")
    assert.equal(0, C.mu_engine_get(e, "lr:hidden", v))
    assert.equal(0.5, v[0])
    assert.equal(0, C.mu_engine_set_lr(e, "1", 0.25))
    assert.equal(C.MU_EINVAL, C.mu_engine_set_lr(e, "nope", 0.1))
    assert.truthy(ffi.string(C.mu_engine_error(e)):find("set_lr: unknown group 'nope'", 1, true))
    assert.equal(C.MU_EINVAL, C.mu_engine_set_lr(e, nil, 0.1))
    assert.equal(C.MU_EINVAL, C.mu_engine_set_lr(e, "hidden", 0 / 0))
    assert.equal(0, C.mu_engine_get(e, "lr:hidden", v))
    assert.equal(0.25, v[0])
    assert.equal(0, C.mu_engine_zero_grad(e))
    assert.same({ 0, 0, 0, 0 }, { g[0], g[1], g[2], g[3] })
    assert.same({ 1, 2, 3, 4 }, { w[0], w[1], w[2], w[3] })
    os.remove(path)
  end)
end)
