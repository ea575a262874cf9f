-- Muon: golden trajectories of the seed, a double-precision reference for
-- every option, hooks, atomicity, checkpoints and validation errors.
local H = require("helpers")
local R = require("ref_muon")
local muon = H.muon
local T = H.T
local Muon = muon.optim.Muon
local E = require("muon.errors")

local GOLDEN = "tests/fixtures/golden/"

-- Random params (float32) with a double-precision twin for the reference.
local function make(specs, seed)
  local params, refs = {}, {}
  for i, s in ipairs(specs) do
    local v = T.randn(s.shape, seed * 100 + i)
    local g = T.randn(s.shape, seed * 100 + 50 + i)
    params[i] = muon.param(s.name, v, g)
    refs[i] = { value = v:flat(), grad = g:flat(), shape = s.shape }
  end
  return params, refs
end

local function new_grads(params, refs, seed)
  for i, p in ipairs(params) do
    local g = T.randn(p.value:size(), seed * 1000 + i)
    p.grad:copy(g)
    refs[i].grad = g:flat()
  end
end

-- Run `steps` steps of the engine and of the reference with fresh grads.
local function compare(specs, opts, steps, tol)
  local params, refs = make(specs, 1)
  local opt = Muon(params, opts)
  for s = 1, steps do
    if s > 1 then new_grads(params, refs, s) end
    opt:step()
    R.muon_step(refs, opts)
  end
  local worst = 0
  for i, p in ipairs(params) do
    worst = math.max(worst, H.assert_close(p.value, refs[i].value, tol, p.name .. " value"))
    H.assert_close(opt.state[p].momentum_buffer, refs[i].buf, tol, p.name .. " momentum_buffer")
  end
  return worst, opt, params
end

local SHAPES = {
  { name = "wide", shape = { 6, 10 } },
  { name = "tall", shape = { 9, 4 } },
  { name = "conv", shape = { 5, 1, 7 } },
  { name = "stack", shape = { 2, 4, 6 } },
  { name = "four", shape = { 2, 2, 3, 5 } },
}

describe("Muon golden trajectories (seed, float64)", function()
  local cases = dofile(GOLDEN .. "cases.lua")
  for _, c in ipairs(cases.muon) do
    it("matches case " .. c.name, function()
      local params = {}
      for i, mp in ipairs(cases.muon_params) do
        params[i] = muon.param(mp.name, T.load(GOLDEN .. "muon/" .. mp.name .. ".init.npy"), T.zeros(mp.shape))
      end
      local opt = Muon(params, c.options)
      for k = 1, c.steps do
        for _, p in ipairs(params) do p.grad:copy(T.load(GOLDEN .. "muon/" .. p.name .. ".grad" .. k .. ".npy")) end
        opt:step()
      end
      for _, p in ipairs(params) do
        local pre = GOLDEN .. "muon/" .. c.name .. "." .. p.name
        -- measured max error ~8e-7 (float32 vs the seed in float64)
        H.assert_close(p.value, T.load(pre .. ".value.npy"), 5e-6, c.name .. "." .. p.name .. ".value")
        H.assert_close(opt.state[p].momentum_buffer, T.load(pre .. ".momentum_buffer.npy"), 5e-6,
          c.name .. "." .. p.name .. ".momentum_buffer")
      end
      assert.equal(c.steps, opt.param_groups[1].step)
    end)
  end
end)

describe("Muon vs a double-precision reference", function()
  local options = {
    { "defaults", {} },
    { "momentum pair, no nesterov", { momentum = { 0.8, 0.9 }, nesterov = false } },
    { "scalar momentum in a list", { momentum = { 0.9 } } },
    { "legacy variant", { ns_variant = "legacy" } },
    { "asym5 with 3 steps", { ns_steps = 3 } },
    { "custom coefficients", { ns_variant = "custom", ns_steps = 2, ns_coefficients = { { 3, -3.2, 1.2 }, { 2.5, -2, 0.5 } } } },
    { "weight decay and lr", { weight_decay = 0.3, lr = 0.07 } },
    { "zero rms, use_lr", { matched_adamw_rms = 0, zero_rms_scale_mode = "use_lr" } },
    { "apply_lr_in_update", { apply_lr_in_update = true, lr = 0.05 } },
    { "keller scale", { scale_mode = "keller", weight_decay = 0 } },
    { "eps", { ns_epsilon = 1e-3 } },
  }
  for _, c in ipairs(options) do
    it(c[1], function()
      local worst = compare(SHAPES, c[2], 3, 2e-5)
      assert.is_true(worst >= 0)
    end)
  end

  it("float64 parameters follow the reference to double rounding, mixed with float32 in one group", function()
    local p64 = muon.param("d", T.randn({ 5, 7 }, 71, "float64"), T.randn({ 5, 7 }, 72, "float64"))
    local p32 = muon.param("s", T.randn({ 5, 7 }, 71), T.randn({ 5, 7 }, 72))
    local ref = { { value = p64.value:flat(), grad = p64.grad:flat(), shape = { 5, 7 } } }
    local opt = Muon({ p32, p64 }, { lr = 0.05 })
    for _ = 1, 3 do
      opt:step()
      R.muon_step(ref, { lr = 0.05 })
    end
    H.assert_close(p64.value, ref[1].value, 1e-12, "float64 value")
    H.assert_close(p32.value, ref[1].value, 2e-5, "float32 value")
  end)

  it("the plain-gemm path gives the same trajectory", function()
    local a = compare(SHAPES, { ns_path = "plain" }, 2, 2e-5)
    assert.is_true(a >= 0)
  end)

  it("zero rms 'zero' only decays: init * (1 - lr*wd)^10", function()
    local params = make(SHAPES, 3)
    local init = {}
    for i, p in ipairs(params) do init[i] = p.value:clone("float64") end
    local opt = Muon(params, { matched_adamw_rms = 0, zero_rms_scale_mode = "zero", lr = 0.1, weight_decay = 0.5 })
    for _ = 1, 10 do opt:step() end
    local f = (1 - 0.1 * 0.5) ^ 10
    for i, p in ipairs(params) do
      local expect = {}
      for j, x in ipairs(init[i]:flat()) do expect[j] = x * f end
      H.assert_close(p.value, expect, 1e-6, p.name)
    end
  end)

  it("apply_lr_in_update equals the default path", function()
    local pa = make(SHAPES, 4)
    local pb = make(SHAPES, 4)
    local oa = Muon(pa, { lr = 0.03 })
    local ob = Muon(pb, { lr = 0.03, apply_lr_in_update = true })
    for _ = 1, 3 do
      oa:step()
      ob:step()
    end
    for i = 1, #pa do H.assert_close(pa[i].value, pb[i].value, 1e-6, pa[i].name) end
  end)

  it("counts group steps and skips params without grad", function()
    local params = make(SHAPES, 5)
    local frozen = muon.param("frozen", T.randn({ 4, 4 }, 9), nil)
    local before = frozen.value:clone()
    local opt = Muon({ { params = params }, { params = { frozen }, lr = 0.5 } })
    opt:step()
    opt:step()
    assert.equal(2, opt.param_groups[1].step)
    assert.equal(2, opt.param_groups[2].step)
    assert.equal(0.5, opt.param_groups[2].lr)
    H.assert_equal_bits(frozen.value, before, "frozen")
    assert.is_nil(opt.state[frozen])
  end)

  it("per-group overrides are honoured", function()
    local pa, ra = make({ SHAPES[1] }, 6)
    local pb, rb = make({ SHAPES[2] }, 7)
    local opt = Muon({ { params = pa, lr = 0.1, ns_variant = "legacy" }, { params = pb } }, { weight_decay = 0.2 })
    opt:step()
    R.muon_step(ra, { lr = 0.1, ns_variant = "legacy", weight_decay = 0.2 })
    R.muon_step(rb, { weight_decay = 0.2 })
    H.assert_close(pa[1].value, ra[1].value, 2e-5, "group 1")
    H.assert_close(pb[1].value, rb[1].value, 2e-5, "group 2")
  end)
end)

describe("Muon validation", function()
  local p = muon.param("w", T.zeros({ 3, 4 }), T.zeros({ 3, 4 }))
  local cases = {
    -- the seed's text (names sorted), then the valid options
    { { foo = 1, bar = 2 }, "Muon got unexpected keyword arguments: bar, foo; valid options: apply_lr_in_update, " },
    { { momentm = 0.9, zz = 1 }, "Muon got unexpected keyword arguments: momentm, zz (did you mean 'momentum' for 'momentm'?); valid options: apply_lr_in_update, " },
    { { ns_variant = "quintic" }, "ns_variant must be 'legacy', 'asym5', 'polar_express', 'deepseekv4', 'cans', 'polar_express_8', 'aol', 'cubic5', or 'custom', got 'quintic'" },
    { { ns_epsilon = -1 }, "ns_epsilon must be a finite non-negative value, got -1" },
    { { ns_epsilon = math.huge }, "ns_epsilon must be a finite non-negative value, got inf" },
    { { zero_rms_scale_mode = "one" }, "zero_rms_scale_mode must be 'zero' or 'use_lr', got 'one'" },
    { { ns_variant = "custom" }, "ns_coefficients must be provided when ns_variant='custom'" },
    { { ns_coefficients = { { 1, 2, 3 } } }, "ns_coefficients can only be provided when ns_variant='custom'" },
    { { ns_variant = "custom", ns_coefficients = { { 1, 2, 3 } } }, "ns_steps=5 exceeds the 1 provided coefficient groups" },
    { { ns_variant = "custom", ns_steps = 1, ns_coefficients = { { 1, 2 } } }, "ns_coefficients[0] must contain exactly three values" },
    { { ns_variant = "custom", ns_steps = 1, ns_coefficients = { { 1, 0 / 0, 3 } } }, "ns_coefficients[0] must contain only finite values" },
    { { ns_steps = -1 }, "ns_steps must be an integer >= 0" },
    { { lr = -1 }, "lr must be >= 0" },
    { { momentum = "x" }, "momentum must be a number" },
    { { nesterov = 1 }, "nesterov must be a boolean" },
    { { post_update_fn = 3 }, "post_update_fn must be a function" },
  }
  for _, c in ipairs(cases) do
    it("rejects " .. c[2], function()
      local ok, err = pcall(Muon, { p }, c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end)
  end

  it("rejects a 1-D parameter, naming it", function()
    local ok, err = pcall(Muon, { muon.param("layer.bias", T.zeros({ 4 }), T.zeros({ 4 })) })
    assert.is_false(ok)
    assert.truthy(err:find("parameter 'layer.bias' is 1-D", 1, true), err)
  end)

  it("rejects unknown group keys and non-params", function()
    local ok, err = pcall(Muon, { { params = { p }, lrr = 1 } })
    assert.truthy(err:find("param group 1: unknown key 'lrr' (did you mean 'lr'?); valid keys: ", 1, true), err)
    ok, err = pcall(Muon, { { params = { 3 } } })
    assert.truthy(err:find("params[1] is not a muon.param", 1, true), err)
  end)
end)

-- Snapshot of everything a failed step must leave unchanged.
local function snapshot(opt, params)
  local s = { values = {}, bufs = {}, steps = {} }
  for i, p in ipairs(params) do
    s.values[i] = p.value:clone()
    local st = opt.state[p]
    s.bufs[i] = st and st.momentum_buffer:clone() or false
  end
  for gi, g in ipairs(opt.param_groups) do s.steps[gi] = g.step end
  return s
end

local function assert_unchanged(opt, params, s)
  for i, p in ipairs(params) do
    H.assert_equal_bits(p.value, s.values[i], p.name .. " value")
    local st = opt.state[p]
    if s.bufs[i] then
      H.assert_equal_bits(st.momentum_buffer, s.bufs[i], p.name .. " buffer")
    else
      assert.is_nil(st, p.name .. " state")
    end
  end
  for gi, g in ipairs(opt.param_groups) do assert.equal(s.steps[gi], g.step) end
end

describe("Muon hooks", function()
  it("reshape_fn runs NS per head, like separate matrices", function()
    local heads, d, D = 3, 4, 8
    local w = T.randn({ heads * d, D }, 11)
    local g = T.randn({ heads * d, D }, 12)
    local opt = Muon({ muon.param("attn.w", w, g) }, {
      reshape_fn = function(name, x)
        assert.equal("attn.w", name)
        local views = {}
        for h = 1, heads do views[h] = x:narrow(1, (h - 1) * d + 1, d) end
        return views
      end,
    })
    -- the same heads as three parameters
    local sep = {}
    for h = 1, heads do
      sep[h] = muon.param("h" .. h, w:narrow(1, (h - 1) * d + 1, d):clone(), g:narrow(1, (h - 1) * d + 1, d):clone())
    end
    local opt2 = Muon(sep)
    opt:step()
    opt2:step()
    for h = 1, heads do
      H.assert_equal_bits(w:narrow(1, (h - 1) * d + 1, d):contiguous(), sep[h].value, "head " .. h)
    end
  end)

  it("reshape_fn must return views of the working input", function()
    local opt = Muon({ muon.param("w", T.randn({ 4, 4 }, 1), T.randn({ 4, 4 }, 2)) }, {
      reshape_fn = function(_, x) return { x:clone() } end,
    })
    local ok, err = pcall(opt.step, opt)
    assert.is_false(ok)
    assert.truthy(err:find("reshape_fn must return views that share storage", 1, true), err)
  end)

  it("an ns_transform_fn q/k/v split equals three separate parameters exactly", function()
    local d, D = 4, 6
    local w = T.randn({ 3 * d, D }, 21)
    local g = T.randn({ 3 * d, D }, 22)
    local calls = 0
    local opt = Muon({ muon.param("qkv", w, g) }, {
      ns_transform_fn = function(name, x)
        calls = calls + 1
        assert.equal("qkv", name)
        local parts = { x:narrow(1, 1, d):clone(), x:narrow(1, d + 1, d):clone(), x:narrow(1, 2 * d + 1, d):clone() }
        return {
          tensors = parts,
          restore = function(updates, out)
            for i = 1, 3 do out:narrow(1, (i - 1) * d + 1, d):copy(updates[i]) end
          end,
        }
      end,
    })
    local sep = {}
    for i = 1, 3 do
      sep[i] = muon.param("p" .. i, w:narrow(1, (i - 1) * d + 1, d):clone(), g:narrow(1, (i - 1) * d + 1, d):clone())
    end
    local opt2 = Muon(sep)
    for _ = 1, 3 do
      opt:step()
      opt2:step()
    end
    assert.equal(3, calls)
    for i = 1, 3 do H.assert_equal_bits(w:narrow(1, (i - 1) * d + 1, d):contiguous(), sep[i].value, "part " .. i) end
  end)

  it("validates ns_transform_fn results like the seed", function()
    local bad = {
      { function() return 5 end, "ns_transform_fn must return a table" },
      { function() return { tensors = {}, restore = function() end } end, "NSInputTransform.tensors must not be empty" },
      { function(_, x) return { tensors = { x:view({ -1 }) }, restore = function() end } end, "at least two dimensions" },
      { function(_, x) return { tensors = { x:clone("float64") }, restore = function() end } end, "same dtype" },
      { function(_, x) return { tensors = { x }, restore = 7 } end, "restore must be a function" },
    }
    for _, b in ipairs(bad) do
      local opt = Muon({ muon.param("w", T.randn({ 4, 4 }, 1), T.randn({ 4, 4 }, 2)) }, { ns_transform_fn = b[1] })
      local ok, err = pcall(opt.step, opt)
      assert.is_false(ok)
      assert.truthy(tostring(err):find(b[2], 1, true), tostring(err))
    end
  end)

  it("post_update_fn runs once per updated parameter with the context", function()
    local params = make({ SHAPES[1], SHAPES[3] }, 8)
    local frozen = muon.param("frozen", T.zeros({ 3, 3 }), nil)
    local seen = {}
    local opt = Muon({ params[1], params[2], frozen }, {
      lr = 0.01, weight_decay = 0.2,
      post_update_fn = function(p, t, ctx)
        assert.equal(p.value, t)
        seen[#seen + 1] = { ctx.param_fqn, table.concat(ctx.logical_shape, "x"), ctx.lr, ctx.weight_decay, ctx.step }
      end,
    })
    opt:step()
    opt:step()
    assert.same({
      { "wide", "6x10", 0.01, 0.2, 1 }, { "conv", "5x1x7", 0.01, 0.2, 1 },
      { "wide", "6x10", 0.01, 0.2, 2 }, { "conv", "5x1x7", 0.01, 0.2, 2 },
    }, seen)
  end)

  it("zeropower_fn replaces Newton-Schulz", function()
    local p = muon.param("w", T.randn({ 3, 5 }, 1), T.randn({ 3, 5 }, 2))
    local before = p.value:clone("float64")
    local got_steps
    local opt = Muon({ p }, {
      lr = 0.1, weight_decay = 0, ns_steps = 4,
      zeropower_fn = function(x, steps)
        got_steps = steps
        return T.zeros(x:size()):fill(1)
      end,
    })
    opt:step()
    assert.equal(4, got_steps)
    local scale = math.sqrt(5) * 0.2
    local expect = {}
    for i, x in ipairs(before:flat()) do expect[i] = x - 0.1 * scale end
    H.assert_close(p.value, expect, 1e-6, "value")
  end)

  it("momentum_update_fn supplies the NS inputs and must return one per gradient", function()
    local p = muon.param("w", T.randn({ 4, 6 }, 1), T.randn({ 4, 6 }, 2))
    local opt = Muon({ p }, {
      momentum_update_fn = function(grads, bufs, m1, m2, nesterov)
        assert.equal(0.95, m1)
        assert.is_true(nesterov)
        bufs[1]:copy(grads[1])
        return { grads[1] }
      end,
    })
    opt:step()
    H.assert_equal_bits(opt.state[p].momentum_buffer, p.grad, "buffer")
    local opt2 = Muon({ muon.param("w", T.randn({ 4, 6 }, 1), T.randn({ 4, 6 }, 2)) }, {
      momentum_update_fn = function() return {} end,
    })
    local ok, err = pcall(opt2.step, opt2)
    assert.is_false(ok)
    assert.truthy(err:find("momentum_update_fn must return one update tensor per input gradient, got 0 updates for 1 gradients", 1, true), err)
  end)
end)

describe("Muon atomic step", function()
  it("a raising hook on the last parameter leaves everything bit-identical", function()
    local params = make(SHAPES, 9)
    local fail = false
    local opt = Muon(params, {
      reshape_fn = function(name, x)
        if fail and name == "four" then error("hook failed on purpose") end
        return { x }
      end,
    })
    opt:step()
    local snap = snapshot(opt, params)
    fail = true
    local ok, err = pcall(opt.step, opt)
    assert.is_false(ok)
    assert.truthy(err:find("hook failed on purpose", 1, true))
    assert_unchanged(opt, params, snap)
    fail = false
    opt:step() -- and it recovers
    assert.equal(2, opt.param_groups[1].step)
  end)

  it("a NaN gradient fails naming the parameter and changes nothing", function()
    local params = make(SHAPES, 10)
    local opt = Muon(params)
    opt:step()
    local snap = snapshot(opt, params)
    params[3].grad:set(0 / 0, 2, 1, 3)
    local ok, err = pcall(opt.step, opt)
    assert.is_false(ok)
    assert.truthy(err:find("parameter 'conv': gradient holds NaN or Inf", 1, true), err)
    assert_unchanged(opt, params, snap)
  end)

  it("nonfinite = 'skip' skips the group and counts it", function()
    local params = make(SHAPES, 11)
    local opt = Muon(params, { nonfinite = "skip" })
    local snap = snapshot(opt, params)
    params[1].grad:set(math.huge, 1, 1)
    opt:step()
    for i, p in ipairs(params) do H.assert_equal_bits(p.value, snap.values[i], p.name) end
    assert.equal(1, opt.stats.skipped_nonfinite)
  end)

  it("a mismatched grad shape or dtype fails naming the parameter: in the param list, and in a step", function()
    local params = make(SHAPES, 12)
    local good = params[2].grad
    params[2].grad = T.zeros({ 4, 9 })
    local ok, err = pcall(Muon, params)
    assert.is_false(ok)
    assert.equal(E.ESHAPE, E.code(err))
    assert.truthy(err:find("parameter 'tall': grad has shape [4, 9] but the value has shape [9, 4]", 1, true), err)
    params[2].grad = good
    local opt = Muon(params)
    local snap = snapshot(opt, params)
    for _, c in ipairs({ { T.zeros({ 4, 9 }), E.ESHAPE, "grad has shape [4, 9] but the value has shape [9, 4]" },
                         { T.zeros({ 9, 4 }, "float64"), E.EDTYPE, "grad is float64 but the value is float32" } }) do
      params[2].grad = c[1] -- a grad set after the optimizer was made
      ok, err = pcall(opt.step, opt)
      assert.is_false(ok)
      assert.equal(c[2], E.code(err))
      assert.truthy(err:find("parameter 'tall': " .. c[3], 1, true), err)
      assert_unchanged(opt, params, snap)
    end
  end)
end)

describe("Muon checkpoints", function()
  it("resuming from a checkpoint continues bit-identically", function()
    local pa = make(SHAPES, 13)
    local oa = Muon(pa)
    local grads = {}
    for s = 1, 6 do
      grads[s] = {}
      for i, p in ipairs(pa) do grads[s][i] = T.randn(p.value:size(), 500 + s * 10 + i) end
    end
    for s = 1, 3 do
      for i, p in ipairs(pa) do p.grad:copy(grads[s][i]) end
      oa:step()
    end
    local path = H.tmpname(".safetensors")
    oa:save(path)
    local pb = {}
    for i, p in ipairs(pa) do pb[i] = muon.param(p.name, p.value:clone(), T.zeros(p.value:size())) end
    local ob = Muon(pb)
    ob:load(path)
    os.remove(path)
    assert.equal(3, ob.param_groups[1].step)
    for s = 4, 6 do
      for i = 1, #pa do
        pa[i].grad:copy(grads[s][i])
        pb[i].grad:copy(grads[s][i])
      end
      oa:step()
      ob:step()
    end
    for i = 1, #pa do
      H.assert_equal_bits(pa[i].value, pb[i].value, pa[i].name)
      H.assert_equal_bits(oa.state[pa[i]].momentum_buffer, ob.state[pb[i]].momentum_buffer, pa[i].name)
    end
  end)

  it("a mismatching checkpoint fails listing every mismatch and changes nothing", function()
    local pa = make(SHAPES, 14)
    local oa = Muon(pa)
    oa:step()
    local path = H.tmpname(".safetensors")
    oa:save(path)
    local pb = {
      muon.param("wide", T.zeros({ 6, 10 }), T.zeros({ 6, 10 })),
      muon.param("tall", T.zeros({ 4, 9 }), T.zeros({ 4, 9 })),
      muon.param("extra", T.zeros({ 2, 2 }), T.zeros({ 2, 2 })),
    }
    local ob = Muon(pb)
    ob:step()
    local snap = snapshot(ob, pb)
    local ok, err = pcall(ob.load, ob, path)
    os.remove(path)
    assert.is_false(ok)
    assert.truthy(err:find("parameter 'tall': shape (9, 4) in the checkpoint, (4, 9) here", 1, true), err)
    assert.truthy(err:find("parameter 'extra' is missing from the checkpoint", 1, true), err)
    assert.truthy(err:find("parameter 'conv' is in the checkpoint but not in this optimizer", 1, true), err)
    assert_unchanged(ob, pb, snap)
  end)

  it("state_dict round-trips through load_state_dict", function()
    local pa = make(SHAPES, 15)
    local oa = Muon(pa)
    oa:step()
    local d = oa:state_dict()
    assert.equal(1, d.groups[1].step)
    local pb = {}
    for i, p in ipairs(pa) do pb[i] = muon.param(p.name, p.value:clone(), p.grad:clone()) end
    local ob = Muon(pb)
    ob:load_state_dict(d)
    oa:step()
    ob:step()
    for i = 1, #pa do H.assert_equal_bits(pa[i].value, pb[i].value, pa[i].name) end
  end)
end)
