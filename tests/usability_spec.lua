-- The mistakes a new user makes, each run as they would make it, with the
-- message asserted: it names what the user controls (option, parameter,
-- file, line of their config, environment variable) with a hint where one
-- helps, and nothing of muon's own files. From C (mu_engine_error), a
-- traceback comes only when the user's own hook raised, and then it shows
-- their frames only.
local H = require("helpers")
local ffi = require("ffi")
local T = H.muon.tensor
local E = require("muon.errors")
local engine = require("muon.engine")
local Muon = H.muon.optim.Muon
local C = require("muon.core").C

local ROOT = (debug.getinfo(1, "S").source:match("^@(.*)/tests/[^/]*$")) or "."
local function cwd()
  local f = assert(io.popen("pwd -P"))
  local d = f:read("*l")
  f:close()
  return d
end
if ROOT:sub(1, 1) ~= "/" then ROOT = cwd() .. "/" .. ROOT end
local BUILD = os.getenv("MUON_BUILD") or "build"
local MUON = ROOT .. "/" .. BUILD .. "/muon"

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Every message this spec sees, for the check that none names muon's files.
local seen = {}

local function note(msg)
  seen[#seen + 1] = msg
  return msg
end

-- The error f raises (it must raise), as { code, msg }.
local function raised(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  note(tostring(err))
  return err
end

local has = H.has

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

-- Runs a shell command; its stdout+stderr text and exit status.
local function run(cmd)
  local out, status = require("readme").run_status(cmd)
  -- (the standalone luajit prints its own traceback of an uncaught error
  -- after the message; only the message is muon's)
  note((out:gsub("\nstack traceback:\n.*$", "")))
  return out, status
end

local dir = H.tmpdir()
local LUA_PATH = ROOT .. "/lua/?.lua;" .. ROOT .. "/lua/?/init.lua;;"

local function cfg(groups, extra)
  local c = { groups = groups }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

-- The C API, called as a C trainer calls it: (rc, mu_engine_error or
-- mu_last_error text, engine or nil).
local function c_open(path)
  local rc, e = H.c_engine_open(path)
  if rc ~= 0 then return rc, note(ffi.string(C.mu_last_error())) end
  return rc, "", e
end

local function c_err(eng) return note(ffi.string(C.mu_engine_error(eng))) end

describe("option typos name the valid options and the closest one", function()
  local cases = {
    { function() engine.new(cfg({ { optimizer = "muon", momentm = 0.9 } })) end,
      "group 1: Muon got unexpected keyword arguments: momentm (did you mean 'momentum' for 'momentm'?); valid options: " },
    { function() engine.new(cfg({ { optimizer = "adamw", beta = { 0.9, 0.99 } } })) end,
      "AdamW got unexpected keyword arguments: beta (did you mean 'betas' for 'beta'?)" },
    { function() engine.new(cfg({ {} }, { schedul = function() end })) end,
      "unknown top-level key 'schedul' (did you mean 'schedule'?)" },
    { function() engine.new(cfg({ {} }, { hooks = { post_update = function() end } })) end,
      "hooks: unknown hook 'post_update' (did you mean 'post_update_fn'?)" },
    { function() engine.new(cfg({ {} }, { dist = { mesj = { { "dp", 1 } } } })) end,
      "dist: unknown dist key 'mesj' (did you mean 'mesh'?); valid dist keys: balance, check_replicas, comm, independent, max_batch_numel, mesh" },
    { function() engine.new(cfg({ {} }), { trustd = true }) end,
      "engine.new: unknown option 'trustd' (did you mean 'trusted'?); valid options: dry_run, source, trusted" },
    { function() engine.new(cfg({ {} })):set("lr_scal", 1) end,
      "set: unknown key 'lr_scal' (did you mean 'lr_scale'?); valid keys: lr_scale" },
    { function() engine.new(cfg({ {} })):get("setp") end, "get: unknown key 'setp' (did you mean 'step'?)" },
    { function() Muon({ H.muon.param("w", T.zeros({ 2, 2 })) }, { nesterv = true }) end,
      "Muon got unexpected keyword arguments: nesterv (did you mean 'nesterov' for 'nesterv'?)" },
    { function() H.muon.ns.zeropower(T.zeros({ 2, 2 }), { step = 3 }) end,
      "unknown option 'step' (did you mean 'steps'?)" },
  }
  for i, c in ipairs(cases) do
    it("case " .. i .. ": " .. c[2]:sub(1, 60), function()
      local err = raised(c[1])
      assert.equal(E.EINVAL, E.code(err) or E.EINVAL)
      has(err, c[2])
    end)
  end

  it("with no close name, only the valid ones", function()
    local err = raised(function() engine.new(cfg({ { optimizer = "muon", zzzzzz = 1 } })) end)
    has(err, "Muon got unexpected keyword arguments: zzzzzz; valid options: apply_lr_in_update, ")
  end)

  it("a config's unknown options: the seed's sentence first, as the optimizer's own constructor says it", function()
    local err = raised(function() engine.new(cfg({ { name = "hidden", alpha = 1, mid = 2, zeta = 3 } })) end)
    has(err, "config (table): group 1 ('hidden'): Muon got unexpected keyword arguments: alpha, mid, zeta; valid options: ")
    local err2 = raised(function() Muon({ H.muon.param("w", T.zeros({ 2, 2 })) }, { alpha = 1, mid = 2, zeta = 3 }) end)
    has(err2, "Muon got unexpected keyword arguments: alpha, mid, zeta; valid options: ")
  end)

  it("from C, in a config file, the same message", function()
    local path = write(dir .. "/typo.lua", "return { groups = { { optimizer = 'muon', momentm = 0.9 } } }\n")
    local rc, msg = c_open(path)
    assert.equal(E.EINVAL, rc)
    has(msg, "mu_engine_open: config '" .. path .. "': group 1: Muon got unexpected keyword arguments: momentm (did you "
      .. "mean 'momentum' for 'momentm'?)")
  end)
end)

describe("unknown optimizer and bad values name the group and option", function()
  it("unknown optimizer", function()
    local err = raised(engine.new, cfg({ { name = "hidden", optimizer = "muom" } }))
    assert.equal(E.EINVAL, E.code(err))
    has(err, "group 1 ('hidden'): unknown optimizer 'muom' (did you mean 'muon'?); valid optimizers: adamw, lion, muon")
  end)

  it("negative lr", function()
    local err = raised(engine.new, cfg({ { optimizer = "muon" }, { name = "rest", optimizer = "adamw", lr = -0.1 } }))
    assert.equal(E.EINVAL, E.code(err))
    has(err, "group 2 ('rest') (adamw): lr must be >= 0, got -0.1")
  end)
end)

describe("a string where a number goes says it is a string", function()
  local p = function() return H.muon.param("w", T.zeros({ 2, 2 })) end
  local cases = {
    { function() engine.new(cfg({ { name = "hidden", lr = "0.02" } })) end,
      "group 1 ('hidden') (muon): lr must be a finite number, got the string \"0.02\"" },
    { function() Muon({ p() }, { lr = "0.02" }) end, "lr must be a finite number, got the string \"0.02\"" },
    { function() Muon({ p() }, { ns_steps = "5" }) end, "ns_steps must be an integer >= 0, got the string \"5\"" },
    { function() Muon({ p() }, { nesterov = "true" }) end, "nesterov must be a boolean, got the string \"true\"" },
    { function() Muon({ p() }, { momentum = "0.9" }) end,
      "momentum must be a number or a list of one or two numbers, got the string \"0.9\"" },
    { function() H.muon.optim.AdamW({ p() }, { betas = { "0.9", 0.99 } }) end,
      "betas[1] must be a finite number, got the string \"0.9\"" },
    { function() engine.new(cfg({ { name = "h" } })):set_lr("h", "0.1") end,
      "set_lr: group 1 ('h'): lr must be a finite number >= 0, got the string \"0.1\"" },
    { function() engine.new(cfg({ {} })):set("lr_scale", "2") end,
      "set: lr_scale must be a finite number >= 0, got the string \"2\"" },
    { function() H.muon.schedules.warmup_cosine("100", 1000) end, "got the string \"100\"" },
  }
  for i, c in ipairs(cases) do
    it("case " .. i .. ": " .. c[2]:sub(1, 70), function()
      local err = raised(c[1])
      assert.equal(E.EINVAL, E.code(err))
      has(err, c[2])
    end)
  end

  it("a number stays a number, nil and tables by their type", function()
    assert.equal("0.5", E.value(0.5))
    assert.equal("nil", E.value(nil))
    assert.equal("a table", E.value({}))
    assert.equal("the string \"x\"", E.value("x"))
  end)
end)

describe("parameters: mismatches caught at add_param, naming the parameter", function()
  local function eng() return engine.new(cfg({ { optimizer = "muon", min_dim = 2 }, { optimizer = "adamw" } })) end

  it("a float64 grad for a float32 value", function()
    local err = raised(function() eng():add_param("layers.0.w", T.zeros({ 4, 4 }), T.zeros({ 4, 4 }, "float64")) end)
    assert.equal(E.EDTYPE, E.code(err))
    has(err, "parameter 'layers.0.w': grad is float64 but the value is float32")
  end)

  it("a grad of another shape", function()
    local err = raised(function() eng():add_param("layers.0.w", T.zeros({ 4, 4 }), T.zeros({ 4, 3 })) end)
    assert.equal(E.ESHAPE, E.code(err))
    has(err, "parameter 'layers.0.w': grad has shape [4, 3] but the value has shape [4, 4]")
  end)

  it("a value that is not contiguous, and a grad sharing its memory", function()
    local err = raised(function() eng():add_param("w.t", T.zeros({ 4, 3 }):transpose(1, 2), nil) end)
    has(err, "parameter 'w.t': value (shape [3, 4], strides [1, 3]) is not contiguous")
    local v = T.zeros({ 4, 4 })
    err = raised(function() eng():add_param("w.same", v, v) end)
    has(err, "parameter 'w.same': grad shares memory with the value")
  end)

  it("a duplicate name, in the engine and in an optimizer's param list", function()
    local e = eng()
    e:add_param("w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 }))
    has(raised(e.add_param, e, "w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 })), "parameter 'w' is already registered")
    local a = H.muon.param("w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 }))
    local b = H.muon.param("w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 }))
    has(raised(Muon, { a, b }), "parameter 'w' appears twice (two parameters with one name)")
  end)

  it("optimizer classes check their param lists, and grads set later at the step", function()
    local p = H.muon.param("w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 }))
    p.grad = T.zeros({ 2, 2 }, "float64")
    has(raised(Muon, { p }), "Muon param group 1: parameter 'w': grad is float64 but the value is float32")
    p.grad = T.zeros({ 2, 2 })
    local opt = Muon({ p })
    p.grad = T.zeros({ 2, 2 }, "float64")
    local err = raised(opt.step, opt)
    assert.equal(E.EDTYPE, E.code(err))
    has(err, "parameter 'w': grad is float64 but the value is float32")
  end)

  it("from C: a grad overlapping the data", function()
    local path = write(dir .. "/plain.lua", "return { groups = { { optimizer = 'muon' } } }\n")
    local rc, msg, e = c_open(path)
    assert.equal(0, rc, msg)
    local shape = ffi.new("int64_t[2]", { 2, 2 })
    local buf = ffi.new("float[5]")
    rc = C.mu_engine_add_param(e, "w", C.MU_F32, 2, shape, buf, buf + 1)
    assert.equal(E.EINVAL, rc)
    has(c_err(e), "mu_engine_add_param: parameter 'w': grad overlaps data")
  end)
end)

describe("config files", function()
  it("a missing config names the file and, for a relative path, the working directory", function()
    local err = raised(engine.new, "no_such_config.lua")
    assert.equal(E.EIO, E.code(err))
    has(err, "config 'no_such_config.lua' (resolved " .. cwd() .. "/no_such_config.lua): No such file or directory")
    local rc, msg = c_open("no_such_config.lua")
    assert.equal(E.EIO, rc)
    has(msg, "config 'no_such_config.lua' (resolved " .. cwd() .. "/no_such_config.lua): No such file or directory")
  end)

  it("a syntax error names the user's file and line", function()
    local path = write(dir .. "/broken.lua", "return {\n  groups = {\n    { optimizer = 'muon' lr = 1 },\n  },\n}\n")
    local err = raised(engine.new, path)
    has(err, path .. ":3:")
    local rc, msg = c_open(path)
    assert.equal(E.EFORMAT, rc)
    has(msg, path .. ":3:")
  end)
end)

describe("checkpoints", function()
  local function eng(shape)
    local e = engine.new(cfg({ { optimizer = "muon", min_dim = 2 }, { optimizer = "adamw" } }))
    local g = T.zeros(shape)
    g:fill(0.5)
    e:add_param("layers.0.w", T.zeros(shape), g)
    return e
  end

  it("an .npy given as a checkpoint: not a safetensors file, naming it", function()
    local npy = dir .. "/weights.npy"
    T.zeros({ 3, 3 }):save(npy)
    local err = raised(function() eng({ 4, 4 }):load(npy) end)
    assert.equal(E.EFORMAT, E.code(err))
    has(err, "'" .. npy .. "' is not a safetensors file (it is a NumPy .npy file)")
  end)

  it("a checksum mismatch gives the fix in the caller's language: Lua's option, the C flag", function()
    local a = eng({ 4, 4 })
    a:step()
    local ckpt = dir .. "/sum.safetensors"
    a:save(ckpt)
    local f = assert(io.open(ckpt, "r+b"))
    local size = f:seek("end")
    f:seek("set", size - 3) -- a byte of the data section: its checksum no longer matches
    local b = f:read(1)
    f:seek("set", size - 3)
    f:write(string.char((b:byte() + 1) % 256))
    f:close()
    local err = raised(function() eng({ 4, 4 }):load(ckpt) end)
    assert.equal(E.EFORMAT, E.code(err))
    has(err, "checksum mismatch")
    has(err, "load(path, { checksum = false })")
    assert.falsy(tostring(err):find("mu_engine_load_ex", 1, true), tostring(err))
    -- the same file through the C API, as a C trainer loads it
    local path = write(dir .. "/sum_cfg.lua", "return { groups = { { optimizer = 'muon', min_dim = 2 }, "
      .. "{ optimizer = 'adamw' } } }\n")
    local rc, _, ce = c_open(path)
    assert.equal(0, rc)
    local w, g = ffi.new("float[16]"), ffi.new("float[16]")
    local shape = ffi.new("int64_t[2]", 4, 4)
    assert.equal(0, C.mu_engine_add_param(ce, "layers.0.w", C.MU_F32, 2, shape, w, g))
    assert.equal(E.EFORMAT, C.mu_engine_load(ce, ckpt))
    local msg = c_err(ce)
    has(msg, "checksum mismatch")
    has(msg, "mu_engine_load_ex(eng, path, MU_LOAD_NO_CHECKSUM)")
    assert.falsy(msg:find("checksum = false", 1, true), msg)
    assert.equal(0, C.mu_engine_load_ex(ce, ckpt, C.MU_LOAD_NO_CHECKSUM))
  end)

  it("a checkpoint of other parameters names the parameter and what differs", function()
    local a = eng({ 4, 4 })
    a:step()
    local ckpt = dir .. "/a.safetensors"
    a:save(ckpt)
    local err = raised(function() eng({ 4, 5 }):load(ckpt) end)
    has(err, "parameter 'layers.0.w': shape (4, 4) in the checkpoint, (4, 5) here")
  end)
end)

describe("numbers: a finite gradient whose momentum overflows", function()
  local function setup(mode)
    local e = engine.new(cfg({ { optimizer = "muon", nonfinite = mode, momentum = 0.95 } }))
    local w, g = T.zeros({ 4, 4 }), T.zeros({ 4, 4 })
    w:fill(1)
    g:fill(3e38) -- finite; the Nesterov input g + 0.95 * (0.95 * 0 + g) overflows float32
    e:add_param("layers.0.w", w, g)
    return e, w
  end

  it("fails naming the parameter (nonfinite = 'error')", function()
    local e, w = setup("error")
    local err = raised(e.step, e)
    assert.equal(E.ENONFINITE, E.code(err))
    has(err, "parameter 'layers.0.w': its gradient is finite but the momentum")
    assert.equal(1, w:flat()[1])
    assert.equal(0, e:get("step"))
  end)

  it("AdamW: an overflowing second moment (its update stays finite) fails or is skipped the same way", function()
    for _, mode in ipairs({ "error", "skip" }) do
      local e = engine.new(cfg({ { optimizer = "adamw", nonfinite = mode } }))
      local w, g = T.zeros({ 3 }), T.zeros({ 3 })
      w:fill(1)
      g:fill(3e38) -- (1 - beta2) * g^2 overflows float32
      e:add_param("bias", w, g)
      if mode == "error" then
        local err = raised(e.step, e)
        assert.equal(E.ENONFINITE, E.code(err))
        has(err, "parameter 'bias': its gradient is finite but the exp_avg_sq overflowed to NaN or Inf")
      else
        e:step()
        assert.equal(1, e:stats().adamw.skipped_nonfinite)
      end
      assert.equal(1, w:flat()[1])
      assert.is_nil(e:state("bias"))
    end
  end)

  it("is skipped like a NaN gradient (nonfinite = 'skip')", function()
    local e, w = setup("skip")
    e:step()
    assert.equal(1, w:flat()[1])
    assert.equal(1, e:stats().muon.skipped_nonfinite)
    assert.is_nil(e:state("layers.0.w")) -- no state was committed
    -- the same as for a NaN gradient
    local e2, w2 = setup("skip")
    e2:param("layers.0.w").grad:fill(0 / 0)
    e2:step()
    assert.equal(1, w2:flat()[1])
    assert.equal(1, e2:stats().muon.skipped_nonfinite)
    assert.is_nil(e2:state("layers.0.w"))
  end)
end)

describe("hooks", function()
  it("NaN or Inf made by a hook names the hook and the parameter; nothing changes", function()
    local nan = function(O) O:fill(0 / 0) end
    local cases = {
      { { post_ortho_fn = nan }, "the update holds NaN or Inf after post_ortho_fn (the Newton-Schulz input was finite)" },
      { { zeropower_fn = function(x) return x:clone():fill(1 / 0) end },
        "the update holds NaN or Inf after zeropower_fn" },
      { { momentum_update_fn = function(gs)
          local out = {}
          for i, x in ipairs(gs) do out[i] = x:clone():fill(0 / 0) end
          return out
        end }, "the Newton-Schulz input holds NaN or Inf after momentum_update_fn (its gradient is finite)" },
      { { pre_ortho_fn = nan, hook_state = { s = "scalar" } }, "pre_ortho_fn left NaN or Inf in the Newton-Schulz input" },
    }
    for _, c in ipairs(cases) do
      local g = { name = "hidden", optimizer = "muon" }
      for k, v in pairs(c[1]) do g[k] = v end
      local e = engine.new(cfg({ g }))
      local w = T.randn({ 4, 4 }, 1)
      local before = w:clone()
      e:add_param("blocks.0.w", w, T.randn({ 4, 4 }, 2))
      local err = raised(e.step, e)
      assert.equal(E.ENONFINITE, E.code(err))
      has(err, "parameter 'blocks.0.w': " .. c[2])
      H.assert_equal_bits(w, before, "the parameter")
      assert.equal(0, e:get("step"))
    end
  end)

  it("a hook raising a table: MU_ELUA, its fields, a traceback ending at the user's line", function()
    local path = write(dir .. "/hook.lua", table.concat({
      "local function check(x)",
      "  error({ reason = 'clip', limit = 3 })",
      "end",
      "return { groups = { { optimizer = 'muon', post_update_fn = function(p) check(p) end } } }",
    }, "\n") .. "\n")
    local rc, msg, e = c_open(path)
    assert.equal(0, rc, msg)
    local shape = ffi.new("int64_t[2]", { 2, 2 })
    local w, g = ffi.new("float[4]", { 1, 2, 3, 4 }), ffi.new("float[4]", { 1, 1, 1, 1 })
    assert.equal(0, C.mu_engine_add_param(e, "w", C.MU_F32, 2, shape, w, g))
    rc = C.mu_engine_step(e)
    assert.equal(E.ELUA, rc)
    msg = c_err(e)
    has(msg, "mu_engine_step: post_update_fn: (error object is a table value: { limit = 3, reason = \"clip\" })")
    local tb = msg:match("stack traceback:\n(.*)$")
    assert.truthy(tb, msg)
    has(tb, path .. ":2: in function 'check'")
    for line in tb:gmatch("[^\n]+") do
      assert.truthy(line:find(path, 1, true), "a frame that is not the user's: " .. line)
    end
  end)

  it("in Lua: a table with metamethods is described without calling them unprotected", function()
    local err = raised(E.call_hook, "schedule", function()
      error(setmetatable({ code = E.EIO }, { __tostring = function() error("nested") end }))
    end)
    assert.equal(E.ELUA, err.code) -- a table cannot choose the code
    assert.equal("schedule: (error object is a table value: { code = -3 })", err.msg)
  end)

  it("from C, a user mistake has no traceback", function()
    local path = write(dir .. "/plain2.lua", "return { groups = { { optimizer = 'muon' } } }\n")
    local rc, msg, e = c_open(path)
    assert.equal(0, rc, msg)
    rc = C.mu_engine_set(e, "lr", 0.1)
    assert.equal(E.EINVAL, rc)
    msg = c_err(e)
    assert.equal("mu_engine_set: set: unknown key 'lr'; valid keys: lr_scale ('lr' can be read with get; "
      .. "scale lrs with lr_scale)", msg)
    local shape = ffi.new("int64_t[2]", { 2, 3 })
    local w, g = ffi.new("float[6]"), ffi.new("float[6]")
    assert.equal(0, C.mu_engine_add_param(e, "w", C.MU_F32, 2, shape, w, g))
    g[4] = 0 / 0
    rc = C.mu_engine_step(e)
    assert.equal(E.ENONFINITE, rc)
    msg = c_err(e)
    assert.falsy(msg:find("traceback", 1, true), msg)
    has(msg, "parameter 'w': gradient holds NaN or Inf")
  end)
end)

describe("environment", function()
  it("a MUON_LIB that cannot be loaded says what to set", function()
    local out, status = run("cd " .. sh_quote(dir) .. " && MUON_LIB=/nonexistent/libmuon.so LUA_PATH=" .. sh_quote(LUA_PATH)
      .. " luajit -e \"require('muon')\"")
    assert.is_not.equal(0, status)
    has(out, "MUON_LIB=/nonexistent/libmuon.so could not be loaded")
    has(out, "set MUON_LIB to the path of libmuon.so")
  end)

  it("the CLI with a MUON_LUA_PATH without the modules says what to set", function()
    local out, status = run("cd " .. sh_quote(dir) .. " && env -u LUA_PATH MUON_LUA_PATH=/nonexistent " .. sh_quote(MUON) .. " info")
    assert.is_not.equal(0, status, out)
    has(out, "set MUON_LUA_PATH to the directory that holds muon/init.lua")
  end)

  it("running from another directory: the library is found; relative paths are explained", function()
    local script = write(dir .. "/from_elsewhere.lua", table.concat({
      "local engine = require('muon.engine')",
      "local ok, err = pcall(engine.new, 'configs/muon.lua')",
      "print(tostring(err))",
      "local e = engine.new(" .. ("%q"):format(ROOT .. "/configs/muon.lua") .. ")",
      "print('groups', #e.groups)",
    }, "\n") .. "\n")
    local out, status = run("cd " .. sh_quote(dir) .. " && LUA_PATH=" .. sh_quote(LUA_PATH) .. " luajit " .. sh_quote(script))
    assert.equal(0, status, out)
    has(out, "config 'configs/muon.lua' (resolved " .. dir .. "/configs/muon.lua): No such file or directory")
    has(out, "groups\t2")
    out, status = run("cd " .. sh_quote(dir) .. " && " .. sh_quote(MUON) .. " run " .. sh_quote(script))
    assert.equal(0, status, out)
    has(out, "groups\t2")
  end)
end)

describe("no message names muon's own files", function()
  it("(every message above)", function()
    assert.truthy(#seen > 20, #seen)
    -- a position or a frame in one of muon's Lua files (source tree or
    -- installed); a list of paths Lua's require tried is not one
    for _, msg in ipairs(seen) do
      assert.falsy(msg:find("lua/muon/[%w_/]*%.lua:%d"), msg)
      assert.falsy(msg:find("5%.1/muon/[%w_/]*%.lua:%d"), msg)
    end
  end)
end)

teardown(function() H.rmrf(dir) end)
