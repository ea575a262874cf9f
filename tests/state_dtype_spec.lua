-- state_dtype = "bfloat16" (any group): the kinds' state tensors (Muon's
-- momentum_buffer, AdamW's exp_avg/exp_avg_sq, Lion's exp_avg) stored in
-- bfloat16 beside float32 parameters: the maths stay float32 (the steps are
-- the float32 state's when the state is exactly representable, and within
-- bfloat16 rounding of it otherwise), half the state bytes, atomic steps,
-- BF16 checkpoints that load into either dtype with one note.
local H = require("helpers")
local T = H.T
local muon = H.muon
local engine = require("muon.engine")

local SHAPES = { { 16, 8 }, { 8, 24 }, { 33 } }

local function params(seed)
  local ps = {}
  for i, s in ipairs(SHAPES) do
    ps[i] = muon.param(("p%d"):format(i), T.randn(s, seed + i), T.randn(s, seed + 10 + i))
  end
  return ps
end

local function new_engine(sd, kind)
  local groups = {
    { optimizer = kind or "muon", match = "^p[12]", lr = 0.02, state_dtype = sd },
    { optimizer = "adamw", lr = 1e-2, betas = { 0.9, 0.95 }, weight_decay = 0.1, state_dtype = sd },
  }
  local eng = engine.new({ groups = groups })
  local ps = params(0)
  for _, p in ipairs(ps) do eng:add_param(p.name, p.value, p.grad) end
  return eng, ps
end

-- What fn writes to stderr (io.stderr:write calls).
local function stderr_of(fn)
  local lines, saved = {}, io.stderr
  io.stderr = { write = function(_, ...) for _, x in ipairs({ ... }) do lines[#lines + 1] = x end end } -- luacheck: ignore 122
  local ok, err = pcall(fn)
  io.stderr = saved -- luacheck: ignore 122
  if not ok then error(err, 0) end
  return table.concat(lines)
end

local function max_diff(a, b) return a:clone("float64"):sub(b:clone("float64")):abs():amax() end

describe("state_dtype", function()
  it("keeps the kinds' state in bfloat16 and steps within bfloat16 rounding of float32 state", function()
    local e32, p32 = new_engine("float32")
    local e16, p16 = new_engine("bfloat16")
    for _ = 1, 5 do
      e32:step()
      e16:step()
    end
    assert.are.equal("bfloat16", e16:state("p1").momentum_buffer:dtype())
    assert.are.equal("bfloat16", e16:state("p3").exp_avg:dtype())
    assert.are.equal("bfloat16", e16:state("p3").exp_avg_sq:dtype())
    assert.are.equal("float32", e32:state("p3").exp_avg:dtype())
    for i = 1, #SHAPES do
      local d = max_diff(p16[i].value, p32[i].value)
      assert.is_true(d > 0, "bfloat16 state changes the trajectory")
      assert.is_true(d < 5 * 2 ^ -8 * 0.02 * 5, ("p%d differs by %g"):format(i, d))
    end
    -- the momentum buffer is the float32 one rounded, step by step: within 2^-8 relative
    local b32, b16 = e32:state("p1").momentum_buffer, e16:state("p1").momentum_buffer
    assert.is_true(max_diff(b16, b32) <= 2 ^ -7 * b32:abs():amax())
  end)

  it("halves the state bytes", function()
    local e32 = new_engine("float32")
    local e16 = new_engine("bfloat16")
    e32:step()
    e16:step()
    local n = 0
    for _, s in ipairs(SHAPES) do
      local k = 1
      for _, d in ipairs(s) do k = k * d end
      n = n + k * (#s == 1 and 2 or 1) -- AdamW keeps two moments, Muon one
    end
    assert.are.equal(4 * n, e32:memory().state_bytes)
    assert.are.equal(2 * n, e16:memory().state_bytes)
    assert.are.equal(2 * n, e16:get("state_bytes"))
  end)

  it("is atomic: a failed step leaves the bfloat16 state as it was", function()
    local eng, ps = new_engine("bfloat16")
    eng:step()
    local before = eng:state("p1").momentum_buffer:clone()
    local m = eng:state("p3").exp_avg:clone()
    ps[3].grad:set(0 / 0, 5)
    assert.is_false((pcall(eng.step, eng)))
    H.assert_equal_bits(eng:state("p1").momentum_buffer, before, "momentum")
    H.assert_equal_bits(eng:state("p3").exp_avg, m, "exp_avg")
  end)

  it("saves BF16 checkpoints that load into bfloat16 and float32 groups, with one note", function()
    local path = H.tmpname(".safetensors")
    local e16 = new_engine("bfloat16")
    e16:step()
    e16:step()
    e16:save(path)
    local st = require("muon.safetensors")
    local dts = {}
    for _, en in ipairs(st.inspect(path).entries) do dts[en.st_dtype] = (dts[en.st_dtype] or 0) + 1 end
    assert.are.equal(4, dts.BF16) -- 2 momentum buffers, 2 AdamW moments
    -- the same dtype: bit for bit
    local a = new_engine("bfloat16")
    a:load(path)
    H.assert_equal_bits(a:state("p1").momentum_buffer, e16:state("p1").momentum_buffer, "bf16 -> bf16")
    -- into float32 state, and back: converted (exactly, widening), with a note on stderr
    local err = stderr_of(function()
      local b = new_engine("float32")
      b:load(path)
      assert.are.equal("float32", b:state("p1").momentum_buffer:dtype())
      H.assert_equal_bits(b:state("p1").momentum_buffer, e16:state("p1").momentum_buffer:clone("float32"), "widened")
      b:step()
      b:save(path)
    end)
    assert.truthy(err:find("state tensors converted to the groups' state_dtype: 4 from bfloat16 to float32", 1, true), err)
    err = stderr_of(function()
      local c = new_engine("bfloat16")
      c:load(path)
      assert.are.equal("bfloat16", c:state("p3").exp_avg_sq:dtype())
    end)
    assert.truthy(err:find("4 from float32 to bfloat16", 1, true), err)
    os.remove(path)
  end)

  it("works for the one-process classes, and refuses float64 parameters", function()
    local p = muon.param("w", T.randn({ 4, 4 }, 1), T.randn({ 4, 4 }, 2))
    local opt = muon.optim.Muon({ p }, { state_dtype = "bfloat16" })
    opt:step()
    assert.are.equal("bfloat16", opt.state[p].momentum_buffer:dtype())
    local q = muon.param("w", T.randn({ 4, 4 }, 1, "float64"), T.randn({ 4, 4 }, 2, "float64"))
    local ok, err = pcall(muon.optim.Muon, { q }, { state_dtype = "bfloat16" })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("parameter 'w' is float64: state_dtype = 'bfloat16' needs float32 parameters", 1, true), tostring(err))
    ok, err = pcall(muon.optim.Muon, { p }, { state_dtype = "float16" })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("state_dtype", 1, true), tostring(err))
  end)
end)
