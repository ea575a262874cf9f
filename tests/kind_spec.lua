-- The optimizer kind contract and the option schema (lua/muon/optim/kind.lua):
-- a kind is checked once when registered, the derived tables are what the
-- kinds declared (against hand-written lists), the canonical serialization
-- the ranks compare, the config's own keys, errors blamed on the caller's
-- line, and what memory() counts of the C workspace.
local H = require("helpers")
local T = H.T
local ffi = require("ffi")
local E = require("muon.errors")
local K = require("muon.optim.kind")
local kinds = require("muon.optim.kinds")
local O = require("muon.optim.options")
local C = require("muon.core").C
local muon = H.muon

local function raised(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err), err
end

-- A minimal valid kind (not registered: K.register is given copies).
local function toy(extra)
  local kind = { name = "adamw", class = "AdamW", state = { { "exp_avg" } },
    options = { { "lr", 1e-3, O.number(0), schedulable = true, show = 1 } },
    direction = function() end, apply_coeffs = function() return 1, 1 end }
  for k, v in pairs(extra or {}) do kind[k] = v end
  return kind
end

local function set_of(list)
  local s = {}
  for _, k in ipairs(list) do s[k] = true end
  return s
end

describe("the kind contract", function()
  it("a kind is checked once when registered: members, types, the list", function()
    assert.truthy(raised(K.register, toy({ name = "sgd" })):find("optimizer kind 'sgd' is not in muon.optim.kind's list", 1, true))
    assert.truthy(raised(K.register, toy({ class = "Adam" })):find("class must be 'AdamW'", 1, true))
    local msg = raised(K.register, toy({ direction = false }))
    assert.truthy(msg:find("member 'direction' must be a function, got boolean", 1, true), msg)
    local t = toy()
    t.apply_coeffs = nil
    assert.truthy(raised(K.register, t):find("member 'apply_coeffs' is missing", 1, true))
    msg = raised(K.register, toy({ post_updat = function() end }))
    assert.truthy(msg:find("unknown member 'post_updat' (did you mean 'post_update'?)", 1, true), msg)
    msg = raised(K.register, toy({ ns_prepare = function() end }))
    assert.truthy(msg:find("ns_prepare and ns_finish come together", 1, true), msg)
    msg = raised(K.register, toy({ options = { { "lr", 1, O.number(0), schedulabel = true } } }))
    assert.truthy(msg:find("unknown schema field 'schedulabel'", 1, true), msg)
    msg = raised(K.register, toy({ options = { { "lr", 1, O.number(0) }, { "lr", 2, O.number(0) } } }))
    assert.truthy(msg:find("option 'lr' is declared twice", 1, true), msg)
    msg = raised(K.register, toy({ state = { { "hook.x" } } }))
    assert.truthy(msg:find("state entries are", 1, true), msg)
    msg = raised(K.register, toy({ state = { { "m", min = "0" } } }))
    assert.truthy(msg:find("state entries are { key, min = number }", 1, true), msg)
    msg = raised(K.register, toy({ state = { { "m", hidden = true } } }))
    assert.truthy(msg:find("unknown state entry field 'hidden'", 1, true), msg)
  end)

  it("every member is documented; optional members are absent, never stubbed", function()
    -- every member a kind may supply or carries has an entry Kind.<name> in
    -- muon.optim.kind's reference block (tests/reference_spec.lua checks
    -- the kinds' actual members against it too)
    local R = require("muon.reference")
    local spec
    for _, m in ipairs(R.MODULES) do if m.name == "muon.optim.kind" then spec = m end end
    assert.is_table(spec, "muon.optim.kind is a reference module")
    local documented = {}
    for _, e in ipairs((R.load(spec))) do
      for _, h in ipairs(e.heads) do documented[h.key] = #e.desc end
    end
    local want = { "ENTRIES", "DEFAULTS", "OPTIONS", "SCHEDULABLE", "SCHEDULE_ORDER", "HOOKS", "DISPLAY", "SAVED", "LOAD",
      "state_keys", "state_min", "ns" }
    for _, m in ipairs(K.MEMBERS) do want[#want + 1] = m[1] end
    for _, name in ipairs(want) do
      assert.truthy(documented["Kind:" .. name], "Kind." .. name .. " has no entry")
      assert.truthy(documented["Kind:" .. name] > 0, "Kind." .. name .. " has no description")
    end
    local adamw = kinds.get("adamw")
    for _, name in ipairs({ "check_param", "post_update", "orthogonalize", "ns_prepare", "hook_shapes", "resolve" }) do
      assert.is_nil(rawget(adamw, name), name)
    end
    assert.is_false(adamw.ns)
    assert.is_true(kinds.get("muon").ns)
  end)

  it("the kinds derive what they declared (hand-written lists)", function()
    local m, a = kinds.get("muon"), kinds.get("adamw")
    assert.same({ lr = 2e-2, weight_decay = 0.1, matched_adamw_rms = 0.2, momentum = 0.95, nesterov = true, ns_steps = 5,
      ns_variant = "asym5", ns_epsilon = 1e-10, zero_rms_scale_mode = "zero", apply_lr_in_update = false,
      ns_path = "symmetric", ns_method = "standard", scale_mode = "matched_adamw_rms", nonfinite = "error",
      weight_decay_mode = "decoupled", nd_mode = "batch", state_dtype = "float32", ns_dtype = "float32" },
      m.DEFAULTS)
    assert.same(set_of({ "lr", "weight_decay", "matched_adamw_rms", "momentum", "nesterov", "ns_steps", "ns_variant",
      "ns_epsilon", "zero_rms_scale_mode", "apply_lr_in_update", "ns_path", "ns_method", "scale_mode", "nonfinite",
      "weight_decay_mode", "nd_mode", "ns_coefficients", "zeropower_fn", "momentum_update_fn", "reshape_fn",
      "ns_transform_fn", "post_update_fn", "pre_ortho_fn", "post_ortho_fn", "hook_state", "hsdp_replica_count",
      "state_dtype", "ns_dtype" }), m.OPTIONS)
    assert.same({ "lr", "matched_adamw_rms", "momentum", "weight_decay" }, m.SCHEDULE_ORDER)
    assert.same({ "zeropower_fn", "momentum_update_fn", "reshape_fn", "ns_transform_fn", "post_update_fn", "pre_ortho_fn",
      "post_ortho_fn" }, m.HOOKS)
    assert.same({ "lr", "weight_decay", "momentum", "nesterov", "ns_steps", "ns_variant", "matched_adamw_rms" }, m.DISPLAY)
    assert.same({ "momentum_buffer" }, m.state_keys)
    assert.same({}, m.state_min)
    assert.is_nil(m.SAVED.hook_state)
    assert.is_true(m.SAVED.ns_steps)
    assert.equal("config", m.LOAD.ns_steps)
    assert.equal("restore", m.LOAD.momentum)
    assert.same({ lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, nonfinite = "error",
      state_dtype = "float32" }, a.DEFAULTS)
    assert.same(set_of({ "lr", "betas", "eps", "weight_decay", "nonfinite", "state_dtype" }), a.OPTIONS)
    assert.same({ "betas", "eps", "lr", "weight_decay" }, a.SCHEDULE_ORDER)
    assert.same({ "lr", "weight_decay", "betas", "eps" }, a.DISPLAY)
    assert.same({}, a.HOOKS)
    assert.same({ "exp_avg", "exp_avg_sq" }, a.state_keys)
    assert.same({ exp_avg_sq = 0 }, a.state_min)
    assert.is_true(a.counts_steps)
    -- the public modules expose the same tables
    assert.equal(m.DEFAULTS, muon.optim.Muon.DEFAULTS)
    assert.equal(a.OPTIONS, muon.optim.AdamW.OPTIONS)
  end)

  it("the hook names are declared once: config-wide hooks, the kinds and the hook state rules use them", function()
    local names = {}
    for _, h in ipairs(K.HOOKS) do names[#names + 1] = h[1] end
    assert.same(names, kinds.get("muon").HOOKS)
    local ok, err = pcall(muon.engine.new, { groups = { {} }, hooks = { post_ortho = function() end } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown hook 'post_ortho' (did you mean 'post_ortho_fn'?); valid hooks: "
      .. table.concat((function() local s = { unpack(names) } table.sort(s) return s end)(), ", "), 1, true), tostring(err))
    local rules = {}
    for i, r in ipairs(K.HOOK_STATE_RULES) do rules[i] = r[1] end
    assert.same({ "rows", "cols", "matrix", "scalar", "rows_rows", "cols_cols" }, rules)
  end)
end)

describe("the option schema's checks", function()
  it("validate runs every option's check in schema order, then resolve (messages name the option)", function()
    local m = kinds.get("muon")
    local g = {}
    for k, v in pairs(m.DEFAULTS) do g[k] = v end
    assert.has_no.errors(function() K.validate(m, g) end)
    assert.is_table(g._ns)
    g.lr, g.nesterov = -1, 1 -- both bad: nesterov comes later in the seed's order
    local msg, err = raised(K.validate, m, g)
    assert.equal("lr must be >= 0, got -1", msg)
    assert.equal(E.EINVAL, E.code(err))
    g.lr = 1
    assert.equal("nesterov must be a boolean, got 1", raised(K.validate, m, g))
  end)

  it("check_step checks a step's schedulable values in sorted order", function()
    local a = kinds.get("adamw")
    assert.equal("betas[2] must be in [0, 1), got 1", raised(K.check_step, a, { lr = -1, betas = { 0.5, 1 }, eps = 0, weight_decay = 0 }))
    assert.equal("lr must be >= 0, got -1", raised(K.check_step, a, { lr = -1, betas = { 0.5, 0.5 }, eps = 0, weight_decay = 0 }))
  end)
end)

describe("canonical serialization (the cross-rank config agreement)", function()
  it("keys sorted, nested tables, numbers exact, code by type", function()
    assert.equal("{0.90000000000000002,0.94999999999999996}", K.serialize({ 0.9, 0.95 }))
    local a, b = {}, {}
    for _, k in ipairs({ "v", "b", "z", "a" }) do a[k] = "rows" end
    for _, k in ipairs({ "a", "z", "b", "v" }) do b[k] = "rows" end
    assert.equal("{a=rows,b=rows,v=rows,z=rows}", K.serialize(a))
    assert.equal(K.serialize(a), K.serialize(b))
    assert.are_not.equal(K.serialize({ v = "rows" }), K.serialize({ v = "cols" }))
    assert.equal("{1,2,{3,x={4}},k=function}", K.serialize({ 1, 2, { 3, x = { 4 } }, k = print }))
    assert.equal("asym5", K.serialize("asym5"))
    assert.equal("true", K.serialize(true))
  end)
end)

describe("the config's own keys", function()
  it("top-level seed is refused (nothing reads it); name is a string label that muon check prints", function()
    local ok, err = pcall(muon.engine.new, { groups = { {} }, seed = 1 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown top-level key 'seed'; valid top-level keys: dist, groups, hook_budget, hooks, log, name, "
      .. "nil_grad_warning, schedule", 1, true),
      tostring(err))
    ok, err = pcall(muon.engine.new, { groups = { {} }, name = 3 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("'name' must be a string (a label), got number", 1, true), tostring(err))
    local text, problems = H.check_report("return { name = 'baseline 7', groups = { { optimizer = 'adamw' } } }\n",
      "w 4 3\n")
    assert.same({}, problems)
    assert.truthy(text:find("^config: baseline 7\nparameter "), text)
  end)
end)

local stderr_of = H.stderr_of

describe("what an engine's checkpoint load restores and what the config keeps (kind.LOAD)", function()
  local function eng_of(wd, ns_steps)
    local e = muon.engine.new({
      groups = { { name = "m", optimizer = "muon", lr = 0.1, weight_decay = wd, ns_steps = ns_steps } },
      schedule = function(step, g) return g.base_lr * (1 - 0.1 * step) end,
    })
    local w = T.randn({ 3, 2 }, 1)
    e:add_param("w", w, T.randn({ 3, 2 }, 2))
    return e, w
  end
  local path
  setup(function()
    path = H.tmpname(".safetensors")
    local a = eng_of(0.1, 5)
    for _ = 1, 3 do a:step() end
    a:save(path)
  end)
  teardown(function() os.remove(path) end)

  it("the same config: no note, whatever the schedule did", function()
    local b = eng_of(0.1, 5)
    assert.equal("", stderr_of(function() b:load(path) end))
    assert.equal(3, b:get("step"))
    assert.is_true(math.abs(b:get("lr") - 0.07) < 1e-15) -- the last step's (step 3) value
  end)

  it("a changed config: every value the file and the config disagree on is a note; the config wins", function()
    local c = eng_of(0.2, 4)
    local text = stderr_of(function() c:load(path) end)
    assert.truthy(text:find("ns_steps = 5 in the checkpoint, 4 in the config\n", 1, true), text)
    assert.truthy(text:find("weight_decay = 0.10000000000000001 in the checkpoint, 0.20000000000000001 in the config at step 3 "
      .. "(the checkpoint's until the next step)", 1, true), text)
    assert.falsy(text:find("lr =", 1, true), text) -- the schedule's lr at step 3 is the checkpoint's
    assert.equal(4, c.groups[1].options.ns_steps)
    assert.equal(0.1, c.groups[1].options.weight_decay)
    c:step()
    assert.equal(0.2, c.groups[1].options.weight_decay) -- the next step computes every schedulable value from the config
  end)
end)

describe("errors blamed on the caller's line", function()
  it("a constructor's bad option names this file's line, with a code; add_param_group's has no position", function()
    local p = muon.param("w", T.zeros({ 3, 4 }), T.zeros({ 3, 4 }))
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() local o = muon.optim.Muon({ p }, { lr = -1 }) return o end) -- (no tail call: its frame names the line)
    assert.is_false(ok)
    assert.equal(E.EINVAL, E.code(err))
    assert.equal(("tests/kind_spec.lua:%d: lr must be >= 0, got -1"):format(line), tostring(err))
    local opt = muon.optim.AdamW({ p })
    local q = muon.param("q", T.zeros({ 2 }), T.zeros({ 2 }))
    ok, err = pcall(opt.add_param_group, opt, { params = { q }, betas = { 1, 1 } })
    assert.equal("betas[1] must be in [0, 1), got 1", tostring(err))
  end)
end)

describe("memory() asks C for the Newton-Schulz workspace", function()
  it("mu_ns_workspace_bytes: every buffer of a fresh workspace, rounded to cache lines", function()
    local out = ffi.new("int64_t[1]")
    local ws = muon.ns.workspace("float32", 64, 32)
    assert.equal(0, C.mu_ns_workspace_bytes(ws, out))
    assert.equal(64 * 32 * 4 + 2 * 32 * 32 * 4, tonumber(out[0]))
    ws = muon.ns.workspace("float64", 3, 5) -- 15 and 9 elements: 120 and 72 bytes, each rounded up to 128
    assert.equal(0, C.mu_ns_workspace_bytes(ws, out))
    assert.equal(3 * 128, tonumber(out[0]))
    assert.is_true(C.mu_ns_workspace_bytes(nil, out) < 0)
    assert.equal(0, tonumber(out[0]))
    assert.is_true(C.mu_ns_workspace_bytes(ws, nil) < 0)
  end)

  it("the Gram iteration's buffers count once used", function()
    local function scratch(method)
      local p = muon.param("w", T.randn({ 64, 256 }, 1), T.randn({ 64, 256 }, 2))
      local opt = muon.optim.Muon({ p }, { ns_method = method })
      opt:step()
      return opt:memory().scratch_bytes
    end
    local std, gram = scratch("standard"), scratch("gram")
    -- at least one worker's Gram buffers: 3 (64 x 64) + 64 x 256 float32 elements
    assert.is_true(gram - std >= (3 * 64 * 64 + 64 * 256) * 4, ("standard %d, gram %d"):format(std, gram))
  end)

  it("the bfloat16 iteration's per-worker buffers count once used, made once", function()
    local out = ffi.new("int64_t[1]")
    local ws = muon.ns.workspace("float32", 64, 256)
    local function bytes()
      assert.equal(0, C.mu_ns_workspace_bytes(ws, out))
      return tonumber(out[0])
    end
    local fresh = bytes()
    local x = T.randn({ 64, 256 }, 3)
    muon.ns.zeropower(x, { dtype = "bfloat16", workspace = ws })
    local used = bytes()
    assert.is_true(used >= fresh, ("fresh %d, used %d"):format(fresh, used))
    if muon.blas_info().bf16:find("widened", 1, true) then
      -- at least one worker's float32 copies of X X^T's operands (a 64 x 256
      -- matrix is one tile): 2 x 64 x 256 elements
      assert.is_true(used - fresh >= 2 * 64 * 256 * 4, ("fresh %d, used %d"):format(fresh, used))
    end
    muon.ns.zeropower(x, { dtype = "bfloat16", workspace = ws })
    muon.ns.zeropower(T.randn({ 256, 64 }, 4), { dtype = "bfloat16", workspace = ws })
    assert.equal(used, bytes()) -- the same shapes again: nothing new
  end)
end)
