-- The step protocol (lua/muon/step.lua) on one process: every per-step
-- value is checked before anything changes, a failed step changes nothing
-- and later steps continue as if it had not happened (post_update_fn
-- failures too: it runs before the commit), parameters can stop having a grad, the
-- status code of each failure, replica-free memory accounting, and
-- checkpoints whose values were tampered with (checksums recomputed).
package.path = "tests/fuzz/?.lua;" .. package.path
local H = require("helpers")
local T = H.T
local D = require("driver")
local E = require("muon.errors")
local engine = require("muon.engine")
local st = require("muon.safetensors")
local S = require("muon.checkpoint")
local cjson = require("cjson")

-- An engine with a Muon and an AdamW group whose schedule can be told to
-- return a bad value (or raise) at a given engine step.
local function build(inject)
  local cfg = {
    groups = {
      { name = "hidden", optimizer = "muon", match = "^w", lr = 0.02, weight_decay = 0.1 },
      { name = "rest", optimizer = "adamw", lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.01 },
    },
    schedule = function(step, g)
      local v = { lr = g.base_lr * (1 - 0.01 * step) }
      if inject and inject.step == step and inject.group == g.index then
        if inject.raise then error("schedule exploded", 0) end
        v[inject.key] = inject.value
      end
      return v
    end,
    hooks = { post_update_fn = function(p)
      if inject and inject.post and inject.post.step == inject.now and p.name == inject.post.name then
        error("post hook failed", 0)
      end
    end },
  }
  local eng = engine.new(cfg)
  local ps = {}
  for i, spec in ipairs({ { "w1", { 6, 4 } }, { "w2", { 3, 1, 5 } }, { "w3", { 6, 4 } }, { "b", { 7 } } }) do
    ps[spec[1]] = { w = T.randn(spec[2], i), g = T.zeros(spec[2]) }
    eng:add_param(spec[1], ps[spec[1]].w, ps[spec[1]].g)
  end
  local function grads(step)
    for i, name in ipairs({ "w1", "w2", "w3", "b" }) do ps[name].g:copy(T.randn(ps[name].g:size(), 100 * step + i)) end
  end
  return eng, ps, grads
end

describe("step: per-step values are checked before anything changes", function()
  local cases = {
    { { key = "weight_decay", value = 0 / 0, group = 1 }, "group 1 ('hidden'), step 3: weight_decay must be a finite number, got nan" },
    { { key = "betas", value = { 0.9, 1.5 }, group = 2 }, "group 2 ('rest'), step 3: betas[2] must be in [0, 1), got 1.5" },
    { { key = "eps", value = -1, group = 2 }, "group 2 ('rest'), step 3: eps must be >= 0, got -1" },
    { { key = "lr", value = math.huge, group = 1 }, "group 1 ('hidden'), step 3: lr must be a finite number, got inf" },
    { { key = "momentum", value = { 0.9, -0.5 }, group = 1 }, "group 1 ('hidden'), step 3: momentum[2] must be >= 0, got -0.5" },
    { { key = "matched_adamw_rms", value = "x", group = 1 }, "group 1 ('hidden'), step 3: matched_adamw_rms must be a finite number, got the string \"x\"" },
  }
  for _, c in ipairs(cases) do
    it("rejects " .. c[2]:match(": (.*)$") .. " (EINVAL), then steps as if it had not happened", function()
      local inject = c[1]
      inject.step = 3
      local eng, _, grads = build(inject)
      local ref, _, rgrads = build(nil)
      for step = 1, 2 do
        grads(step); rgrads(step)
        eng:step(); ref:step()
      end
      grads(3)
      local before = D.snapshot(eng)
      local ok, err = pcall(eng.step, eng)
      assert.is_false(ok)
      assert.are.equal(E.EINVAL, E.code(err))
      assert.are.equal(c[2], tostring(err))
      assert.are.equal(before, D.snapshot(eng))
      assert.are.equal(2, eng:get("step"))
      -- the failure fires only once (the schedule is asked again for step 3)
      inject.step = nil
      for step = 3, 5 do
        grads(step); rgrads(step)
        eng:step(); ref:step()
      end
      assert.are.equal(D.snapshot(ref), D.snapshot(eng))
    end)
  end

  it("a schedule that raises fails with ELUA naming it, and changes nothing", function()
    local eng, _, grads = build({ step = 1, group = 2, raise = true })
    grads(1)
    local before = D.snapshot(eng)
    local ok, err = pcall(eng.step, eng)
    assert.is_false(ok)
    assert.are.equal(E.ELUA, E.code(err))
    assert.are.equal("schedule: schedule exploded", tostring(err))
    assert.are.equal(before, D.snapshot(eng))
  end)

  it("a value changed on a group table between steps is checked too", function()
    local b = H.muon.param("b", T.randn({ 5 }, 1), T.randn({ 5 }, 2))
    local opt = H.muon.optim.AdamW({ b })
    opt.param_groups[1].weight_decay = -1
    local before = b.value:flat()
    local ok, err = pcall(opt.step, opt)
    assert.is_false(ok)
    assert.are.equal("param group 1, step 1: weight_decay must be >= 0, got -1", tostring(err))
    assert.are.same(before, b.value:flat())
    assert.is_nil(opt.state[b])
  end)
end)

describe("step: post_update_fn failures, nil grads, closures, codes", function()
  it("a raising post_update_fn fails with ELUA before the commit: nothing changed", function()
    local inject = { post = { step = 2, name = "w2" } }
    local eng, _, grads = build(inject)
    local ref, _, rgrads = build(nil)
    for step = 1, 4 do
      inject.now = step
      grads(step); rgrads(step)
      local before = D.snapshot(eng)
      local ok, err = pcall(eng.step, eng)
      if step == 2 then
        assert.is_false(ok)
        assert.are.equal(E.ELUA, E.code(err))
        assert.are.equal("post_update_fn: post hook failed", tostring(err))
        assert.are.equal(before, D.snapshot(eng))
        assert.are.equal(1, eng:get("step"))
        inject.now = nil
        assert.is_true(pcall(eng.step, eng)) -- (the same step again, now passing)
      else
        assert.is_true(ok, tostring(err))
      end
      ref:step()
      assert.are.equal(ref:get("step"), eng:get("step"))
    end
    assert.are.equal(D.snapshot(ref), D.snapshot(eng))
  end)

  it("a parameter whose grad becomes nil stops stepping (its state and AdamW count stay)", function()
    local eng, ps, grads = build(nil)
    grads(1)
    eng:step()
    local mb = eng:state("w1").momentum_buffer:clone()
    local w1 = ps.w1.w:clone()
    eng:param("w1").grad = nil
    eng:param("b").grad = nil
    grads(2)
    eng:step()
    H.assert_equal_bits(w1, ps.w1.w, "w1 unchanged")
    H.assert_equal_bits(mb, eng:state("w1").momentum_buffer, "w1 momentum unchanged")
    assert.are.equal(1, eng:state("b").step)
    eng:param("b").grad = ps.b.g
    eng:step()
    assert.are.equal(2, eng:state("b").step)
  end)

  it("a NaN gradient is ENONFINITE; a grad of the wrong shape ESHAPE; a 1-D Muon param EINVAL", function()
    local eng, ps, grads = build(nil)
    grads(1)
    ps.w3.g:set(0 / 0, 2, 2)
    local ok, err = pcall(eng.step, eng)
    assert.is_false(ok)
    assert.are.equal(E.ENONFINITE, E.code(err))
    local p = H.muon.param("w", T.randn({ 3, 4 }, 1), T.randn({ 3, 4 }, 2))
    local opt = H.muon.optim.Muon({ p })
    p.grad = T.randn({ 4, 3 }, 3)
    ok, err = pcall(opt.step, opt)
    assert.are.equal(E.ESHAPE, E.code(err))
    p.grad = T.randn({ 3, 4 }, 3)
    p.value = T.randn({ 12 }, 1)
    p.logical_shape = { 12 }
    p.grad = T.randn({ 12 }, 3)
    ok, err = pcall(opt.step, opt)
    assert.are.equal(E.EINVAL, E.code(err))
  end)

  it("step(closure) calls the closure first and returns its value", function()
    local p = H.muon.param("w", T.randn({ 3, 4 }, 1), T.zeros({ 3, 4 }))
    local opt = H.muon.optim.Muon({ p })
    local loss = opt:step(function() p.grad:copy(T.randn({ 3, 4 }, 5)) return 1.25 end)
    assert.are.equal(1.25, loss)
    assert.is_not_nil(opt.state[p])
  end)
end)

describe("memory", function()
  it("state and scratch bytes: Muon one buffer, AdamW two per element", function()
    local eng, _, grads = build(nil)
    grads(1)
    eng:step()
    local m = eng:memory()
    local muon_elems = 6 * 4 + 3 * 5 + 6 * 4
    assert.are.equal(4 * (muon_elems + 2 * 7), m.state_bytes)
    assert.are.equal(m.state_bytes, eng:get("state_bytes"))
    assert.is_true(m.scratch_bytes > 0)
    assert.are.equal(m.scratch_bytes, eng:get("scratch_bytes"))
  end)
end)

describe("checkpoints with tampered values (checksums recomputed)", function()
  local good
  setup(function()
    local eng, _, grads = build(nil)
    for step = 1, 2 do grads(step); eng:step() end
    good = H.tmpname(".safetensors")
    eng:save(good)
  end)
  teardown(function() os.remove(good) end)

  -- Rewrite the good file with edit(meta, header) applied, both checksums recomputed.
  local function tampered(edit)
    local f = st.load(good)
    local meta = {}
    for k, v in pairs(f.metadata) do
      if k ~= "muon.checksum" and k ~= "muon.format" then meta[k] = v end
    end
    local header = cjson.decode(meta["muon.state"])
    local tensors = f.tensors
    edit(meta, header, tensors)
    meta["muon.state"] = cjson.encode(header)
    meta["muon.state_checksum"] = S.meta_checksum(meta)
    local entries = {}
    for _, name in ipairs(f.order) do
      if tensors[name] then entries[#entries + 1] = { name = name, tensor = tensors[name] } end
    end
    local path = H.tmpname(".safetensors")
    st.save(path, entries, meta)
    return path
  end
  local function adam(header)
    for _, h in ipairs(header) do if h.kind == "adamw" then return h end end
  end
  local cases = {
    { "lr_scale = -50", function(meta) meta["muon.engine.lr_scale"] = "-50" end,
      "muon.engine.lr_scale = -50 is not a finite number >= 0" },
    { "engine step = nan", function(meta) meta["muon.engine.step"] = "nan" end,
      "muon.engine.step = nan is not an integer >= 0" },
    { "engine step = 2.5", function(meta) meta["muon.engine.step"] = "2.5" end,
      "muon.engine.step = 2.5 is not an integer >= 0" },
    { "AdamW step = -7", function(_, header) adam(header).scalars.b.step = -7 end,
      "scalars['b'].step = -7 is not an integer in 1..2" },
    { "AdamW step beyond the group's", function(_, header) adam(header).scalars.b.step = 9 end,
      "scalars['b'].step = 9 is not an integer in 1..2" },
    { "an unknown scalar", function(_, header) adam(header).scalars.b.lr = 1 end,
      "scalars['b'].lr is not a adamw state value" },
    { "group step = 1.5", function(_, header) header[1].groups[1].step = 1.5 end,
      "groups[1].step = 1.5 is not an integer >= 0" },
    { "param dtype float16", function(_, header) header[1].params[1].dtype = "float16" end,
      "params[1].dtype = \"float16\" is not float32 or float64" },
    { "group index 0", function(_, header) header[1].params[1].group = 0 end,
      "params[1].group = 0 is not a group index 1..1" },
    { "NaN in a state tensor", function(_, _, tensors) tensors["adamw/b/exp_avg"]:set(0 / 0, 3) end,
      "state tensor 'adamw/b/exp_avg' holds NaN or Inf" },
    { "a state tensor missing", function(_, header, tensors)
        tensors["adamw/b/exp_avg_sq"] = nil
        local _ = header
      end, "state of 'b' has no 'exp_avg_sq' tensor" },
  }
  for _, c in ipairs(cases) do
    it("rejects " .. c[1] .. " naming it (EFORMAT) and changes nothing", function()
      local path = tampered(c[2])
      local eng, _, grads = build(nil)
      grads(1)
      eng:step()
      local before = D.snapshot(eng)
      local ok, err = pcall(eng.load, eng, path)
      os.remove(path)
      assert.is_false(ok)
      assert.are.equal(E.EFORMAT, E.code(err))
      assert.truthy(tostring(err):find(c[3], 1, true), tostring(err))
      assert.are.equal(before, D.snapshot(eng))
    end)
  end
  it("the untouched file loads (the cases differ from it only by the edit)", function()
    local path = tampered(function() end)
    local eng = build(nil)
    eng:load(path)
    os.remove(path)
    assert.are.equal(2, eng:get("step"))
  end)
end)
