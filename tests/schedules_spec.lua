-- muon.schedules: values at the phase boundaries computed by hand, bad
-- arguments, and the schedules inside configs (sandboxed, and opened
-- through the C API as a C trainer does).
local ffi = require("ffi")
local H = require("helpers")
local T = H.T
local S = require("muon.schedules")
local engine = require("muon.engine")
local C = require("muon.core").C

local function lr(f, step) return f(step, { base_lr = 2 }).lr end

local function near(want, got, what)
  assert(math.abs(got - want) <= 1e-15 * math.abs(want), ("%s: %.17g, expected %.17g"):format(what, got, want))
end

describe("schedules.wsd (warmup-stable-decay)", function()
  it("warms up linearly from 0, holds, then decays to min_ratio (cosine by default)", function()
    local f = S.wsd(10, 20, 10, 0.1)
    local cases = {
      { 0, 0 }, { 1, 0.2 }, { 5, 1 }, { 10, 2 },                 -- warmup: 2 * s / 10
      { 11, 2 }, { 30, 2 },                                      -- stable
      { 31, 2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 10))) }, -- decay, p = 1/10
      { 35, 2 * 0.55 }, { 40, 0.2 },                             -- p = 1/2; p = 1: min_ratio
      { 41, 0.2 }, { 1e6, 0.2 },                                 -- after
    }
    for _, c in ipairs(cases) do near(c[2], lr(f, c[1]), "step " .. c[1]) end
    assert.equal(0.2, lr(f, 40)) -- exactly min_ratio at the last decay step
    assert.equal(2, lr(f, 10))
  end)

  it("linear and sqrt decay shapes", function()
    local lin, sq = S.wsd(10, 20, 10, 0.1, "linear"), S.wsd(10, 20, 10, 0.1, "sqrt")
    near(2 * (0.1 + 0.9 * 0.9), lr(lin, 31), "linear p = 0.1")
    near(2 * 0.55, lr(lin, 35), "linear p = 0.5")
    near(2 * (0.1 + 0.9 * (1 - math.sqrt(0.5))), lr(sq, 35), "sqrt p = 0.5")
    near(2 * (0.1 + 0.9 * (1 - math.sqrt(0.1))), lr(sq, 31), "sqrt p = 0.1")
    assert.equal(0.2, lr(lin, 40))
    assert.equal(0.2, lr(sq, 40))
  end)

  it("edge phases: no warmup, no decay, an endless stable phase, min_ratio 0 and 1", function()
    assert.equal(2, lr(S.wsd(0, 5, 5, 0.5), 1))
    local f = S.wsd(2, 3, 0, 0.25)
    assert.equal(2, lr(f, 5))
    assert.equal(0.5, lr(f, 6)) -- no decay steps: min_ratio right after the stable phase
    assert.equal(2, lr(S.wsd(2, math.huge, 10, 0.1), 1e12))
    assert.equal(0, lr(S.wsd(1, 1, 2, 0), 4))
    assert.equal(2, lr(S.wsd(1, 1, 2, 1), 3))
  end)

  it("refuses bad arguments, naming them, at the caller's line", function()
    local cases = {
      { { -1, 1, 1, 0 }, "wsd: warmup must be a number >= 0, got -1" },
      { { 1, 0 / 0, 1, 0 }, "wsd: stable must be a number >= 0, got nan" },
      { { 1, 1, "5", 0 }, "wsd: decay must be a number >= 0, got the string \"5\"" },
      { { 1, 1, 1, 1.5 }, "wsd: min_ratio must be a number in [0, 1], got 1.5" },
      { { 1, 1, 1 }, "wsd: min_ratio must be a number in [0, 1], got nil" },
      { { 1, 1, 1, 0, "cosin" }, "wsd: unknown shape 'cosin' (did you mean 'cosine'?); valid shapes: cosine, linear, sqrt" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(S.wsd, unpack(c[1], 1, 5))
      assert.is_false(ok)
      local msg = tostring(err)
      assert.truthy(msg:find(c[2], 1, true), msg)
    end
    local ok, err = pcall(function()
      local f = S.wsd(-1, 1, 1, 0) -- (not a tail call: this frame is the caller)
      return f
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("^tests/schedules_spec.lua:%d+: wsd: warmup"), tostring(err))
    assert.equal(H.muon.errors.EINVAL, err.code)
  end)
end)

describe("schedules in configs", function()
  -- base lr 0.08, wsd(2, 1, 2, 0.25): steps 1..6 give 0.04, 0.08, 0.08,
  -- 0.08 * (0.25 + 0.75 * 0.5), 0.02, 0.02 (cosine at p = 1/2, then 1)
  local WANT = { 0.04, 0.08, 0.08, 0.08 * 0.625, 0.02, 0.02 }
  local CONFIG = [[
local schedules = require('muon.schedules')
return { groups = { { optimizer = 'adamw', lr = 0.08 } }, schedule = schedules.wsd(2, 1, 2, 0.25) }
]]

  it("a sandboxed config schedules its lr with wsd", function()
    local path = H.tmpname(".lua")
    H.write_file(path, CONFIG)
    local eng = engine.new(path)
    os.remove(path)
    eng:add_param("w", T.zeros({ 3 }), T.ones({ 3 }))
    for step, want in ipairs(WANT) do
      eng:step()
      near(want, eng:get("lr"), "step " .. step)
    end
  end)

  it("and so does a C trainer opening that config", function()
    local path = H.tmpname(".lua")
    H.write_file(path, CONFIG)
    local box = ffi.new("mu_engine *[1]")
    assert.equal(0, C.mu_engine_open(box, path), ffi.string(C.mu_last_error()))
    os.remove(path)
    local eng = ffi.gc(box[0], C.mu_engine_close)
    local w, g = ffi.new("float[3]"), ffi.new("float[3]", { 1, 1, 1 })
    assert.equal(0, C.mu_engine_add_param(eng, "w", C.MU_F32, 1, ffi.new("int64_t[1]", 3), w, g))
    local v = ffi.new("double[1]")
    for step, want in ipairs(WANT) do
      assert.equal(0, C.mu_engine_step(eng), ffi.string(C.mu_engine_error(eng)))
      assert.equal(0, C.mu_engine_get(eng, "lr", v))
      near(want, v[0], "C step " .. step)
    end
  end)

  it("a sandboxed config's bad wsd argument is an error naming it", function()
    local path = H.tmpname(".lua")
    H.write_file(path, "local s = require('muon.schedules')\nreturn { groups = { {} }, schedule = s.wsd(1, 1, 1, 3) }")
    local ok, err = pcall(engine.new, path)
    os.remove(path)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("config '" .. path .. "'", 1, true), tostring(err))
    assert.truthy(tostring(err):find("wsd: min_ratio must be a number in [0, 1], got 3", 1, true), tostring(err))
  end)
end)
