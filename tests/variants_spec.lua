-- The Muon variants shipped as configs and options, each over a 10-step
-- trajectory against an independent double-precision reference
-- (tests/ref_variants.lua): NorMuon (configs/normuon.lua, post_ortho_fn +
-- hook state), cautious weight decay, spectral scaling, conv flattening and
-- MuonClip's QK-clip (configs/muonclip.lua, post_update_fn + signals).
-- Tolerances: float64 parameters follow the reference to 1e-10 (rounding
-- order only); float32 ones to 3e-5 (float32 rounding through Newton-Schulz
-- and 10 steps; weights are O(1)).
local H = require("helpers")
local T = H.T
local R = require("ref_muon")
local V = require("ref_variants")
local engine = require("muon.engine")
local E = require("muon.errors")

local TOL = { float32 = 3e-5, float64 = 1e-10 }

-- The warmup of configs/normuon.lua and configs/muonclip.lua over the first
-- steps: schedules.warmup_cosine(20, 1000, 0.1) gives base * step / 20.
local function warm(base, step) return base * step / 20 end

-- Run an engine and the reference side by side for 10 steps (H.trajectory).
-- specs: { name, shape, [adamw = true] }; ref_step(step, refs) does the
-- reference's step on { name -> { value, grad, shape, adamw } }.
local function trajectory(eng, specs, dtype, ref_step, before_step)
  return H.trajectory(eng, specs, dtype, TOL[dtype], ref_step, before_step)
end

-- A plain config: one Muon group with the given options, AdamW for 1-D.
local function config(opts)
  local g = { name = "hidden", optimizer = "muon", min_dim = 2, lr = 0.05, weight_decay = 0.1 }
  for k, v in pairs(opts) do g[k] = v end
  return { groups = { g, { name = "rest", optimizer = "adamw", lr = 1e-2, betas = { 0.9, 0.95 }, eps = 1e-8,
    weight_decay = 0 } } }
end

local function muon_only(specs, o)
  return function(_, refs)
    local list = {}
    for _, s in ipairs(specs) do list[#list + 1] = refs[s[1]] end
    V.muon_step(list, o)
  end
end

for _, dtype in ipairs({ "float32", "float64" }) do
  describe("variants (" .. dtype .. ") against a double-precision reference, 10 steps:", function()
    it("NorMuon, the shipped configs/normuon.lua", function()
      local specs = { { "layers.0.attn.w", { 8, 6 } }, { "layers.0.mlp.w", { 5, 9 } }, { "layers.1.w", { 9, 5 } },
        { "experts", { 3, 6, 4 } }, { "embed.weight", { 7, 3 }, adamw = true } }
      local eng = engine.new("configs/normuon.lua")
      trajectory(eng, specs, dtype, function(step, refs)
        local list = {}
        for _, s in ipairs(specs) do if not s.adamw then list[#list + 1] = refs[s[1]] end end
        V.muon_step(list, { lr = warm(0.02, step), weight_decay = 0.1, normuon = { beta2 = 0.95, eps = 1e-10 } })
        R.adamw_step(refs["embed.weight"], { lr = warm(3e-3, step), betas = { 0.9, 0.95 }, eps = 1e-8,
          weight_decay = 0 }, step)
      end)
      -- the hook state: one value per row of each core matrix
      assert.are.same({ 3, 6, 1 }, eng:state("experts")["hook.v"]:size())
      assert.are.same({ 9, 1 }, eng:state("layers.1.w")["hook.v"]:size())
    end)

    it("cautious weight decay", function()
      local specs = { { "a", { 8, 6 } }, { "b", { 3, 7, 5 } } }
      local eng = engine.new(config({ weight_decay_mode = "cautious", weight_decay = 0.5 }))
      trajectory(eng, specs, dtype, muon_only(specs, { lr = 0.05, weight_decay = 0.5, weight_decay_mode = "cautious" }))
    end)

    it("spectral scaling sqrt(rows / cols)", function()
      local specs = { { "wide", { 4, 9 } }, { "tall", { 9, 4 } }, { "stack", { 2, 6, 3 } } }
      local eng = engine.new(config({ scale_mode = "spectral" }))
      trajectory(eng, specs, dtype, muon_only(specs, { lr = 0.05, weight_decay = 0.1, scale_mode = "spectral" }))
    end)

    it("conv flattening (nd_mode = 'flatten'): out x (in * kh * kw)", function()
      local specs = { { "conv", { 4, 3, 2, 2 } }, { "conv1", { 6, 1, 5 } }, { "fc", { 5, 4 } } }
      local eng = engine.new(config({ nd_mode = "flatten" }))
      trajectory(eng, specs, dtype, muon_only(specs, { lr = 0.05, weight_decay = 0.1, nd_mode = "flatten" }))
    end)

    it("MuonClip, the shipped configs/muonclip.lua, with per-head max logits as signals", function()
      local specs = { { "layers.0.attn.wq", { 8, 6 } }, { "layers.0.attn.wk", { 8, 6 } }, { "layers.0.mlp.w", { 6, 8 } },
        { "layers.1.attn.wq", { 8, 6 } }, { "layers.1.attn.wk", { 8, 6 } } }
      local eng = engine.new("configs/muonclip.lua")
      local logits = {}
      trajectory(eng, specs, dtype, function(step, refs)
        local list = {}
        for _, s in ipairs(specs) do list[#list + 1] = refs[s[1]] end
        V.muon_step(list, { lr = warm(0.02, step), weight_decay = 0.1 })
        for l = 0, 1 do
          V.qk_clip(refs[("layers.%d.attn.wq"):format(l)], 4, logits[l], 100)
          V.qk_clip(refs[("layers.%d.attn.wk"):format(l)], 4, logits[l], 100)
        end
      end, function(step)
        -- heads over and under tau = 100, changing per step; layer 1 never clips
        logits[0] = { 50 + 10 * step, 150, 99.5, 400 / step }
        logits[1] = { 1, 2, 3, 4 }
        eng:set_signal("max_logit.0", logits[0])
        eng:set_signal("max_logit.1", logits[1])
      end)
    end)
  end)
end

describe("variant options and hook state", function()
  it("reject bad values naming the option", function()
    local cases = {
      { { weight_decay_mode = "sometimes" }, "weight_decay_mode must be 'decoupled' or 'cautious', got 'sometimes'" },
      { { scale_mode = "radial" }, "scale_mode must be 'matched_adamw_rms' or 'keller' or 'spectral', got 'radial'" },
      { { nd_mode = "fold" }, "nd_mode must be 'batch' or 'flatten', got 'fold'" },
      { { hook_state = { v = "rows" } }, "hook_state needs a pre_ortho_fn or a post_ortho_fn (the hook that keeps it)" },
      { { hook_state = { v = "diagonal" }, post_ortho_fn = function() end },
        "hook_state.v must be 'rows', 'cols', 'matrix', 'scalar', 'rows_rows' or 'cols_cols', got diagonal" },
      { { post_ortho_fn = function() end, reshape_fn = function() end },
        "post_ortho_fn cannot be combined with reshape_fn or ns_transform_fn" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(engine.new, config(c[1]))
      assert.is_false(ok)
      assert.are.equal(E.EINVAL, E.code(err))
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  it("hook state survives save/load bitwise, and a failed step leaves it as it was", function()
    local function build()
      local eng = engine.new("configs/normuon.lua")
      local ps = {}
      for i, s in ipairs({ { "w", { 6, 4 } }, { "x", { 2, 5, 3 } } }) do
        ps[s[1]] = { w = T.randn(s[2], i), g = T.zeros(s[2]) }
        eng:add_param(s[1], ps[s[1]].w, ps[s[1]].g)
      end
      return eng, ps
    end
    local function grads(ps, step)
      for i, n in ipairs({ "w", "x" }) do ps[n].g:copy(T.randn(ps[n].g:size(), 100 * step + i)) end
    end
    local a, pa = build()
    for step = 1, 3 do grads(pa, step); a:step() end
    local path = H.tmpname(".safetensors")
    a:save(path)
    local b, pb = build()
    for n, p in pairs(pa) do pb[n].w:copy(p.w) end
    b:load(path)
    os.remove(path)
    H.assert_equal_bits(a:state("x")["hook.v"], b:state("x")["hook.v"], "loaded hook state")
    -- a failed step (NaN gradient) changes no hook state
    local v = a:state("w")["hook.v"]:clone()
    grads(pa, 4)
    pa.x.g:set(0 / 0, 1, 2, 2)
    assert.is_false(pcall(a.step, a))
    H.assert_equal_bits(v, a:state("w")["hook.v"], "hook state after a failed step")
    -- both continue bitwise alike
    grads(pa, 4); grads(pb, 4)
    a:step(); b:step()
    for n in pairs(pa) do H.assert_equal_bits(pa[n].w, pb[n].w, n) end
    H.assert_equal_bits(a:state("w")["hook.v"], b:state("w")["hook.v"], "hook state after resuming")
  end)

  it("a checkpoint without the hook state a group declares is rejected, naming it", function()
    local eng = engine.new(config({}))
    eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
    eng:step()
    local path = H.tmpname(".safetensors")
    eng:save(path)
    local n = engine.new("configs/normuon.lua")
    n:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
    local ok, err = pcall(n.load, n, path)
    os.remove(path)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("state of 'w' has no 'hook.v' tensor", 1, true), tostring(err))
  end)

  it("signals: validated, kept until set again, read by hooks as ctx.signals", function()
    local seen
    local eng = engine.new({ groups = { { optimizer = "muon", post_update_fn = function(_, _, ctx) seen = ctx.signals end } } })
    eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
    eng:set_signal("s", { 1, 2.5 })
    eng:step()
    assert.are.same({ s = { 1, 2.5 } }, seen)
    eng:step()
    assert.are.same({ s = { 1, 2.5 } }, seen)
    for _, bad in ipairs({ { 1, 0 / 0 }, { 1, math.huge }, { x = 1 }, "no" }) do
      local ok, err = pcall(eng.set_signal, eng, "s", bad)
      assert.is_false(ok)
      assert.are.equal(E.EINVAL, E.code(err))
    end
  end)
end)
