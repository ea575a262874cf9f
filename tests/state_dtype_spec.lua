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
local stderr_of = H.stderr_of

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

describe("state_dtype (the other kinds, hooks, readers)", function()
  it("keeps Lion's exp_avg in bfloat16: m is the float32 run's within bfloat16 rounding, bytes halved", function()
    local function run(sd)
      local eng = engine.new({ groups = { { optimizer = "lion", lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1,
        state_dtype = sd } } })
      local ps = params(3)
      for _, p in ipairs(ps) do eng:add_param(p.name, p.value, p.grad) end
      for _ = 1, 4 do eng:step() end
      return eng, ps
    end
    local e32, p32 = run("float32")
    local e16, p16 = run("bfloat16")
    local n = 0
    for i = 1, #SHAPES do
      local m32, m16 = e32:state(p32[i].name).exp_avg, e16:state(p16[i].name).exp_avg
      assert.are.equal("bfloat16", m16:dtype())
      assert.are.equal("float32", m32:dtype())
      -- the same gradient every step: m_k = (1 - 0.99^k) g, each rounding at most 2^-9 relative, 4 steps
      assert.is_true(max_diff(m16, m32) <= 4 * 2 ^ -8 * m32:abs():amax(), p16[i].name)
      assert.is_true(max_diff(m16, m32) > 0 or i > 1, "bfloat16 rounding shows in m")
      n = n + m32:numel()
    end
    assert.are.equal(4 * n, e32:memory().state_bytes)
    assert.are.equal(2 * n, e16:memory().state_bytes)
    -- one-process class
    local p = muon.param("w", T.randn({ 6, 5 }, 1), T.randn({ 6, 5 }, 2))
    local opt = muon.optim.Lion({ p }, { lr = 1e-3, state_dtype = "bfloat16" })
    opt:step()
    assert.are.equal("bfloat16", opt.state[p].exp_avg:dtype())
    -- after one step m = (1 - beta2) g, rounded once
    H.assert_equal_bits(opt.state[p].exp_avg, p.grad:clone():mul_(1 - 0.99):clone("bfloat16"), "m after one step")
  end)

  it("keeps hook state in the parameter's float32 (hooks write it in place), the kind's state in bfloat16", function()
    local seen = {}
    local eng = engine.new({ groups = { { optimizer = "muon", state_dtype = "bfloat16",
      hook_state = { L = "rows_rows" },
      pre_ortho_fn = function(_, state) state.L:add_(1 / 3); seen.dtype = state.L:dtype() end } } })
    eng:add_param("w", T.randn({ 5, 3 }, 1), T.randn({ 5, 3 }, 2))
    eng:step()
    eng:step()
    assert.are.equal("float32", seen.dtype)
    assert.are.equal("float32", eng:state("w")["hook.L"]:dtype())
    H.assert_equal_bits(eng:state("w")["hook.L"], T.full({ 5, 5 }, 1 / 3):add_(1 / 3), "L kept in float32")
    assert.are.equal("bfloat16", eng:state("w").momentum_buffer:dtype())
    assert.are.equal(2 * 15 + 4 * 25, eng:memory().state_bytes)
  end)

  it("AdamW's one-process class: bfloat16 moments, half the bytes, state_dict loads convert either way", function()
    local p = muon.param("w", T.randn({ 4, 6 }, 1), T.randn({ 4, 6 }, 2))
    local a = muon.optim.AdamW({ p }, { state_dtype = "bfloat16" })
    a:step()
    assert.are.equal("bfloat16", a.state[p].exp_avg:dtype())
    assert.are.equal("bfloat16", a.state[p].exp_avg_sq:dtype())
    assert.are.equal(2 * 2 * 24, a:memory().state_bytes)
    -- after one step: exp_avg = (1 - beta1) g, rounded once
    H.assert_equal_bits(a.state[p].exp_avg, p.grad:clone():mul_(1 - 0.9):clone("bfloat16"), "exp_avg")
    local q = muon.param("w", T.randn({ 4, 6 }, 1), T.randn({ 4, 6 }, 2))
    local b = muon.optim.AdamW({ q }, {})
    b:load_state_dict(a:state_dict())
    assert.are.equal("float32", b.state[q].exp_avg:dtype())
    H.assert_equal_bits(b.state[q].exp_avg_sq, a.state[p].exp_avg_sq:clone("float32"), "widened")
    assert.are.equal(4 * 2 * 24, b:memory().state_bytes)
    local c = muon.optim.AdamW({ q }, { state_dtype = "bfloat16" })
    c:load_state_dict(b:state_dict())
    H.assert_equal_bits(c.state[q].exp_avg, a.state[p].exp_avg, "narrowed back")
  end)

  it("writes BF16 checkpoint tensors that an independent reader (python + torch) decodes to the state", function()
    local py = "/usr/bin/python3"
    if os.execute(py .. " -c 'import torch' >/dev/null 2>&1") ~= 0 then
      pending("needs /usr/bin/python3 with torch")
      return
    end
    local path = H.tmpname(".safetensors")
    local eng = new_engine("bfloat16")
    for _ = 1, 3 do eng:step() end
    eng:save(path)
    -- plain header parse + torch.frombuffer; and the safetensors package's
    -- reader when it is importable (Debian has no python3-safetensors)
    local out = io.popen(py .. [==[ -c "
import json, struct, sys, torch
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
try:
    from safetensors.torch import load_file
    st = load_file(sys.argv[1])
except ImportError:
    st = None
for k in sorted(h):
    if k == '__metadata__' or h[k]['dtype'] != 'BF16': continue
    e = h[k]; d = b[8 + n + e['data_offsets'][0]:8 + n + e['data_offsets'][1]]
    t = torch.frombuffer(bytearray(d), dtype=torch.bfloat16).reshape(e['shape'])
    if st is not None: assert torch.equal(st[k], t), k
    print(k, 'x'.join(str(s) for s in e['shape']), ' '.join(repr(v) for v in t.double().flatten().tolist()))
" ]==] .. path .. " 2>&1")
    local text = out:read("*a")
    out:close()
    local seen = 0
    for line in text:gmatch("[^\n]+") do
      local name, shape, vals = line:match("^(%S+) (%S+) (.*)$")
      assert.truthy(name, text)
      local pname, key = name:match("([^/]+)/([%w_]+)$")
      local s = eng:state(pname)[key]
      assert.truthy(s, name)
      assert.are.equal("bfloat16", s:dtype())
      assert.are.equal(table.concat(s:size(), "x"), shape)
      local got = {}
      for v in vals:gmatch("%S+") do got[#got + 1] = tonumber(v) end
      assert.are.same(s:clone("float64"):flat(), got, name)
      seen = seen + 1
    end
    assert.are.equal(4, seen, text)
    os.remove(path)
  end)
end)

-- Every state tensor a step writes is checked as stored: a value float32
-- keeps finite (up to 3.4028e38) rounds to Inf in bfloat16 above 3.3962e38.
describe("state_dtype: nothing non-finite is committed or loaded", function()
  local E = require("muon.errors")

  local function snapshot(eng, name) return H.engine_bits(eng, { name }) end

  local function all_state_finite(eng, name)
    for k, v in pairs(eng:state(name) or {}) do
      if T.is_tensor(v) and not v:all_finite() then return false, k end
    end
    return true
  end

  it("a step whose state would round to NaN/Inf (any kind, state dtype, policy) fails or skips, changing nothing",
    function()
    local kinds = {
      { optimizer = "muon" }, { optimizer = "muon", nesterov = false },
      { optimizer = "muon", momentum = { 0.5, 0.99 }, nesterov = false },
      { optimizer = "adamw" }, { optimizer = "adamw", betas = { 0, 0 } },
      { optimizer = "lion" }, { optimizer = "lion", betas = { 0.9, 0 } }, { optimizer = "lion", betas = { 0, 0 } },
    }
    -- gradients finite in float32: above bfloat16's range, near float32's, and ordinary
    local grads = { 3.397e38, -3.4028e38, 1e-3, 2.5e38, 3.3e38, 1 }
    local path = H.tmpname(".safetensors")
    local failed, skipped = 0, 0
    for _, k in ipairs(kinds) do
      for _, sd in ipairs({ "float32", "bfloat16" }) do
        for _, policy in ipairs({ "error", "skip" }) do
          local g = { state_dtype = sd, nonfinite = policy, lr = 1e-3 }
          for key, v in pairs(k) do g[key] = v end
          local eng = engine.new({ groups = { g } })
          local grad = T.zeros({ 4, 3 })
          eng:add_param("w", T.randn({ 4, 3 }, 1), grad)
          local label = ("%s %s %s"):format(require("muon.optim.kind").serialize(k), sd, policy)
          for _, gv in ipairs(grads) do
            grad:copy(T.randn({ 4, 3 }, 7):sign():mul(gv))
            local before = snapshot(eng, "w")
            local skips = eng:stats()[g.optimizer].skipped_nonfinite
            local ok, err = pcall(eng.step, eng)
            if not ok then
              failed = failed + 1
              assert.equal(E.ENONFINITE, E.code(err), label .. ": " .. tostring(err))
              assert.equal("error", policy, label .. ": " .. tostring(err))
              assert.equal(before, snapshot(eng, "w"), label)
            elseif eng:stats()[g.optimizer].skipped_nonfinite > skips then
              skipped = skipped + 1
              assert.equal(before:gsub("^%d+;", ""), snapshot(eng, "w"):gsub("^%d+;", ""), label)
            end
            local fin, key = all_state_finite(eng, "w")
            assert.is_true(fin, label .. ": state " .. tostring(key) .. " holds NaN or Inf after gradient " .. gv)
            assert.is_true(eng:param("w").value:all_finite(), label)
            eng:save(path) -- (a save refuses non-finite state)
          end
        end
      end
    end
    os.remove(path)
    -- (the class is exercised: both policies met such steps)
    assert.is_true(failed > 10 and skipped > 10, ("failed %d, skipped %d"):format(failed, skipped))
  end)

  -- A float32 AdamW checkpoint of w (4x3) whose state is set by edit(state).
  local function checkpoint(edit)
    local eng = engine.new({ groups = { { optimizer = "adamw" } } })
    eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
    eng:step()
    edit(eng:state("w"))
    local path = H.tmpname(".safetensors")
    eng:save(path)
    return path
  end

  it("a loaded checkpoint is checked as the group keeps it (converted) and against the kind's invariants", function()
    local cases = {
      { "above bfloat16's range", function(s) s.exp_avg:set(3.397e38, 2, 2) end, "bfloat16",
        "state tensor 'adamw/w/exp_avg' holds NaN or Inf once converted from float32 to bfloat16 (the group's "
        .. "state_dtype)" },
      { "-3.4e38 into bfloat16", function(s) s.exp_avg:set(-3.4e38, 1, 3) end, "bfloat16", "holds NaN or Inf once" },
      { "a negative exp_avg_sq", function(s) s.exp_avg_sq:set(-2.5, 2, 3) end, "float32",
        "state tensor 'adamw/w/exp_avg_sq' holds -2.5 (element 6), below 0, which AdamW's exp_avg_sq never is" },
      { "a tiny negative exp_avg_sq, bfloat16", function(s) s.exp_avg_sq:set(-1e-30, 4, 3) end, "bfloat16",
        "(element 12), below 0" },
    }
    for _, c in ipairs(cases) do
      local path = checkpoint(c[2])
      for _, checksum in ipairs({ true, false }) do
        local eng = engine.new({ groups = { { optimizer = "adamw", state_dtype = c[3] } } })
        eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
        local ok, err = pcall(eng.load, eng, path, { checksum = checksum })
        assert.is_false(ok, c[1])
        assert.equal(E.EFORMAT, E.code(err), c[1])
        assert.truthy(tostring(err):find("checkpoint '" .. path .. "': " .. (c[4]:find("^state") and c[4] or ""), 1,
          true), tostring(err))
        assert.truthy(tostring(err):find(c[4], 1, true), tostring(err))
        assert.equal(0, eng:get("step"))
        assert.is_nil(eng:state("w"))
      end
      -- the one-process class's load_state_dict says the same
      local opt = muon.optim.AdamW({ muon.param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2)) },
        { state_dtype = c[3] })
      opt:step()
      local d = opt:state_dict()
      local s = d.state.w
      s.exp_avg, s.exp_avg_sq = s.exp_avg:clone("float32"), s.exp_avg_sq:clone("float32")
      c[2](s)
      local before = opt.state[opt.param_groups[1].params[1]].exp_avg:clone("float64"):flat()
      local ok, err = pcall(opt.load_state_dict, opt, d)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("state dict: state tensor 'w/exp_avg", 1, true), tostring(err))
      assert.same(before, opt.state[opt.param_groups[1].params[1]].exp_avg:clone("float64"):flat())
      os.remove(path)
    end
    -- values at the edge load: -0 in exp_avg_sq, bfloat16's largest finite value
    local path = checkpoint(function(s)
      s.exp_avg_sq:set(-0.0, 1, 1)
      s.exp_avg:set(3.3895e38, 1, 1)
    end)
    for _, sd in ipairs({ "float32", "bfloat16" }) do
      local eng = engine.new({ groups = { { optimizer = "adamw", state_dtype = sd } } })
      eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
      H.stderr_of(function() eng:load(path) end)
      assert.equal(1, eng:get("step"))
    end
    os.remove(path)
  end)
end)
