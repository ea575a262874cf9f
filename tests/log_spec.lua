-- What an engine tells (muon.log): the seed's info line at the level the
-- config or MUON_LOG sets, rank 0 only; and tostring of an optimizer, an
-- engine and a group as the seed's repr (torch.optim's) prints them.
local H = require("helpers")
local ffi = require("ffi")
local T = H.muon.tensor
local engine = require("muon.engine")
local Muon = H.muon.optim.Muon

pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")

-- An engine whose Muon group's reshape_fn splits an 8x12 matrix into two
-- 4x12 heads (the seed's example), one step: what it printed.
local function reshape_run(log)
  return H.stderr_of(function()
    local eng = engine.new({ log = log, groups = { { name = "hidden",
      reshape_fn = function(_, x) return { x:view({ 2, 4, 12 }) } end } } })
    eng:add_param("blocks.0.attn.w", T.randn({ 8, 12 }, 1), T.randn({ 8, 12 }, 2))
    eng:step()
  end)
end

describe("messages at a level", function()
  it("info shows the seed's reshape line; the default level (warn) does not", function()
    H.has(reshape_run({ level = "info" }), "muon: info: Reshape blocks.0.attn.w from [8, 12] to [2, 4, 12]\n")
    assert.are.equal("", reshape_run(nil))
    assert.are.equal("", reshape_run({ level = "warn" }))
  end)

  it("MUON_LOG overrides the config's level; a bad value warns and keeps warn", function()
    ffi.C.setenv("MUON_LOG", "info", 1)
    local ok, out = pcall(reshape_run, { level = "error" })
    ffi.C.setenv("MUON_LOG", "loud", 1)
    local ok2, out2 = pcall(reshape_run, nil)
    ffi.C.unsetenv("MUON_LOG")
    assert.is_true(ok and ok2)
    H.has(out, "Reshape blocks.0.attn.w from [8, 12] to [2, 4, 12]")
    H.has(out2, "muon: MUON_LOG=loud is not a level (error, warn, info, debug); using warn")
    assert.falsy(out2:find("Reshape", 1, true))
  end)

  it("groups left empty warn through it (level warn shows, error silences)", function()
    local function run(level)
      local eng = engine.new({ log = { level = level }, groups = { { name = "hidden" },
        { name = "conv", optimizer = "adamw", match = "conv" } } })
      eng:add_param("w", T.randn({ 4, 4 }, 1), T.randn({ 4, 4 }, 2))
      return H.stderr_of(function() eng:step() end)
    end
    H.has(run("warn"), "muon: warning: config (table): group 2 ('conv') (adamw: match = \"conv\") selects none")
    assert.are.equal("", run("error"))
  end)
end)

describe("tostring: the seed's repr", function()
  it("an optimizer: torch.optim's format, every option but params sorted, Python's values", function()
    local opt = Muon({ H.muon.param("w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 })) }, { lr = 0.05, momentum = { 0.9, 0.95 } })
    local text = tostring(opt)
    assert.truthy(text:find("^Muon %(\nParameter Group 0\n    apply_lr_in_update: False\n    lr: 0.05\n"), text)
    H.has(text, "\n    momentum: (0.9, 0.95)\n    nd_mode: batch\n    nesterov: True\n")
    H.has(text, "\n    ns_epsilon: 1e-10\n")
    assert.truthy(text:find("\n    zero_rms_scale_mode: zero\n%)$"), text)
    assert.falsy(text:find("params", 1, true))
    opt:add_param_group({ params = { H.muon.param("v", T.zeros({ 3, 3 }), T.zeros({ 3, 3 })) }, lr = 0.1 })
    H.has(tostring(opt), "\nParameter Group 1\n    apply_lr_in_update: False\n    lr: 0.1\n")
    assert.truthy(tostring(opt.param_groups[2]):find("^Parameter Group 1\n"))
    local adam = H.muon.optim.AdamW({ H.muon.param("b", T.zeros({ 2 }), T.zeros({ 2 })) })
    assert.are.equal("AdamW (\nParameter Group 0\n    betas: (0.9, 0.999)\n    eps: 1e-08\n    lr: 0.001\n"
      .. "    nonfinite: error\n    state_dtype: float32\n    step: 0\n    weight_decay: 0.01\n)", tostring(adam))
  end)

  it("an engine and its groups: the config named, each group's options, name and optimizer, hooks by name", function()
    local eng = engine.new({ groups = { { name = "hidden", min_dim = 2, post_update_fn = function() end },
      { name = "rest", optimizer = "adamw", weight_decay = 0 } } })
    eng:add_param("w", T.zeros({ 4, 4 }), T.zeros({ 4, 4 }))
    local text = tostring(eng)
    assert.truthy(text:find("^Engine %(config %(table%), 1 parameters, step 0\nParameter Group 0\n"), text)
    H.has(text, "\n    name: hidden\n")
    H.has(text, "\n    post_update_fn: <function>\n")
    H.has(text, "\nParameter Group 1\n    betas: (0.9, 0.999)\n    eps: 1e-08\n    lr: 0.001\n    name: rest\n"
      .. "    nonfinite: error\n    optimizer: adamw\n    state_dtype: float32\n    weight_decay: 0\n)")
    local g = eng:param_groups()[2]
    assert.truthy(tostring(g):find("^Parameter Group 1\n    betas: %(0.9, 0.999%)\n"))
    assert.are.equal("rest", g.name) -- (still plain data)
  end)
end)
