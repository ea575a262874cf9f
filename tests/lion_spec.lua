-- Lion (lua/muon/optim/lion.lua), the kind that proves the contract: 10
-- steps against a float64 reference written here from the paper's update
-- (1e-10 in float64; float32 within its rounding, and bit for bit against
-- the same formula rounded as float32 with fused multiply-adds), schedules,
-- an atomic failure under a bad scheduled value, checkpoints that resume
-- bitwise, and the config path (optimizer = "lion", muon check).
local H = require("helpers")
local T = H.T
local E = require("muon.errors")
local muon = H.muon

-- The reference: plain Lua numbers. p, m: lists; g: list; hp: { lr, b1, b2, wd }.
-- c = b1 m + (1 - b1) g; p = p (1 - lr wd) - lr sign(c); m = b2 m + (1 - b2) g.
local function sign(x) return x > 0 and 1 or (x < 0 and -1 or 0) end
local function ref_step(p, m, g, hp)
  for i = 1, #p do
    local c = hp.b1 * m[i] + (1 - hp.b1) * g[i]
    p[i] = p[i] * (1 - hp.lr * hp.wd) - hp.lr * sign(c)
    m[i] = hp.b2 * m[i] + (1 - hp.b2) * g[i]
  end
end
-- The same in float32 arithmetic as the kernels round it: each sum one
-- fused multiply-add over a rounded product (lion-pytorch's
-- m.mul(b1).add(g, alpha = 1 - b1); p.mul_(1 - lr wd).add_(u, alpha = -lr)).
local f32, fmaf = H.f32, H.fmaf
local function ref_step_f32(p, m, g, hp)
  local b1, a1, b2, a2 = f32(hp.b1), f32(1 - hp.b1), f32(hp.b2), f32(1 - hp.b2)
  local decay, alpha = f32(1 - hp.lr * hp.wd), f32(-hp.lr)
  for i = 1, #p do
    local c = fmaf(a1, g[i], f32(m[i] * b1))
    p[i] = fmaf(alpha, sign(c), f32(p[i] * decay))
    m[i] = fmaf(a2, g[i], f32(m[i] * b2))
  end
end

local SHAPES = { { 6, 5 }, { 7 } }
local function grads_at(step, dtype)
  local out = {}
  for i, s in ipairs(SHAPES) do
    local g = T.randn(s, 100 * step + i, dtype)
    g:view({ g:numel() }):set(0, 1) -- an exact zero: with m = 0 at step 1, sign(0) = 0
    out[i] = g
  end
  return out
end
-- The hyperparameters of step n (schedulable: every one changes).
local function hp_at(n)
  return { lr = 0.01 * (1 - 0.05 * n), b1 = 0.9 - 0.01 * n, b2 = 0.99 - 0.002 * n, wd = 0.1 + 0.01 * n }
end

local function run(dtype, steps, f32_ref)
  local params, refs = {}, {}
  for i, s in ipairs(SHAPES) do
    local v = T.randn(s, i, dtype)
    params[i] = muon.param("p" .. i, v, T.zeros(s, dtype))
    refs[i] = { p = v:flat(), m = {} }
    for k = 1, v:numel() do refs[i].m[k] = 0 end
  end
  local opt = muon.optim.Lion(params, {})
  for n = 1, steps do
    local hp = hp_at(n)
    for i, g in ipairs(grads_at(n, dtype)) do
      params[i].grad:copy(g)
      ;(f32_ref and ref_step_f32 or ref_step)(refs[i].p, refs[i].m, g:flat(), hp)
    end
    -- the schedule's values, as the engine hands them to the step
    for _, g in ipairs(opt.param_groups) do g.lr, g.betas, g.weight_decay = hp.lr, { hp.b1, hp.b2 }, hp.wd end
    opt:step()
  end
  return opt, params, refs
end

describe("Lion against a reference written apart", function()
  it("10 steps in float64 within 1e-10 (parameters and moments)", function()
    local opt, params, refs = run("float64", 10)
    for i, p in ipairs(params) do
      H.assert_close(p.value, refs[i].p, 1e-10, p.name)
      H.assert_close(opt.state[p].exp_avg, refs[i].m, 1e-10, p.name .. " exp_avg")
    end
  end)

  it("10 steps in float32: within float32 rounding of the float64 reference, bitwise the float32 formula", function()
    -- run() keeps the reference in Lua numbers (float64) from the float32 inputs
    local opt, params, refs64 = run("float32", 10)
    local _, _, refs32 = run("float32", 10, true)
    for i, p in ipairs(params) do
      -- |p| <= ~3: each of 10 steps rounds p once or twice (2^-24 relative)
      H.assert_close(p.value, refs64[i].p, 10 * 2 * 3 * 2 ^ -24, p.name)
      H.assert_close(opt.state[p].exp_avg, refs64[i].m, 10 * 2 * 3 * 2 ^ -24, p.name .. " exp_avg")
      assert.same(refs32[i].p, p.value:flat())
      assert.same(refs32[i].m, opt.state[p].exp_avg:flat())
    end
  end)

  it("sign(0) = 0: a zero gradient on a zero moment only decays the weight", function()
    local v = T.from({ 1, -2, 3 }, { 3 }, "float64")
    local p = muon.param("w", v, T.from({ 0, 1, -1 }, { 3 }, "float64"))
    local opt = muon.optim.Lion({ p }, { lr = 0.1, weight_decay = 0.5 })
    opt:step()
    assert.same({ 1 * 0.95, -2 * 0.95 - 0.1, 3 * 0.95 + 0.1 }, v:flat())
    assert.same({ 0, 0.01, -0.01 }, (function()
      local m = opt.state[p].exp_avg:flat()
      for i = 1, 3 do m[i] = math.floor(m[i] * 1e12 + 0.5) / 1e12 end
      return m
    end)())
  end)

  it("options: lion-pytorch's defaults, checked with the AdamW messages", function()
    assert.same({ lr = 1e-4, betas = { 0.9, 0.99 }, weight_decay = 0, nonfinite = "error", state_dtype = "float32" },
      muon.optim.Lion.DEFAULTS)
    local p = muon.param("w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 }))
    local ok, err = pcall(muon.optim.Lion, { p }, { betas = { 0.9, 1 } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("betas[2] must be in [0, 1), got 1", 1, true), tostring(err))
    ok, err = pcall(muon.optim.Lion, { p }, { eps = 1e-8 })
    assert.truthy(tostring(err):find("Lion got unexpected keyword arguments: eps; valid options: betas, lr, nonfinite, state_dtype, weight_decay", 1, true),
      tostring(err))
  end)
end)

describe("foreach.lion_update", function()
  it("in place on the moment; checked before anything is written", function()
    local g = T.from({ 1, -2, 0, 4 }, { 4 }, "float64")
    local m = T.from({ -1, 1, 0, 0.5 }, { 4 }, "float64")
    local u = T.zeros({ 4 }, "float64")
    muon.foreach.lion_update({ g }, { m }, { m }, { u }, 0.5, 0.75)
    -- c = 0.5 m + 0.5 g = { 0, -0.5, 0, 2.25 }; m' = 0.75 m + 0.25 g
    assert.same({ 0, -1, 0, 1 }, u:flat())
    assert.same({ -0.5, 0.25, 0, 1.375 }, m:flat())
    local before = m:flat()
    local ok, err = pcall(muon.foreach.lion_update, { g }, { m }, { m }, { g }, 0.5, 0.75)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("updates[0] aliases an input", 1, true), tostring(err))
    ok, err = pcall(muon.foreach.lion_update, { g }, { m }, { m }, { T.zeros({ 3 }, "float64") }, 0.5, 0.75)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("updates[1] has 3 elements but grads[1] has 4", 1, true), tostring(err))
    ok = pcall(muon.foreach.lion_update, { g }, { m }, { m }, { u }, 0 / 0, 0.75)
    assert.is_false(ok)
    assert.same(before, m:flat())
  end)
end)

-- An engine with a Muon and a Lion group; the schedule changes every Lion
-- option per step, and returns a bad betas while bad.on is set.
local function engine_run(bad)
  local eng = muon.engine.new({
    groups = {
      { name = "hidden", optimizer = "muon", match = "^w%.", lr = 0.02 },
      { name = "lion", optimizer = "lion", lr = 3e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 },
    },
    schedule = function(step, g)
      if g.optimizer ~= "lion" then return {} end
      local hp = hp_at(step)
      if bad and bad.on then return { lr = hp.lr, betas = { hp.b1, 1.5 } } end
      return { lr = hp.lr, betas = { hp.b1, hp.b2 }, weight_decay = hp.wd }
    end,
  })
  local ps = {}
  for i, s in ipairs({ { "w.a", { 6, 4 } }, { "l.a", { 5, 3 } }, { "l.b", { 9 } } }) do
    local v = T.randn(s[2], 10 + i)
    ps[i] = { name = s[1], v = v, g = T.zeros(s[2]) }
    eng:add_param(s[1], v, ps[i].g)
  end
  -- one step with the gradients of draw n
  local function step(n)
    for i, p in ipairs(ps) do p.g:copy(T.randn(p.v:size(), 1000 * n + i)) end
    return pcall(eng.step, eng)
  end
  return eng, ps, step
end

local function snapshot(eng, ps)
  local s = { step = eng:get("step") }
  for _, p in ipairs(ps) do
    s[p.name] = p.v:clone()
    local st = eng:state(p.name)
    s[p.name .. "/state"] = st and (st.exp_avg or st.momentum_buffer):clone() or false
  end
  return s
end

local function assert_same_bits(a, b)
  assert.equal(a.step, b.step)
  for k, v in pairs(a) do
    if k ~= "step" then
      if v then H.assert_equal_bits(v, b[k], k) else assert.is_false(b[k], k) end
    end
  end
end

describe("Lion in an engine", function()
  it("is atomic under a bad scheduled value; the next steps run as if it had not been tried", function()
    local bad = { on = false }
    local eng, ps, step = engine_run(bad)
    assert.is_true(step(1))
    assert.is_true(step(2))
    local before = snapshot(eng, ps)
    bad.on = true
    local ok, err = step(3)
    bad.on = false
    assert.is_false(ok)
    assert.equal(E.EINVAL, E.code(err))
    assert.equal("group 2 ('lion'), step 3: betas[2] must be in [0, 1), got 1.5", tostring(err))
    assert_same_bits(before, snapshot(eng, ps))
    for _, n in ipairs({ 4, 5, 6 }) do assert.is_true(step(n)) end
    -- the same run without the failed attempt
    local eng2, ps2, step2 = engine_run(nil)
    for _, n in ipairs({ 1, 2, 4, 5, 6 }) do assert.is_true(step2(n)) end
    assert.equal(5, eng:get("step"))
    assert_same_bits(snapshot(eng2, ps2), snapshot(eng, ps))
  end)

  it("checkpoints: 4 steps, save, a new engine loads, 3 more == 7 steps, bit for bit", function()
    local eng, ps, step = engine_run(nil)
    for n = 1, 7 do assert.is_true(step(n)) end
    local want = snapshot(eng, ps)
    local eng1, ps1, step1 = engine_run(nil)
    for n = 1, 4 do assert.is_true(step1(n)) end
    local path = H.tmpname(".safetensors")
    eng1:save(path)
    local file = require("muon.safetensors").load(path)
    assert.is_not_nil(file.tensors["lion/l.a/exp_avg"])
    assert.is_not_nil(file.tensors["lion/l.b/exp_avg"])
    assert.is_not_nil(file.tensors["muon/w.a/momentum_buffer"])
    local eng2, ps2, step2 = engine_run(nil)
    for i, p in ipairs(ps2) do p.v:copy(ps1[i].v) end -- the model's own values (a checkpoint holds the optimizer's)
    eng2:load(path)
    os.remove(path)
    assert.equal(4, eng2:get("step"))
    for n = 5, 7 do assert.is_true(step2(n)) end
    assert_same_bits(want, snapshot(eng2, ps2))
  end)

  it("muon.optim.Lion saves and loads bitwise; state_dict carries the moments and options", function()
    local function make()
      local p = muon.param("w", T.randn({ 4, 3 }, 1), T.zeros({ 4, 3 }))
      return muon.optim.Lion({ p }, { lr = 1e-2, weight_decay = 0.1 }), p
    end
    local a, pa = make()
    local b, pb = make()
    for n = 1, 3 do
      pa.grad:copy(T.randn({ 4, 3 }, n)); a:step()
      pb.grad:copy(T.randn({ 4, 3 }, n)); b:step()
    end
    local path = H.tmpname(".safetensors")
    a:save(path)
    local c, pc = make()
    pc.value:copy(pa.value)
    c:load(path)
    os.remove(path)
    local d = c:state_dict()
    assert.equal("lion", d.kind)
    assert.same({ 0.9, 0.99 }, d.groups[1].options.betas)
    assert.equal(3, d.groups[1].step)
    for n = 4, 6 do
      pb.grad:copy(T.randn({ 4, 3 }, n)); b:step()
      pc.grad:copy(T.randn({ 4, 3 }, n)); c:step()
    end
    H.assert_equal_bits(pb.value, pc.value, "value")
    H.assert_equal_bits(b.state[pb].exp_avg, c.state[pc].exp_avg, "exp_avg")
  end)

  it("optimizer = 'lion' in a config; muon check shows its options", function()
    local text, problems = H.check_report("return { groups = { { name = 'm', optimizer = 'muon', min_dim = 2 }, "
      .. "{ name = 'l', optimizer = 'lion', betas = { 0.95, 0.98 } } } }\n", "w 4 3\nb 4\n")
    assert.same({}, problems)
    assert.truthy(text:find("\nb +%[4%] +2 %(l%) +lion +lr=0.0001 weight_decay=0 betas=%(0.95,0.98%)\n"), text)
  end)
end)
