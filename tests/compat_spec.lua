-- Seed compatibility and "no silent surprises": a step with nothing to do,
-- step(closure), hooks that would never run, the randn generator, module
-- name typos, the seed's options (ns_steps 0 and > 5, hsdp_replica_count,
-- group hyperparameters in state dicts, add_param_group) and checkpoints
-- written by Python (the documented format, with and without checksums).
local H = require("helpers")
local muon = H.muon
local T = H.T
local ffi = require("ffi")
local bit = require("bit")
local cjson = require("cjson")

local Muon, AdamW = muon.optim.Muon, muon.optim.AdamW

-- Collect what fn writes to stderr (io.stderr:write calls).
local stderr_of = H.stderr_of

local function count(text, needle)
  local n, at = 0, 1
  while true do
    local s, e = text:find(needle, at, true)
    if not s then return n end
    n, at = n + 1, e + 1
  end
end

---------------------------------------------------------------- nothing to step

describe("a step with nothing to do", function()
  it("standalone Muon and AdamW: no grad -> (nil, false), nothing changes; with a grad -> stepped", function()
    for _, cls in ipairs({ Muon, AdamW }) do
      local w = T.randn({ 3, 2 }, 1)
      local w0 = w:clone()
      local p = muon.param("w", w, nil)
      local opt = cls({ p }, { lr = 0.1 })
      local loss, stepped = opt:step()
      assert.is_nil(loss)
      assert.is_false(stepped)
      H.assert_equal_bits(w, w0, "value untouched")
      assert.are.equal(0, opt.param_groups[1].step)
      assert.is_nil(opt.state[p])
      p.grad = T.randn({ 3, 2 }, 2)
      loss, stepped = opt:step()
      assert.is_true(stepped)
      assert.are.equal(1, opt.param_groups[1].step)
      assert.truthy(H.max_abs_diff(w, w0) > 1e-3)
    end
  end)

  it("parameters without a grad are skipped while the others step (torch)", function()
    local a, b = T.randn({ 4 }, 1, "float64"), T.randn({ 4 }, 2, "float64")
    local a0, b0 = a:clone(), b:clone()
    local g = T.randn({ 4 }, 3, "float64")
    local pa, pb = muon.param("a", a, g), muon.param("b", b, nil)
    local opt = AdamW({ pa, pb }, { lr = 0.1, weight_decay = 0 })
    local _, stepped = opt:step()
    assert.is_true(stepped)
    H.assert_equal_bits(b, b0, "b has no grad")
    assert.is_nil(opt.state[pb])
    -- AdamW step 1: p - lr * g / (|g| + eps) (bias corrections cancel)
    local af, a0f, gf = a:flat(), a0:flat(), g:flat()
    for i = 1, 4 do
      local want = a0f[i] - 0.1 * gf[i] / (math.abs(gf[i]) + 1e-8)
      assert(math.abs(af[i] - want) < 1e-12, ("a[%d] = %.17g, want %.17g"):format(i, af[i], want))
    end
  end)

  it("engine: no grad keeps the step count and the schedule; the next real step is step 1", function()
    local calls = {}
    local eng = muon.engine.new({
      groups = { { optimizer = "adamw", lr = 1, weight_decay = 0 } },
      schedule = function(step) calls[#calls + 1] = step; return 0.1 / step end,
    })
    local w = T.from({ 1, 2, 3 }, { 3 }, "float64")
    local p = eng:add_param("w", w, nil)
    for _ = 1, 3 do
      local loss, stepped = eng:step()
      assert.is_nil(loss)
      assert.is_false(stepped)
    end
    assert.are.equal(0, eng:get("step"))
    assert.are.equal(0, eng:get("stepped"))
    assert.are.same({ 1, 2, 3 }, w:flat())
    p.grad = T.from({ 1, -1, 2 }, { 3 }, "float64")
    local _, stepped = eng:step()
    assert.is_true(stepped)
    assert.are.equal(1, eng:get("step"))
    assert.are.equal(1, eng:get("stepped"))
    assert.are.same({ 1, 1, 1, 1 }, calls) -- the schedule was asked for step 1 every time
    -- lr = schedule(1) = 0.1: p - 0.1 * sign(g)
    H.assert_close(w:flat(), { 0.9, 2.1, 2.9 }, 1e-7, "AdamW step with lr 0.1")
  end)

  it("engine without any parameter: nothing to step", function()
    local eng = muon.engine.new({ groups = { { optimizer = "muon" } } })
    assert.is_false(select(2, eng:step()))
    assert.are.equal(0, eng:get("step"))
  end)
end)

---------------------------------------------------------------- closures

describe("step(closure)", function()
  it("calls the closure first (it may set the grads) and returns its value", function()
    for _, make in ipairs({
      function(p) local o = Muon({ p }, { lr = 0.05 }); return function(c) return o:step(c) end end,
      function(p)
        local e = muon.engine.new({ groups = { { optimizer = "muon", lr = 0.05 } } })
        e:add_param(p.name, p.value, nil)
        p = e:param(p.name)
        return function(c) return e:step(c) end, p
      end,
    }) do
      local w = T.randn({ 3, 4 }, 5)
      local twin = T.randn({ 3, 4 }, 5)
      local p = muon.param("w", w, nil)
      local step, q = make(p)
      q = q or p
      local order = {}
      local loss, stepped = step(function()
        order[#order + 1] = "closure"
        q.grad = T.randn({ 3, 4 }, 6)
        return 1.25
      end)
      assert.are.equal(1.25, loss)
      assert.is_true(stepped)
      -- the same step with the grad set beforehand
      local ref = Muon({ muon.param("w", twin, T.randn({ 3, 4 }, 6)) }, { lr = 0.05 })
      ref:step()
      H.assert_equal_bits(w, twin, "closure step = plain step")
      assert.has_error(function() step(42) end)
    end
  end)
end)

---------------------------------------------------------------- hooks never called

describe("hooks that would never be called", function()
  for _, h in ipairs({ "post_update_fn", "reshape_fn", "ns_transform_fn", "zeropower_fn", "momentum_update_fn",
    "post_ortho_fn" }) do
    it(h .. " on an AdamW group is refused at load, naming the group and the hook", function()
      local ok, err = pcall(muon.engine.new, { groups = {
        { optimizer = "muon", match = "^w" },
        { name = "embed", optimizer = "adamw", [h] = function() end },
      } })
      assert.is_false(ok)
      err = tostring(err)
      assert.truthy(err:find("group 2 ('embed')", 1, true), err)
      assert.truthy(err:find("hook '" .. h .. "' would never be called", 1, true), err)
    end)
  end

  it("hook_state on an AdamW group, and config-wide hooks with no Muon group", function()
    local ok, err = pcall(muon.engine.new, { groups = { { optimizer = "adamw", hook_state = { s = "rows" } } } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("hook 'hook_state' would never be called", 1, true), tostring(err))
    ok, err = pcall(muon.engine.new, { groups = { { optimizer = "adamw" } }, hooks = { post_update_fn = function() end } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("post_update_fn would never be called", 1, true), tostring(err))
    -- with a Muon group they run there: fine
    assert.has_no.errors(function()
      muon.engine.new({ groups = { { optimizer = "muon", match = "^w" }, { optimizer = "adamw" } },
        hooks = { post_update_fn = function() end } })
    end)
    ok, err = pcall(AdamW, {}, { post_update_fn = function() end })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("post_update_fn", 1, true))
  end)
end)

---------------------------------------------------------------- randn

describe("T.randn", function()
  it("with a seed: the same numbers as always", function()
    local a = T.randn({ 5 }, 1, "float64")
    assert.are.same({ 0.33481947115372201, 0.74813598021551675, 1.3059973975107388, -0.052456411388013484,
      0.76313757032230467 }, a:flat())
    H.assert_close(T.randn({ 3 }, 12345):flat(), { -0.297829211, 0.0488053076, -1.66775846 }, 1e-8, "seed 12345")
  end)

  it("without a seed: the default generator (successive calls differ; manual_seed repeats)", function()
    local a, b = T.randn({ 64 }, nil, "float64"), T.randn({ 64 }, nil, "float64")
    assert.truthy(H.max_abs_diff(a, b) > 0.1)
    T.manual_seed(7)
    local c, d = T.randn({ 64 }), T.randn({ 64 })
    T.manual_seed(7)
    H.assert_equal_bits(T.randn({ 64 }), c, "manual_seed replays")
    H.assert_equal_bits(T.randn({ 64 }), d, "manual_seed replays the sequence")
    local g1, g2 = T.generator(3), T.generator(3)
    H.assert_equal_bits(g1:randn({ 8 }), T.randn({ 8 }, g2), "a generator object, as method or argument")
    assert.truthy(H.max_abs_diff(g1:randn({ 8 }), g2:randn({ 8 }, "float32")) == 0)
    assert.has_error(function() T.randn({ 2 }, "seed") end)
    assert.has_error(function() T.randn({ 2 }, 1.5) end)
  end)

  it("draws standard normals (mean 0, variance 1 over 20000 draws)", function()
    local x = T.generator(11):randn({ 20000 }, "float64"):flat()
    local s, s2 = 0, 0
    for _, v in ipairs(x) do s, s2 = s + v, s2 + v * v end
    local mean = s / #x
    local var = s2 / #x - mean * mean
    assert(math.abs(mean) < 0.03, "mean " .. mean)
    assert(math.abs(var - 1) < 0.05, "variance " .. var)
  end)
end)

---------------------------------------------------------------- module names

describe("unknown module names raise", function()
  it("muon.<typo>, muon.optim.<typo>, muon.ns.<typo> list the valid names", function()
    local cases = {
      { function() return muon.optm end, "muon has no field 'optm'", "optim" },
      { function() return muon.optim.Adam end, "muon.optim has no field 'Adam'", "AdamW, Lion, Muon" },
      { function() return muon.ns.zeropowr end, "muon.ns has no field 'zeropowr'", "zeropower" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
      assert.truthy(tostring(err):find(c[3], 1, true), tostring(err))
    end
    assert.are.equal(require("muon.engine"), muon.engine)
    assert.are.equal(require("muon.dist"), muon.dist)
    assert.is_function(muon.blas_info)
  end)
end)

---------------------------------------------------------------- seed options

describe("seed options load unchanged", function()
  it("ns_steps > 5 with asym5 runs the five defined steps (warning once, not an error)", function()
    local text = stderr_of(function()
      for _ = 1, 2 do
        local a, b = T.randn({ 6, 4 }, 1), T.randn({ 6, 4 }, 1)
        local o8 = Muon({ muon.param("w", a, T.randn({ 6, 4 }, 2)) }, { ns_steps = 8 })
        local o5 = Muon({ muon.param("w", b, T.randn({ 6, 4 }, 2)) }, { ns_steps = 5 })
        o8:step()
        o5:step()
        H.assert_equal_bits(a, b, "ns_steps 8 = ns_steps 5 for asym5")
        assert.are.equal(8, o8.param_groups[1].ns_steps)
      end
    end)
    assert.are.equal(1, count(text, "ns_steps=8 with ns_variant='asym5', which defines 5 steps"), text)
  end)

  it("ns_steps = 0 only normalizes: p - lr * scale * u / (||u|| + eps)", function()
    local shape = { 3, 5 }
    local w = T.randn(shape, 1, "float64")
    local g = T.randn(shape, 2, "float64")
    local w0, gf = w:flat(), g:flat()
    local lr, wd, m, eps = 0.02, 0.1, 0.95, 1e-10
    local opt = Muon({ muon.param("w", w, g) }, { ns_steps = 0, lr = lr, weight_decay = wd, momentum = m })
    opt:step()
    -- first step: buf = 0, u = g, nesterov: u = m * u + g
    local norm = 0
    for i = 1, #gf do norm = norm + ((1 + m) * gf[i]) ^ 2 end
    norm = math.sqrt(norm)
    local scale = math.sqrt(5) * 0.2
    local want = {}
    for i = 1, #gf do want[i] = w0[i] * (1 - lr * wd) - lr * scale * (1 + m) * gf[i] / (norm + eps) end
    H.assert_close(w:flat(), want, 1e-14, "ns_steps = 0")
  end)

  it("hsdp_replica_count: accepted where it holds, refused with the equivalent dist.mesh", function()
    local p = muon.param("w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 }))
    assert.has_no.errors(function() Muon({ p }, { hsdp_replica_count = 1 }) end)
    assert.has_no.errors(function() Muon({ p }, { hsdp_replica_count = { 1, 1 } }) end)
    local ok, err = pcall(Muon, { p }, { hsdp_replica_count = 2 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('dist = { mesh = { { "replicate", 2 }', 1, true), tostring(err))
    assert.is_false((pcall(Muon, { p }, { hsdp_replica_count = 0 })))
    assert.has_no.errors(function()
      muon.engine.new({ groups = { { optimizer = "muon", hsdp_replica_count = 2 } },
        dist = { mesh = { { "replicate", 2 }, { "shard", 2 } } } })
    end)
    ok, err = pcall(muon.engine.new, { groups = { { optimizer = "muon", hsdp_replica_count = { 2, 2 } } },
      dist = { mesh = { { "replicate", 2 }, { "shard", 2 } } } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("hsdp_replica_count = 4", 1, true), tostring(err))
    assert.truthy(tostring(err):find("replicate axes (replicate) have 2 ranks", 1, true), tostring(err))
    ok, err = pcall(muon.engine.new, { groups = { { optimizer = "muon", hsdp_replica_count = 2 } } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("no dist section", 1, true), tostring(err))
  end)

  it("state_dict carries each group's hyperparameters; load_state_dict and load restore them", function()
    local opts = { lr = 0.05, momentum = { 0.9, 0.8 }, ns_steps = 3, weight_decay = 0.01, nesterov = false,
      ns_variant = "legacy", matched_adamw_rms = 0.3 }
    local function fresh(o) return Muon({ muon.param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2)) }, o) end
    local a = fresh(opts)
    a:step()
    local d = a:state_dict()
    assert.are.equal(0.05, d.groups[1].options.lr)
    assert.are.same({ 0.9, 0.8 }, d.groups[1].options.momentum)
    assert.are.equal("legacy", d.groups[1].options.ns_variant)
    local path = H.tmpname(".safetensors")
    a:save(path)
    for _, how in ipairs({ "state dict", "file" }) do
      local b = fresh()
      if how == "file" then b:load(path) else b:load_state_dict(d) end
      for k, v in pairs(opts) do assert.are.same(v, b.param_groups[1][k], how .. ": " .. k) end
      assert.are.equal(3, b.param_groups[1]._ns.steps)
      -- the next step is the original's next step, bit for bit
      local wa, wb = a.param_groups[1].params[1].value:clone(), nil
      b.param_groups[1].params[1].value:copy(wa)
      local ga = T.randn({ 4, 3 }, 9)
      local a2 = fresh(opts)
      a2:load_state_dict(d)
      a2.param_groups[1].params[1].value:copy(wa)
      a2.param_groups[1].params[1].grad:copy(ga)
      b.param_groups[1].params[1].grad:copy(ga)
      a2:step()
      b:step()
      wb = b.param_groups[1].params[1].value
      H.assert_equal_bits(wb, a2.param_groups[1].params[1].value, how .. ": next step")
    end
    os.remove(path)
    -- a state dict whose options fail the constructor's checks is refused, changing nothing
    local bad = a:state_dict()
    bad.groups[1].options.lr = -1
    local c = fresh({ lr = 0.07 })
    assert.has_error(function() c:load_state_dict(bad) end)
    assert.are.equal(0.07, c.param_groups[1].lr)
    assert.are.equal(0, c.param_groups[1].step)
  end)

  it("checkpoints without hyperparameters (older files) still load", function()
    local S = require("muon.checkpoint")
    local st = require("muon.safetensors")
    local a = AdamW({ muon.param("b", T.randn({ 3 }, 1), T.randn({ 3 }, 2)) }, { lr = 0.2 })
    a:step()
    local d = a:state_dict()
    d.groups[1].options = nil
    local entries, meta = S.encode({ { prefix = "", dict = d } })
    local path = H.tmpname(".safetensors")
    st.save(path, entries, meta)
    local b = AdamW({ muon.param("b", T.randn({ 3 }, 1), T.randn({ 3 }, 2)) }, { lr = 0.3 })
    b:load(path)
    os.remove(path)
    assert.are.equal(0.3, b.param_groups[1].lr) -- nothing to restore: its own
    assert.are.equal(1, b.param_groups[1].step)
    H.assert_equal_bits(b.state[b.param_groups[1].params[1]].exp_avg, a.state[a.param_groups[1].params[1]].exp_avg,
      "exp_avg")
  end)

  it("engine checkpoints keep the hyperparameters; the config's own values win, and a difference is said", function()
    local function eng_of(cfg)
      local e = muon.engine.new(cfg)
      e:add_param("w", T.randn({ 3, 2 }, 1), T.randn({ 3, 2 }, 2))
      return e
    end
    local a = eng_of({ groups = { { optimizer = "muon", lr = 0.1, ns_steps = 4 } } })
    a:step()
    local path = H.tmpname(".safetensors")
    a:save(path)
    local b = eng_of({ groups = { { optimizer = "muon", lr = 0.2, ns_steps = 5 } } })
    local text = stderr_of(function() b:load(path) end)
    os.remove(path)
    assert.truthy(text:find("ns_steps = 4 in the checkpoint, 5 in the config", 1, true), text)
    assert.are.equal(5, b.groups[1].options.ns_steps)
    assert.are.equal(0.1, b:get("lr")) -- the last step's value, until the next step
    b:step()
    assert.are.equal(0.2, b:get("lr"))
  end)

  it("add_param_group: validated like the constructor, defaults for the rest, steps with the others", function()
    local p = muon.param("w", T.randn({ 3, 2 }, 1), T.randn({ 3, 2 }, 2))
    local q = muon.param("v", T.randn({ 4, 2 }, 3), T.randn({ 4, 2 }, 4))
    local opt = Muon({ p }, { lr = 0.05, weight_decay = 0 })
    opt:step()
    local ok, err = pcall(opt.add_param_group, opt, { params = { p } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("more than one parameter group", 1, true))
    ok, err = pcall(opt.add_param_group, opt, { params = { q }, lrr = 1 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("Muon param group 2: unknown key 'lrr' (did you mean 'lr'?)", 1, true), tostring(err))
    assert.is_false((pcall(opt.add_param_group, opt, { params = { q }, ns_steps = -1 })))
    assert.is_false((pcall(opt.add_param_group, opt, { params = { muon.param("b", T.zeros({ 3 }), T.zeros({ 3 })) } })))
    assert.are.equal(1, #opt.param_groups)
    opt:add_param_group({ params = { q }, momentum = 0.5 })
    local g2 = opt.param_groups[2]
    assert.are.equal(0.05, g2.lr) -- the constructor's defaults
    assert.are.equal(0, g2.weight_decay)
    assert.are.equal(0.5, g2.momentum)
    opt:step()
    assert.are.equal(2, opt.param_groups[1].step)
    assert.are.equal(1, g2.step)
    -- q stepped as in an optimizer of its own with those options
    local twin = Muon({ muon.param("v", T.randn({ 4, 2 }, 3), T.randn({ 4, 2 }, 4)) },
      { lr = 0.05, weight_decay = 0, momentum = 0.5 })
    twin:step()
    H.assert_equal_bits(q.value, twin.param_groups[1].params[1].value, "added group's step")
    assert.are.equal(2, #opt:state_dict().groups)
  end)
end)

---------------------------------------------------------------- Python checkpoints

-- The safetensors bytes the README's Python recipe writes: json.dumps of
-- the header (insertion order, ", " and ": " separators), padded with
-- spaces to 8 bytes, then the tensors' little-endian bytes in order.
local function json_py(v)
  -- a small json.dumps: objects keep the given key order ({ {k, v}, ... })
  if type(v) == "table" and v.__pairs then
    local parts = {}
    for i, kv in ipairs(v.__pairs) do parts[i] = cjson.encode(kv[1]) .. ": " .. json_py(kv[2]) end
    return "{" .. table.concat(parts, ", ") .. "}"
  elseif type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = json_py(x) end
    return "[" .. table.concat(parts, ", ") .. "]"
  elseif type(v) == "number" and v == math.floor(v) then
    return ("%d"):format(v)
  end
  return cjson.encode(v)
end
local function obj(...) return { __pairs = { ... } } end

local function f32_bytes(list)
  local a = ffi.new("float[?]", #list, list)
  return ffi.string(a, 4 * #list)
end

local function u64le(n)
  local t = {}
  for i = 1, 8 do
    t[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(t)
end

local function python_checkpoint(meta_pairs, tensors)
  local header = { obj("__metadata__", obj(unpack(meta_pairs))) }
  local pairs_ = { { "__metadata__", obj(unpack(meta_pairs)) } }
  local data, off = {}, 0
  for _, t in ipairs(tensors) do
    local b = f32_bytes(t.values)
    pairs_[#pairs_ + 1] = { t.name, obj({ "dtype", "F32" }, { "shape", t.shape }, { "data_offsets", { off, off + #b } }) }
    data[#data + 1] = b
    off = off + #b
  end
  header = json_py({ __pairs = pairs_ })
  header = header .. string.rep(" ", (8 - #header % 8) % 8)
  return u64le(#header) .. header .. table.concat(data), table.concat(data)
end

local function xxh64(s)
  local C = require("muon.core").C
  local out = ffi.new("uint64_t[1]")
  assert(C.mu_st_checksum_bytes(s, #s, out) == 0)
  return "xxh64:" .. bit.tohex(out[0], 16)
end

describe("checkpoints written by Python", function()
  local state = cjson.encode({
    { prefix = "muon/", kind = "muon", params = { { name = "w", shape = { 2, 3 }, dtype = "float32", group = 1 } },
      groups = { { step = 3, options = { lr = 0.02, momentum = 0.95 } } } },
    { prefix = "adamw/", kind = "adamw", params = { { name = "b", shape = { 3 }, dtype = "float32", group = 1 } },
      groups = { { step = 3 } }, scalars = { b = { step = 3 } } },
  })
  local meta = { { "muon.state", state }, { "muon.engine.step", "3" }, { "muon.engine.lr_scale", "1" } }
  local tensors = {
    { name = "muon/w/momentum_buffer", shape = { 2, 3 }, values = { 0, 0.1, 0.2, 0.3, 0.4, 0.5 } },
    { name = "adamw/b/exp_avg", shape = { 3 }, values = { 0.1, -0.2, 0.3 } },
    { name = "adamw/b/exp_avg_sq", shape = { 3 }, values = { 0.01, 0.04, 0.09 } },
  }
  local function engine()
    local e = muon.engine.new({ groups = { { optimizer = "muon", match = "^w", lr = 0.05 },
      { optimizer = "adamw", match = "^b" } } })
    e:add_param("w", T.zeros({ 2, 3 }), T.zeros({ 2, 3 }))
    e:add_param("b", T.zeros({ 3 }), T.zeros({ 3 }))
    return e
  end
  local function check_loaded(e)
    assert.are.equal(3, e:get("step"))
    assert.are.equal(0.02, e:get("lr"))
    H.assert_close(e:state("w").momentum_buffer:flat(), { 0, 0.1, 0.2, 0.3, 0.4, 0.5 }, 1e-7, "momentum_buffer")
    H.assert_close(e:state("b").exp_avg_sq:flat(), { 0.01, 0.04, 0.09 }, 1e-8, "exp_avg_sq")
    assert.are.equal(3, e:state("b").step)
  end

  it("without checksums: refused by default, loaded with { checksum = false }", function()
    local path = H.tmpname(".safetensors")
    H.write_file(path, (python_checkpoint(meta, tensors)))
    local e = engine()
    local ok, err = pcall(e.load, e, path)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("checksum = false", 1, true), tostring(err))
    assert.are.equal(0, e:get("step"))
    e:load(path, { checksum = false })
    check_loaded(e)
    os.remove(path)
  end)

  it("{ checksum = false } still validates names, dtypes, shapes, values and metadata", function()
    local path = H.tmpname(".safetensors")
    local function refused(m, ts, what)
      H.write_file(path, (python_checkpoint(m, ts)))
      local e = engine()
      local ok, err = pcall(e.load, e, path, { checksum = false })
      assert.is_false(ok, what)
      assert.are.equal(0, e:get("step"), what)
      return tostring(err)
    end
    local short = { tensors[1], tensors[2], { name = "adamw/b/exp_avg_sq", shape = { 2 }, values = { 1, 2 } } }
    assert.truthy(refused(meta, short, "shape"):find("exp_avg_sq", 1, true))
    local stray = { tensors[1], tensors[2], tensors[3], { name = "adamw/b/extra", shape = { 1 }, values = { 1 } } }
    assert.truthy(refused(meta, stray, "stray tensor"):find("adamw/b/extra", 1, true))
    local nan = { tensors[1], tensors[2], { name = "adamw/b/exp_avg_sq", shape = { 3 }, values = { 0, 0 / 0, 1 } } }
    assert.truthy(refused(meta, nan, "NaN"):find("NaN", 1, true))
    local badmeta = { meta[1], { "muon.engine.step", "three" }, meta[3] }
    assert.truthy(refused(badmeta, tensors, "step"):find("muon.engine.step", 1, true))
    assert.has_error(function() engine():load(path, { checksum = "no" }) end)
    assert.has_error(function() engine():load(path, { verify = false }) end)
    os.remove(path)
  end)

  it("with the documented checksums (xxh64 of the data section, and of the sorted metadata lines): loads verified", function()
    local _, data = python_checkpoint(meta, tensors)
    local keys = {}
    for _, kv in ipairs(meta) do keys[#keys + 1] = kv end
    table.sort(keys, function(x, y) return x[1] < y[1] end)
    local lines = {}
    for i, kv in ipairs(keys) do lines[i] = kv[1] .. "=" .. kv[2] .. "\n" end
    local summed = { meta[1], meta[2], meta[3], { "muon.state_checksum", xxh64(table.concat(lines)) },
      { "muon.checksum", xxh64(data) } }
    local path = H.tmpname(".safetensors")
    H.write_file(path, (python_checkpoint(summed, tensors)))
    local e = engine()
    e:load(path)
    check_loaded(e)
    os.remove(path)
  end)
end)
