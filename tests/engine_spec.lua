-- AdamW, the config-driven engine, config loading and its sandbox.
local H = require("helpers")
local R = require("ref_muon")
local muon = H.muon
local T = H.T
local engine = muon.engine
local E = require("muon.errors")
local D = require("muon.dist")

describe("AdamW", function()
  it("matches a double-precision torch.optim.AdamW over 5 steps", function()
    local o = { lr = 0.01, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 }
    local specs = { { 7 }, { 3, 4 }, { 2, 3, 2 } }
    local params, refs = {}, {}
    for i, s in ipairs(specs) do
      local v, g = T.randn(s, i), T.randn(s, 10 + i)
      params[i] = muon.param("p" .. i, v, g)
      refs[i] = { value = v:flat(), grad = g:flat() }
    end
    local opt = muon.optim.AdamW(params, o)
    for step = 1, 5 do
      if step > 1 then
        for i, p in ipairs(params) do
          local g = T.randn(p.value:size(), step * 100 + i)
          p.grad:copy(g)
          refs[i].grad = g:flat()
        end
      end
      opt:step()
      for i = 1, #refs do R.adamw_step(refs[i], o, step) end
    end
    for i, p in ipairs(params) do
      H.assert_close(p.value, refs[i].value, 2e-6, p.name)
      H.assert_close(opt.state[p].exp_avg, refs[i].m, 1e-6, p.name .. " exp_avg")
      H.assert_close(opt.state[p].exp_avg_sq, refs[i].v, 1e-6, p.name .. " exp_avg_sq")
      assert.equal(5, opt.state[p].step)
    end
  end)

  it("first step moves each weight by about lr (bias correction)", function()
    local v = T.from({ 1, -2, 3 }, { 3 })
    local g = T.from({ 0.5, -4, 1e-3 }, { 3 })
    local opt = muon.optim.AdamW({ muon.param("b", v, g) }, { lr = 0.1, weight_decay = 0 })
    opt:step()
    -- m/sqrt(v) after correction is sign(g) for every element
    H.assert_close(v, { 0.9, -1.9, 2.9 }, 1e-5, "step 1")
  end)

  it("validates its options", function()
    local p = muon.param("b", T.zeros({ 3 }), T.zeros({ 3 }))
    local cases = {
      { { lr = -1 }, "lr must be >= 0" },
      { { betas = { 0.9 } }, "betas must be a pair" },
      { { betas = { 0.9, 1.5 } }, "betas[2] must be in [0, 1)" },
      { { momentum = 0.9 }, "AdamW got unexpected keyword arguments: momentum; valid options: betas, eps, lr, nonfinite, state_dtype, weight_decay" },
      { { eps = 0 / 0 }, "eps must be a finite number" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(muon.optim.AdamW, { p }, c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  it("a NaN gradient fails atomically, naming the parameter", function()
    local a = muon.param("a", T.randn({ 4 }, 1), T.randn({ 4 }, 2))
    local b = muon.param("b", T.randn({ 4 }, 3), T.randn({ 4 }, 4))
    local opt = muon.optim.AdamW({ a, b })
    local av, bv = a.value:clone(), b.value:clone()
    b.grad:set(0 / 0, 2)
    local ok, err = pcall(opt.step, opt)
    assert.is_false(ok)
    assert.truthy(err:find("parameter 'b': gradient holds NaN or Inf", 1, true), err)
    H.assert_equal_bits(a.value, av, "a")
    H.assert_equal_bits(b.value, bv, "b")
    assert.is_nil(opt.state[a])
  end)
end)

local function tiny_model(eng, seed)
  local ps = {
    eng:add_param("embed.weight", T.randn({ 10, 4 }, seed + 1), T.randn({ 10, 4 }, seed + 2)),
    eng:add_param("hidden.0.weight", T.randn({ 8, 4 }, seed + 3), T.randn({ 8, 4 }, seed + 4)),
    eng:add_param("hidden.0.bias", T.randn({ 8 }, seed + 5), T.randn({ 8 }, seed + 6)),
    eng:add_param("head.weight", T.randn({ 3, 8 }, seed + 7), T.randn({ 3, 8 }, seed + 8)),
  }
  return ps
end

local write_config = H.config_file

describe("engine", function()
  it("routes parameters by pattern, dims and order", function()
    local eng = engine.new("configs/muon.lua")
    tiny_model(eng, 0)
    local got = {}
    for _, r in ipairs(eng:describe()) do got[#got + 1] = r.name .. "=" .. r.optimizer .. ":" .. r.group_name end
    assert.same({ "embed.weight=adamw:rest", "hidden.0.weight=muon:hidden", "hidden.0.bias=adamw:rest",
      "head.weight=adamw:rest" }, got)
  end)

  it("steps like the optimizers used directly, with the schedule", function()
    local eng = engine.new({
      groups = {
        { optimizer = "muon", match = "^hidden", min_dim = 2, lr = 0.02 },
        { optimizer = "adamw", lr = 0.001, betas = { 0.9, 0.95 }, weight_decay = 0 },
      },
      schedule = function(step, g) return g.base_lr * step end,
    })
    local ps = tiny_model(eng, 10)
    local ref_h = muon.param("h", ps[2].value:clone(), ps[2].grad)
    local ref_b = muon.param("b", ps[3].value:clone(), ps[3].grad)
    local mo = muon.optim.Muon({ ref_h }, { lr = 0.02 })
    local ao = muon.optim.AdamW({ ref_b }, { lr = 0.001, betas = { 0.9, 0.95 }, weight_decay = 0 })
    for step = 1, 3 do
      eng:step()
      mo.param_groups[1].lr = 0.02 * step
      ao.param_groups[1].lr = 0.001 * step
      mo:step()
      ao:step()
      assert.equal(0.02 * step, eng:get("lr"))
      assert.equal(0.001 * step, eng:get("lr:2"))
    end
    H.assert_equal_bits(ps[2].value, ref_h.value, "muon param")
    H.assert_equal_bits(ps[3].value, ref_b.value, "adamw param")
    assert.equal(3, eng:get("step"))
  end)

  it("lr_scale multiplies every group's lr", function()
    local eng = engine.new("configs/keller.lua")
    tiny_model(eng, 20)
    eng:set("lr_scale", 0.5)
    eng:step()
    assert.equal(0.01, eng:get("lr"))
    assert.equal(0.5, eng:get("lr_scale"))
    assert.has_error(function() eng:set("bogus", 1) end)
    assert.has_error(function() eng:get("bogus") end)
  end)

  it("a failure in one optimizer leaves the other untouched", function()
    local eng = engine.new("configs/muon.lua")
    local ps = tiny_model(eng, 30)
    eng:step()
    local before = {}
    for i, p in ipairs(ps) do before[i] = p.value:clone() end
    ps[4].grad:set(0 / 0, 1, 1) -- AdamW head
    local ok, err = pcall(eng.step, eng)
    assert.is_false(ok)
    assert.truthy(err:find("parameter 'head.weight'", 1, true), err)
    for i, p in ipairs(ps) do H.assert_equal_bits(p.value, before[i], p.name) end
    assert.equal(1, eng:get("step"))
  end)

  it("save and load resume bit-identically", function()
    local a = engine.new("configs/muon.lua")
    local pa = tiny_model(a, 40)
    for _ = 1, 3 do a:step() end
    local path = H.tmpname(".safetensors")
    a:save(path)
    local b = engine.new("configs/muon.lua")
    local pb = tiny_model(b, 999)
    for i = 1, #pa do pb[i].value:copy(pa[i].value) pb[i].grad:copy(pa[i].grad) end
    b:load(path)
    os.remove(path)
    assert.equal(3, b:get("step"))
    for _ = 1, 2 do
      a:step()
      b:step()
    end
    for i = 1, #pa do H.assert_equal_bits(pa[i].value, pb[i].value, pa[i].name) end
  end)

  it("names: valid UTF-8 of at most MU_MAX_NAME bytes, checked at add_param (engines, dry runs, optimizers); "
    .. "UTF-8 beyond ASCII and control characters save and load", function()
    local max = require("muon.core").C.MU_MAX_NAME
    assert.equal(65536, max)
    local bad = {
      { "caf\233", "'caf\\xE9' is not valid UTF-8 (byte 4 is 0xE9)" },
      { "w\192\175", "(byte 2 is 0xC0)" },           -- overlong '/'
      { "w\237\160\128", "(byte 2 is 0xED)" },       -- a surrogate
      { "w\244\144\128\128", "(byte 2 is 0xF4)" },   -- above U+10FFFF
      { "w\226\130", "(byte 2 is 0xE2)" },           -- cut short
      { "\128w", "'\\x80w' is not valid UTF-8 (byte 1 is 0x80)" },
      { ("é"):rep(40) .. "\255", "'" .. ("\\xC3\\xA9"):rep(30) .. "...' (81 bytes) is not valid UTF-8 (byte 81" },
      { ("n"):rep(max + 1), "'" .. ("n"):rep(60) .. "...' (65537 bytes) is longer than 65536 bytes (MU_MAX_NAME)" },
      { "", "parameter name must be a non-empty string, got ''" },
      { 7, "parameter name must be a non-empty string, got 7" },
    }
    for _, dry in ipairs({ false, true }) do
      local eng = engine.new({ groups = { { optimizer = "adamw" } } }, { dry_run = dry or nil })
      for _, c in ipairs(bad) do
        local ok, err = pcall(eng.add_param, eng, c[1], T.zeros({ 2 }), T.zeros({ 2 }))
        assert.is_false(ok)
        assert.equal(E.EINVAL, err.code)
        assert.truthy(tostring(err):find("add_param: parameter name ", 1, true), tostring(err))
        assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
        assert.equal(0, #eng:describe())
      end
    end
    for _, c in ipairs(bad) do
      local ok, err = pcall(muon.param, c[1], T.zeros({ 2 }), T.zeros({ 2 }))
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
    -- the names that register save and load (a checkpoint stores them as UTF-8 text)
    local good = { "café", "日本.w", "a\0b", "tab\there", "a\"b\\c/d", ("m"):rep(max), "\240\159\152\128" }
    local eng = engine.new({ groups = { { optimizer = "adamw" } } })
    for i, name in ipairs(good) do eng:add_param(name, T.randn({ 3 }, i), T.randn({ 3 }, 10 + i)) end
    eng:step()
    local path = H.tmpname(".safetensors")
    eng:save(path)
    local back = engine.new({ groups = { { optimizer = "adamw" } } })
    for i, name in ipairs(good) do back:add_param(name, T.zeros({ 3 }), T.randn({ 3 }, 10 + i)) end
    back:load(path)
    os.remove(path)
    for _, name in ipairs(good) do H.assert_equal_bits(eng:state(name).exp_avg, back:state(name).exp_avg, name) end
  end)

  it("describe() and param_groups() hand out copies: writing them changes nothing the engine keeps", function()
    local eng = engine.new({ groups = { { optimizer = "adamw", betas = { 0.8, 0.9 } } } })
    eng:add_param("w", T.zeros({ 2, 3 }), T.zeros({ 2, 3 }))
    eng:describe()[1].shape[1] = 99
    eng:describe()[1].options.betas[1] = 0.1
    eng:param_groups()[1].options.betas[2] = 0.2
    assert.same({ 2, 3 }, eng:describe()[1].shape)
    assert.same({ 2, 3 }, eng:param("w").logical_shape)
    assert.same({ 0.8, 0.9 }, eng:param_groups()[1].options.betas)
    eng:step()
    assert.same({ 0.8, 0.9 }, eng.groups[1].options.betas)
    -- the resolved Newton-Schulz options too (the C struct and its coefficients)
    local m = engine.new({ groups = { { optimizer = "muon", ns_steps = 5 } } })
    m:add_param("w", T.zeros({ 4, 3 }), T.zeros({ 4, 3 }))
    local ns_opts = m:describe()[1].ns_opts
    assert.equal(5, ns_opts.steps)
    ns_opts.steps, ns_opts.copts.steps, ns_opts.coeffs[0] = 1, 1, 99
    local r = m.groups[1].options._ns
    assert.equal(5, r.steps)
    assert.equal(5, r.copts.steps)
    assert.are_not.equal(99, r.coeffs[0])
    assert.equal(5, m:describe()[1].ns_opts.copts.steps)
  end)

  it("reports routing problems and bad configs with clear messages", function()
    local eng = engine.new({ groups = { { optimizer = "muon", match = "^w" } } })
    local ok, err = pcall(eng.add_param, eng, "bias", T.zeros({ 2, 2 }))
    assert.truthy(err:find("parameter 'bias' (shape [2, 2]) matches no group", 1, true), err)
    ok, err = pcall(eng.add_param, eng, "w1", T.zeros({ 3 }))
    assert.truthy(err:find("parameter 'w1' is 1-D but matched Muon group 1", 1, true), err)
    eng:add_param("w2", T.zeros({ 2, 2 }))
    ok, err = pcall(eng.add_param, eng, "w2", T.zeros({ 2, 2 }))
    assert.truthy(err:find("'w2' is already registered", 1, true), err)
    local cases = {
      { { groups = { { optimizer = "muon", lrr = 1 } } }, "group 1: Muon got unexpected keyword arguments: lrr (did you mean 'lr' for 'lrr'?)" },
      { { groups = { { optimizer = "sgd" } } }, "group 1: unknown optimizer 'sgd'; valid optimizers: adamw, lion, muon" },
      { { groups = {} }, "'groups' must be a non-empty list" },
      { { groups = { { optimizer = "adamw", lr = -3 } } }, "lr must be >= 0" },
      { { groups = { {} }, extra = 1 }, "unknown top-level key 'extra'; valid top-level keys: dist, groups, hook_budget, hooks, " },
      { { groups = { {} }, hooks = { reshape = function() end } }, "unknown hook 'reshape' (did you mean 'reshape_fn'?)" },
    }
    for _, c in ipairs(cases) do
      ok, err = pcall(engine.new, c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  it("loads config files and reports missing files and syntax errors", function()
    local ok, err = pcall(engine.new, "/nonexistent/cfg.lua")
    assert.truthy(err:find("config '/nonexistent/cfg.lua' (resolved /nonexistent/cfg.lua): No such file or directory",
      1, true), err)
    local path = write_config("return { groups = { { optimizer = 'muon' } ")
    ok, err = pcall(engine.new, path)
    os.remove(path)
    assert.truthy(err:find("syntax error", 1, true), err)
    path = write_config("return 42")
    ok, err = pcall(engine.new, path)
    os.remove(path)
    assert.truthy(err:find("must return a table, got number", 1, true), err)
  end)

  it("check() lists rows and problems instead of raising", function()
    local rows, problems = engine.check("configs/muon.lua", {
      { name = "hidden.w", shape = { 4, 4 } }, { name = "b", shape = { 4 } },
    })
    assert.equal(2, #rows)
    assert.equal("muon", rows[1].optimizer)
    assert.equal("adamw", rows[2].optimizer)
    assert.same({}, problems)
    rows, problems = engine.check({ groups = { { optimizer = "muon", match = "^w" } } }, {
      { name = "x", shape = { 3, 3 } },
    })
    assert.equal(1, #problems)
    assert.truthy(problems[1]:find("parameter 'x' (shape [3, 3]) matches no group", 1, true))
  end)

  -- (muon check and muon check --world are one dry run: a dry-run engine,
  -- stand-ins registered with add_param, the plan asked with eng:plan().)
  local HSDP = { groups = { { optimizer = "muon", min_dim = 2 }, { optimizer = "adamw" } },
    dist = { mesh = { { "replicate", 2 }, { "shard", 2 } } } }
  local SHAPES = { { name = "w", shape = { 8, 6 } }, { name = "b", shape = { 6 } }, { name = "e", shape = { 4, 6, 2 } } }

  it("a dry run of a dist config stands for rank 0 of its mesh; --world stands for any rank, on any mesh", function()
    local rows, problems, eng = engine.check(HSDP, SHAPES)
    assert.same({}, problems)
    assert.same({ "muon", "adamw", "muon" }, { rows[1].optimizer, rows[2].optimizer, rows[3].optimizer })
    local plan = eng:plan()
    assert.same({ 0, 4 }, { plan.rank, plan.mesh.size })
    -- rank 3 of 8 on another mesh: the stand-ins hold rank 3's shards (S(1) on the shard axis)
    rows, problems, eng = engine.check(HSDP, SHAPES, { dry_run = { world = 8, rank = 3,
      mesh = { { "replicate", 2 }, { "shard", 4 } } } })
    assert.same({}, problems)
    assert.same({ 8, 6 }, rows[1].shape) -- (the global shape)
    assert.same({ 2, 6 }, eng:param("w").value:size())
    assert.same({ 0 }, eng:param("b").value:size()) -- (6 in pieces of 2: none left for shard 3)
    plan = eng:plan()
    assert.same({ 3, 8, "(replicate=2, shard=4)" }, { plan.rank, plan.mesh.size, plan.mesh:describe() })
    for _, r in ipairs(plan.records) do
      assert.equal("(R,S(1))", D.placement_string(r.placement))
      assert.same(eng:param(r.name).value:size(), r.mine.len)
    end
    -- a config without dist, as rank 5 of 7 (a world axis, every parameter replicated)
    rows, problems, eng = engine.check("configs/muon.lua", SHAPES, { dry_run = { world = 7, rank = 5 } })
    assert.same({}, problems)
    assert.same({ 5, 7 }, { eng:plan().rank, eng:plan().mesh.size })
    assert.same({ 8, 6 }, eng:param("w").value:size())
  end)

  it("a dry-run engine routes and plans but never steps, saves or loads; bad dry runs name the problem", function()
    local eng = engine.new(HSDP, { dry_run = true })
    eng:add_param("w", T.zeros({ 8, 6 }), nil)
    for _, call in ipairs({ { "step" }, { "save", "x.safetensors" }, { "load", "x.safetensors" }, { "reduce_grads" },
      { "zero_grad" }, { "clip_grad_norm", 1 } }) do
      local ok, err = pcall(eng[call[1]], eng, call[2])
      assert.is_false(ok, call[1])
      assert.equal(E.ESTATE, E.code(err))
      assert.truthy(tostring(err):find(call[1] .. ": a dry-run engine (muon check) routes and plans", 1, true),
        tostring(err))
    end
    for _, c in ipairs({
      { { world = 4, rank = 4 }, "a dry run as rank 4 of 4: comm.virtual: rank must be an integer in 0..3, got 4" },
      { { world = 6 }, "a dry run as rank 0 of 6: dist.mesh: axis sizes (replicate=2, shard=2) multiply to 4 but the world has 6 ranks" },
      { { world = 2 ^ 31, mesh = { { "w", 2 ^ 31 } } }, "more than the 2147483647 MPI can number" },
      { { wrold = 4 }, "engine.new: unknown dry_run key 'wrold' (did you mean 'world'?)" },
      { "yes", "dry_run must be true or { world = N, rank = R, mesh = ... }, got string" },
    }) do
      local ok, err = pcall(engine.new, HSDP, { dry_run = c[1] })
      assert.is_false(ok)
      assert.equal(E.EINVAL, E.code(err))
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)
end)

describe("schedules", function()
  it("warmup_cosine warms up linearly then decays to the floor", function()
    local f = require("muon.schedules").warmup_cosine(20, 1020, 0.1)
    local g = { base_lr = 2 }
    assert.equal(0.1, f(1, g).lr)
    assert.equal(2, f(20, g).lr)
    assert.is_true(math.abs(f(520, g).lr - 2 * 0.55) < 1e-12)
    assert.is_true(math.abs(f(1020, g).lr - 0.2) < 1e-12)
    assert.is_true(math.abs(f(5000, g).lr - 0.2) < 1e-12)
    assert.has_error(function() require("muon.schedules").warmup_cosine(10, 5) end)
  end)

  it("the shipped configs load sandboxed and schedule their lr", function()
    for _, c in ipairs({ "muon", "adamw", "moonlight", "keller" }) do
      local eng = engine.new("configs/" .. c .. ".lua")
      eng:add_param("hidden.w", T.zeros({ 4, 4 }), T.zeros({ 4, 4 }))
      eng:step()
      assert.is_true(eng:get("lr") > 0, c)
    end
    local eng = engine.new("configs/muon.lua")
    eng:add_param("hidden.w", T.zeros({ 4, 4 }), T.zeros({ 4, 4 }))
    eng:step()
    assert.equal(0.02 / 20, eng:get("lr"))
  end)
end)

describe("config sandbox", function()
  local blocked = {
    { "os.execute('true')", "os.execute is blocked" },
    { "io.open('/tmp/x', 'w')", "io.open is blocked" },
    { "io.popen('ls')", "io.popen is blocked" },
    { "require('ffi')", "require('ffi') is blocked" },
    { "require('os')", "require('os') is blocked" },
    { "debug.getinfo(1)", "debug.getinfo is blocked" },
    { "load(string.dump(function() end))", "string.dump is blocked" },
    { "load('\\27LuaJ')", "load of bytecode is blocked" },
    { "dofile('/etc/passwd')", "dofile is blocked" },
    { "os.remove('/tmp/x')", "os.remove is blocked" },
  }
  for _, b in ipairs(blocked) do
    it("blocks " .. b[1], function()
      local path = write_config(b[1] .. "\nreturn { groups = { {} } }")
      local ok, err = pcall(engine.new, path)
      assert.is_false(ok)
      assert.truthy(tostring(err):find(b[2], 1, true), tostring(err))
      if b[2]:find("blocked", 1, true) then
        assert.truthy(tostring(err):find("trusted = true", 1, true), tostring(err))
      end
      -- a trusted config may do it (where harmless)
      os.remove(path)
    end)
  end

  it("allows muon's own modules and trusted configs", function()
    local path = write_config("local m = require('muon'); assert(m.tensor); return { groups = { { optimizer = 'adamw' } } }")
    assert.has_no.errors(function() engine.new(path) end)
    os.remove(path)
    path = write_config("local f = io.open('/dev/null'); f:close(); return { groups = { { optimizer = 'adamw' } } }")
    assert.has_error(function() engine.new(path) end)
    assert.has_no.errors(function() engine.new(path, { trusted = true }) end)
    os.remove(path)
  end)
end)
