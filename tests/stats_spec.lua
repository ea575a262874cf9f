-- The step's measurements (eng:stats(), muon.step_stats), each against an
-- independent computation: the Newton-Schulz residual against the singular
-- values (Jacobi, double) of the iterate the last step starts from, the
-- update RMS against the parameters' change, the gradient norm against a
-- sum in Lua; times summing to at most the step's; the config's log file.
local H = require("helpers")
local ffi = require("ffi")
local T = H.muon.tensor
local ns = require("muon.ns")
local engine = require("muon.engine")
local R = require("ref_muon")
local C = require("muon.core").C

-- sqrt(mean (s^2 - 1)^2) over the singular values of rows.
local function residual_of(rows)
  local sv, s = R.singular_values(rows), 0
  for _, x in ipairs(sv) do s = s + (x * x - 1) ^ 2 end
  return math.sqrt(s / #sv), sv
end

local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-300) end

-- The first k triples of a variant's steps-step schedule.
local function prefix(variant, steps, k)
  local all, out = ns.coefficients(variant, steps), {}
  for i = 1, k do out[i] = all[i] end
  return out
end

describe("the Newton-Schulz residual", function()
  for _, dt in ipairs({ "float64", "float32" }) do
    for _, case in ipairs({ { { 24, 40 }, "asym5", 5 }, { { 40, 24 }, "asym5", 5 }, { { 30, 30 }, "legacy", 3 },
      { { 16, 48 }, "asym5", 1 } }) do
      local shape, variant, steps = case[1], case[2], case[3]
      it(("%s %dx%d %s, %d steps: ||A - I||_F / sqrt(n) of the last step's Gram, as the SVD of the iterate it starts "
        .. "from gives; the output is that step's polynomial of those singular values"):format(dt, shape[1], shape[2],
        variant, steps), function()
        local x = T.randn(shape, 7, dt)
        local out = T.zeros(shape, dt)
        local ws = ns.workspace(dt, shape[1], shape[2])
        local opts = ns.resolve({ steps = steps, variant = variant })
        ns.zeropower_into(out, x, opts, ws)
        local st = ns.workspace_stats(ws, true)
        assert.are.equal(1, st.matrices)
        assert.are.equal(1, st.residuals)
        local coeffs = ns.coefficients(variant, steps)
        local want, sv = residual_of(R.ns(x:to("float64"):totable(), prefix(variant, steps, steps - 1), 1e-10, 1))
        assert.truthy(rel(st.residual_max, want) < (dt == "float64" and 1e-9 or 2e-4),
          ("residual %.10g, SVD %.10g"):format(st.residual_max, want))
        assert.truthy(rel(st.residual_rms, st.residual_max) < 1e-12) -- (one matrix)
        -- the last step maps each s to a s + b s^3 + c s^5: the output's singular values
        local c = coeffs[steps]
        local mapped = {}
        for i, s in ipairs(sv) do mapped[i] = c[1] * s + c[2] * s ^ 3 + c[3] * s ^ 5 end
        table.sort(mapped)
        local got = R.singular_values(out:to("float64"):totable())
        for i = 1, #got do
          assert.truthy(math.abs(got[i] - mapped[i]) < (dt == "float64" and 1e-9 or 1e-4), ("%d: %.8g vs %.8g"):format(i,
            got[i], mapped[i]))
        end
        assert.are.equal(0, ns.workspace_stats(ws).matrices) -- (reset)
      end)
    end
  end

  it("over a batch and a many-call: the max and the RMS of the matrices' residuals; none for bfloat16, gram, 0 steps",
    function()
      local x = T.randn({ 3, 12, 20 }, 3)
      local ws = ns.workspace("float32", 12, 20)
      ns.zeropower_into(T.zeros({ 3, 12, 20 }), x, ns.resolve({ steps = 5 }), ws)
      local st = ns.workspace_stats(ws, true)
      local r = {}
      for i = 1, 3 do
        r[i] = residual_of(R.ns(x:select(1, i):to("float64"):totable(), prefix("asym5", 5, 4), 1e-10, 1))
      end
      assert.are.equal(3, st.residuals)
      assert.truthy(rel(st.residual_max, math.max(r[1], r[2], r[3])) < 2e-4)
      assert.truthy(rel(st.residual_rms, math.sqrt((r[1] ^ 2 + r[2] ^ 2 + r[3] ^ 2) / 3)) < 2e-4)
      for _, o in ipairs({ { steps = 0 }, { steps = 5, method = "gram" }, { steps = 5, dtype = "bfloat16" } }) do
        local ok = pcall(ns.zeropower_into, T.zeros({ 3, 12, 20 }), x, ns.resolve(o), ws)
        if ok then
          local s = ns.workspace_stats(ws, true)
          assert.are.equal(3, s.matrices)
          assert.are.equal(0, s.residuals)
          assert.is_nil(s.residual_max)
        end
      end
    end)
end)

-- An engine on float64 parameters: Muon for the matrices, AdamW for the rest.
local function engine64(extra)
  local cfg = { groups = { { name = "hidden", min_dim = 2, weight_decay = 0 },
    { name = "rest", optimizer = "adamw", weight_decay = 0 } } }
  for k, v in pairs(extra or {}) do cfg[k] = v end
  local eng = engine.new(cfg)
  local ps = {}
  for i, s in ipairs({ { 12, 20 }, { 20, 8 }, { 2, 6, 5 }, { 20 } }) do
    local v = T.randn(s, i, "float64")
    eng:add_param("p" .. i, v, T.randn(s, 100 + i, "float64"))
    ps[i] = v
  end
  return eng, ps
end

local function sumsq(t)
  local s = 0
  for _, x in ipairs(t:contiguous():view({ t:numel() }):totable()) do s = s + x * x end
  return s
end

describe("eng:stats() after a step", function()
  it("update_rms per group: the RMS of the parameters' change over alpha (-lr for Muon, 1 for AdamW)", function()
    local eng, ps = engine64()
    for step = 1, 3 do
      local before = {}
      for i, v in ipairs(ps) do before[i] = v:clone() end
      eng:step()
      local s = eng:stats()
      local groups = { hidden = { 1, 2, 3 }, rest = { 4 } }
      local alpha = { hidden = -eng:get("lr:hidden"), rest = 1 }
      for g, list in pairs(groups) do
        local ss, n = 0, 0
        for _, i in ipairs(list) do
          ss, n = ss + sumsq(T.sub(ps[i], before[i])), n + ps[i]:numel()
        end
        local want = math.sqrt(ss / n) / math.abs(alpha[g])
        assert.truthy(rel(s.update_rms[g], want) < 1e-9, ("step %d %s: %.12g vs %.12g"):format(step, g, s.update_rms[g],
          want))
      end
      assert.truthy(math.abs(s.update_rms.hidden - 0.2) < 0.02) -- (matched_adamw_rms)
    end
  end)

  it("grad_norm: sqrt of the sum of every gradient's squares; ns_residual: the NS input's residual", function()
    local eng = engine64()
    eng:step()
    local ss = 0
    for i = 1, 4 do ss = ss + sumsq(eng:param("p" .. i).grad) end
    assert.truthy(rel(eng:stats().grad_norm, math.sqrt(ss)) < 1e-12)
    -- the first step's Newton-Schulz input is (1 + momentum) g (Nesterov, zero buffer): its residual
    local worst = 0
    local g3 = eng:param("p3").grad
    for _, g in ipairs({ eng:param("p1").grad, eng:param("p2").grad, g3:select(1, 1), g3:select(1, 2) }) do
      worst = math.max(worst, (residual_of(R.ns(g:totable(), prefix("asym5", 5, 4), 1e-10, 1))))
    end
    local s = eng:stats()
    assert.are.equal(4, s.ns_matrices)
    assert.truthy(rel(s.ns_residual, worst) < 1e-8, ("%.12g vs %.12g"):format(s.ns_residual, worst))
    assert.truthy(s.ns_residual_rms <= s.ns_residual)
  end)

  it("times: Newton-Schulz and hooks are within the step's time; a hook's time shows", function()
    local eng = engine64({ hooks = { post_ortho_fn = function(O)
      local x = 0
      for i = 1, 2e5 do x = x + i end
      O:mul(1 + x * 0)
    end } })
    for _ = 1, 3 do
      eng:step()
      local s = eng:stats()
      assert.truthy(s.ns_seconds > 0 and s.hook_seconds > 0, s.ns_seconds .. " " .. s.hook_seconds)
      assert.truthy(s.ns_seconds + s.hook_seconds <= s.step_seconds,
        ("ns %g + hooks %g > step %g"):format(s.ns_seconds, s.hook_seconds, s.step_seconds))
      assert.are.equal(0, s.bytes_sent + s.bytes_recv) -- (one process)
    end
  end)

  it("from C: mu_engine_get \"stats.*\" keys, NaN before the first step", function()
    local path = H.config_file("return { groups = { { name = 'hidden', min_dim = 2 }, { name = 'rest', "
      .. "optimizer = 'adamw' } } }\n")
    local rc, ce = H.c_engine_open(path)
    assert.are.equal(0, rc)
    local w, g = ffi.new("float[24]"), ffi.new("float[24]")
    for i = 0, 23 do w[i], g[i] = math.sin(i), math.cos(3 * i) end
    local shape = ffi.new("int64_t[2]", 4, 6)
    assert.are.equal(0, C.mu_engine_add_param(ce, "w", C.MU_F32, 2, shape, w, g))
    local v = ffi.new("double[1]")
    assert.are.equal(0, C.mu_engine_get(ce, "stats.grad_norm", v))
    assert.truthy(v[0] ~= v[0])
    assert.are.equal(0, C.mu_engine_step(ce))
    local ss = 0
    for i = 0, 23 do ss = ss + g[i] * g[i] end
    assert.are.equal(0, C.mu_engine_get(ce, "stats.grad_norm", v))
    assert.truthy(rel(v[0], math.sqrt(ss)) < 1e-6)
    for _, k in ipairs({ "stats.step_seconds", "stats.ns_seconds", "stats.ns_residual", "stats.update_rms:hidden",
      "stats.update_rms:1" }) do
      assert.are.equal(0, C.mu_engine_get(ce, k, v))
      assert.truthy(v[0] > 0, k)
    end
    assert.are.equal(0, C.mu_engine_get(ce, "stats.update_rms:rest", v))
    assert.truthy(v[0] ~= v[0]) -- (no parameter in it)
    assert.are.equal(-1, C.mu_engine_get(ce, "stats.nope", v))
    H.has(ffi.string(C.mu_engine_error(ce)), "stats.update_rms:<group>")
    os.remove(path)
  end)
end)

describe("the config's log", function()
  it("writes a CSV row every N steps (header first; appended to), and JSON lines", function()
    local dir = H.tmpdir()
    local file = dir .. "/stats.csv"
    local eng = engine64({ log = { every = 2, file = file } })
    local rows = {}
    for step = 1, 5 do
      eng:step()
      if step % 2 == 0 then rows[#rows + 1] = eng:stats() end
    end
    local lines = {}
    for l in H.read_file(file):gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(3, #lines)
    assert.are.equal("step,lr:hidden,lr:rest,step_seconds,ns_seconds,hook_seconds,grad_norm,update_rms:hidden,"
      .. "update_rms:rest,ns_residual,ns_residual_rms,ns_matrices,bytes_sent,bytes_recv", lines[1])
    for i, s in ipairs(rows) do
      local f = {}
      for x in (lines[i + 1] .. ","):gmatch("([^,]*),") do f[#f + 1] = x end
      assert.are.equal(tostring(2 * i), f[1])
      assert.truthy(rel(tonumber(f[7]), s.grad_norm) < 1e-8)
      assert.truthy(rel(tonumber(f[8]), s.update_rms.hidden) < 1e-8)
      assert.truthy(rel(tonumber(f[10]), s.ns_residual) < 1e-8)
    end
    local e2 = engine64({ log = { every = 1, file = dir .. "/stats.jsonl" } })
    e2:step()
    local text = H.read_file(dir .. "/stats.jsonl")
    assert.truthy(text:match('^{"step":1,"lr:hidden":0.02,'), text)
    assert.truthy(text:find('"update_rms:rest":', 1, true), text)
    H.rmrf(dir)
  end)

  it("a sandboxed config writes below the working directory only; bad keys and values are named", function()
    local path = H.config_file("return { groups = { {} }, log = { every = 1, file = '/tmp/x.csv' } }\n")
    local ok, err = pcall(engine.new, path)
    assert.is_false(ok)
    H.has(err, "log.file = \"/tmp/x.csv\": a sandboxed config writes its log below the working directory")
    assert.truthy(pcall(engine.new, path, { trusted = true }))
    os.remove(path)
    for _, c in ipairs({
      { { every = 0, file = "x" }, "log.every must be an integer >= 1 (steps), got 0" },
      { { every = 2 }, "log.every needs log.file" },
      { { level = "verbose" }, "log.level must be 'error', 'warn', 'info' or 'debug', got the string \"verbose\"" },
      { { evry = 2 }, "log: unknown log key 'evry' (did you mean 'every'?)" },
      { { format = "tsv", file = "x" }, "log.format must be 'csv' or 'jsonl'" },
    }) do
      local ok2, err2 = pcall(engine.new, { groups = { {} }, log = c[1] })
      assert.is_false(ok2)
      H.has(err2, c[2])
    end
  end)
end)
