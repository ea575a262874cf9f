-- One registration per buffer (muon.buffers): a value or grad whose memory
-- overlaps a registered value or grad is refused, naming both parameters,
-- and nothing is registered; in eng:add_param, the optimizer classes
-- (constructor and add_param_group) and C's mu_engine_add_param.
local H = require("helpers")
local ffi = require("ffi")
local muon = H.muon
local T = muon.tensor
local E = require("muon.errors")
local B = require("muon.buffers")
local C = require("muon.core").C

local function fails(want, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error: " .. want)
  assert.equal(E.EINVAL, E.code(err))
  assert.truthy(tostring(err):find(want, 1, true), tostring(err))
end

local function muon_cfg() return { groups = { { name = "m", optimizer = "muon", lr = 0.02 } } } end

describe("one registration per buffer", function()
  it("extents: bytes from the lowest to one past the highest element, strided and empty tensors", function()
    local x = T.zeros({ 4, 6 }) -- 96 bytes
    local base = tonumber(ffi.cast("uintptr_t", x:ptr()))
    local lo, hi = B.extent(x)
    assert.same({ base, base + 96 }, { lo, hi })
    lo, hi = B.extent(x:narrow(2, 3, 2)) -- rows 1..4, cols 3..4: from element 2 to element 3*6+3
    assert.same({ base + 8, base + 4 * (18 + 3 + 1) }, { lo, hi })
    lo, hi = B.extent(x:transpose(1, 2))
    assert.same({ base, base + 96 }, { lo, hi })
    assert.is_nil(B.extent(x:narrow(1, 1, 0)))
    local d = T.zeros({ 3 }, "float64")
    lo, hi = B.extent(d)
    assert.equal(24, hi - lo)
  end)

  it("a tied weight given twice (same tensor, a view of it) fails naming both, in Muon, AdamW and Lion", function()
    for _, cls in ipairs({ "Muon", "AdamW", "Lion" }) do
      local w = T.randn({ 8, 4 }, 1)
      local a = muon.param("embed.weight", w, T.zeros({ 8, 4 }))
      local b = muon.param("lm_head.weight", w, T.zeros({ 8, 4 }))
      fails("parameter 'lm_head.weight': its value overlaps the value of parameter 'embed.weight': a buffer can be "
        .. "registered only once (tied weights are one parameter: register it once, under one name)",
        muon.optim[cls], { a, b })
      local c = muon.param("half", w:view({ 2, 16 }):narrow(1, 2, 1), nil)
      fails("parameter 'half': its value overlaps the value of parameter 'embed.weight'", muon.optim[cls], { a, c })
    end
  end)

  it("grads: shared between two parameters, or one parameter's value, fail; adjacent buffers are fine", function()
    local g = T.zeros({ 4, 4 })
    fails("parameter 'y': its grad overlaps the grad of parameter 'x': a buffer can be registered only once "
      .. "(a grad needs its own buffer, apart from every registered value and grad)", muon.optim.Muon,
      { muon.param("x", T.zeros({ 4, 4 }), g), muon.param("y", T.zeros({ 4, 4 }), g) })
    local wx = T.zeros({ 4, 4 })
    fails("parameter 'y': its grad overlaps the value of parameter 'x'", muon.optim.Muon,
      { muon.param("x", wx, T.zeros({ 4, 4 })), muon.param("y", T.zeros({ 4, 4 }), wx) })
    -- one buffer cut in two halves, each a parameter: no byte in common, accepted
    local big = T.zeros({ 8, 4 })
    local gbig = T.zeros({ 8, 4 })
    local opt = muon.optim.Muon({ muon.param("top", big:narrow(1, 1, 4), gbig:narrow(1, 1, 4)),
      muon.param("bottom", big:narrow(1, 5, 4), gbig:narrow(1, 5, 4)) })
    assert.equal(2, #opt:params())
    -- a strided grad (every other column of a buffer) overlapping by extent
    local wide = T.zeros({ 4, 8 })
    fails("parameter 'q': its grad overlaps the grad of parameter 'p'", muon.optim.Muon, {
      muon.param("p", T.zeros({ 4, 4 }), wide:narrow(2, 1, 4)),
      muon.param("q", T.zeros({ 4, 4 }), wide:narrow(2, 5, 4)) })
  end)

  it("add_param_group: an overlap fails and adds nothing (no group, no parameter)", function()
    local w = T.randn({ 4, 4 }, 2)
    local opt = muon.optim.Muon({ muon.param("a", w, T.zeros({ 4, 4 })) })
    fails("parameter 'c': its value overlaps the value of parameter 'a'", opt.add_param_group, opt,
      { params = { muon.param("b", T.zeros({ 3, 3 }), T.zeros({ 3, 3 })), muon.param("c", w:narrow(1, 4, 1), nil) } })
    assert.equal(1, #opt.param_groups)
    assert.equal(1, #opt:params())
    -- the first of the refused group's parameters can be added afterwards: it was not registered
    opt:add_param_group({ params = { muon.param("b", T.zeros({ 3, 3 }), T.zeros({ 3, 3 })) } })
    assert.equal(2, #opt:params())
  end)

  it("eng:add_param: fails naming both, nothing registered, the engine steps as before", function()
    local eng = muon.engine.new(muon_cfg())
    local w, g = T.randn({ 4, 4 }, 3), T.randn({ 4, 4 }, 4)
    eng:add_param("embed", w, g)
    fails("parameter 'head': its value overlaps the value of parameter 'embed'", eng.add_param, eng, "head", w, T.zeros({ 4, 4 }))
    fails("parameter 'other': its grad overlaps the grad of parameter 'embed'", eng.add_param, eng, "other", T.zeros({ 4, 4 }), g)
    assert.is_nil(eng:param("head"))
    assert.is_nil(eng:param("other"))
    assert.equal(1, #eng.params)
    eng:add_param("head", T.zeros({ 4, 4 }), T.zeros({ 4, 4 })) -- the name is free
    eng:step()
    assert.equal(1, eng:get("step"))
  end)

  it("many parameters: every check is a binary search (1000 adjacent slices of one buffer, then one overlap)", function()
    local n = 1000
    local buf, gbuf = T.zeros({ n * 2, 2 }), T.zeros({ n * 2, 2 })
    local eng = muon.engine.new(muon_cfg())
    for i = n, 1, -1 do -- (out of address order)
      eng:add_param("p" .. i, buf:narrow(1, 2 * i - 1, 2), gbuf:narrow(1, 2 * i - 1, 2))
    end
    fails("parameter 'x': its value overlaps the value of parameter 'p501'", eng.add_param, eng, "x",
      buf:narrow(1, 1002, 2), nil)
  end)

  it("the registry stays balanced: 20000 registrations in address order, depth O(log n)", function()
    local buf = T.zeros({ 20000 * 2 })
    local set = B.new()
    for i = 1, 20000 do set:claim({ { name = "p" .. i, value = buf:narrow(1, 2 * i - 1, 2) } }) end
    assert.equal(20000, set:count())
    assert.is_true(set:depth() <= 4 * math.log(20000) / math.log(2), tostring(set:depth()))
    fails("parameter 'q': its value overlaps the value of parameter 'p777'", set.claim, set,
      { { name = "q", value = buf:narrow(1, 1554, 1) } })
    assert.equal(20000, set:count())
  end)

  it("swap: grads re-pointed at once (two exchanging buffers), an overlap refused with nothing changed", function()
    local set = B.new()
    local g1, g2, w1, w2 = T.zeros({ 4 }), T.zeros({ 4 }), T.zeros({ 4 }), T.zeros({ 4 })
    local p = { name = "p", value = w1, grad = g1 }
    local q = { name = "q", value = w2, grad = g2 }
    set:claim({ p, q })
    -- one at a time, p taking q's buffer would overlap it; together they exchange
    set:swap({ { p = p, what = "grad", t = g2 }, { p = q, what = "grad", t = g1 } })
    assert.is_true(p.grad == g2 and q.grad == g1)
    assert.equal(4, set:count())
    fails("parameter 'p': its grad overlaps the value of parameter 'q'", set.swap, set,
      { { p = p, what = "grad", t = w2 }, { p = q, what = "grad" } })
    assert.is_true(p.grad == g2 and q.grad == g1, "nothing changed")
    assert.equal(4, set:count())
    fails("parameter 'x': its value overlaps the grad of parameter 'q'", set.check, set, { { name = "x", value = g1 } })
    set:swap({ { p = q, what = "grad" } }) -- to none: its memory is free again
    assert.is_nil(q.grad)
    assert.equal(3, set:count())
    set:check({ { name = "x", value = g1 } })
  end)

  it("C: mu_engine_add_param with overlapping buffers fails naming both, nothing registered", function()
    local path = H.tmpname(".lua")
    H.write_file(path, "return { groups = { { optimizer = 'muon', lr = 0.02 } } }")
    local rc, e = H.c_engine_open(path)
    assert.equal(0, rc)
    local shape = ffi.new("int64_t[2]", { 2, 2 })
    local w = ffi.new("float[8]", { 1, 2, 3, 4, 5, 6, 7, 8 })
    local g = ffi.new("float[8]", { 1, 1, 1, 1, 1, 1, 1, 1 })
    assert.equal(0, C.mu_engine_add_param(e, "tok_embed", C.MU_F32, 2, shape, w, g))
    -- the same pointer, and a buffer starting inside it
    assert.equal(C.MU_EINVAL, C.mu_engine_add_param(e, "lm_head", C.MU_F32, 2, shape, w, g + 4))
    local msg = ffi.string(C.mu_engine_error(e))
    assert.truthy(msg:find("parameter 'lm_head': its value overlaps the value of parameter 'tok_embed'", 1, true), msg)
    assert.equal(C.MU_EINVAL, C.mu_engine_add_param(e, "shifted", C.MU_F32, 2, shape, w + 3, g + 4))
    msg = ffi.string(C.mu_engine_error(e))
    assert.truthy(msg:find("parameter 'shifted': its value overlaps the value of parameter 'tok_embed'", 1, true), msg)
    assert.equal(C.MU_EINVAL, C.mu_engine_add_param(e, "gshared", C.MU_F32, 2, shape, w + 4, g + 2))
    msg = ffi.string(C.mu_engine_error(e))
    assert.truthy(msg:find("parameter 'gshared': its grad overlaps the grad of parameter 'tok_embed'", 1, true), msg)
    -- the second halves are free: nothing of the refused calls was registered
    assert.equal(0, C.mu_engine_add_param(e, "second", C.MU_F32, 2, shape, w + 4, g + 4))
    os.remove(path)
  end)
end)
