-- muon.routing: patterns in regex syntax refused with their Lua spelling,
-- and groups left empty: an error for a Muon group whose match selects
-- nothing while the matrices go elsewhere (at the first step, on every
-- call after, from C, in muon check), warnings for the other empty groups.
local H = require("helpers")
local ffi = require("ffi")
local T = H.muon.tensor
local E = require("muon.errors")
local engine = require("muon.engine")
local Rt = require("muon.routing")
local C = require("muon.core").C

local has = H.has

-- Names as a model registers them, and which of them a regex matches
-- (written out by hand: Python's re.search on each).
local NAMES = { "blocks.0.qkv.weight", "blocks.0.proj.weight", "blocks.11.qkv.weight", "blocks.0.qkv.bias",
  "blocksX0Xqkv.weight", "blocks.a.qkv.weight", "wte.weight", "blocks.0.mlp.fc.weight", "h.3.attn" }
local REGEXES = {
  { "blocks\\.\\d+\\.(qkv|proj)\\.weight", { true, true, true, false, false, false, false, false, false } },
  { "^h\\.\\d\\.attn$", { false, false, false, false, false, false, false, false, true } },
  { "(?:wte|mlp)\\.", { false, false, false, false, false, false, true, true, false } },
  { "\\d{2}", { false, false, true, false, false, false, false, false, false } },
  { "qkv|bias", { true, false, true, true, true, true, false, false, false } },
  { "b.+?\\.w", { true, true, true, false, true, true, false, true, false } },
  { "[\\d]\\.q", { true, false, true, true, false, false, false, false, false } },
}

local function any_find(list, name)
  for _, p in ipairs(list) do
    if name:find(p) then return true end
  end
  return false
end

describe("patterns in regex syntax", function()
  it("are spelled as Lua patterns that select what the regex selects", function()
    for _, c in ipairs(REGEXES) do
      local list = assert(Rt.lua_spelling(c[1]), c[1])
      for i, name in ipairs(NAMES) do
        assert.are.equal(c[2][i], any_find(list, name), c[1] .. " on " .. name .. ": " .. table.concat(list, " "))
      end
    end
    assert.are.same({ "blocks%.%d+%.qkv%.weight", "blocks%.%d+%.proj%.weight" },
      Rt.lua_spelling("blocks\\.\\d+\\.(qkv|proj)\\.weight"))
    assert.are.same({ "x.-y" }, Rt.lua_spelling("x.*?y"))
    assert.is_nil(Rt.lua_spelling("(ab)+")) -- a quantified group: no Lua spelling
    assert.is_nil(Rt.lua_spelling("\\bfoo"))
  end)

  it("are found (\\d, \\., |, +?, *?, (a|b), (?:, {n}, a quantified group); valid Lua patterns are not", function()
    for _, p in ipairs({ "a\\d", "a\\.b", "a|b", "a.+?b", "a.*?b", "(a|b)", "(?:ab)", "x{2}", "(ab)+", "\\bx" }) do
      assert.truthy(Rt.pattern_problem(p), p)
      has(Rt.pattern_problem(p), "uses regex syntax")
    end
    for _, p in ipairs({ ".*", "blocks%.%d+%.qkv", "a%|b", "[|]", "^h%.", "bias$", "[%w_]+", "(x)", "a?b", "%(a%|b%)",
      "layer_1", "%d+%.weight" }) do
      assert.is_nil(Rt.pattern_problem(p), p)
    end
    has(Rt.pattern_problem("[a"), "is not a valid Lua pattern (malformed pattern")
  end)

  it("fail the config's load naming the group, the pattern and its Lua spelling", function()
    local ok, err = pcall(engine.new, { groups = { { name = "hidden", match = "blocks\\.\\d+\\.(qkv|proj)\\.weight" },
      { optimizer = "adamw" } } })
    assert.is_false(ok)
    assert.are.equal(E.EINVAL, E.code(err))
    has(err, "group 1 ('hidden'): match = \"blocks\\\\.\\\\d+\\\\.(qkv|proj)\\\\.weight\" uses regex syntax (\\. \\d |)")
    has(err, "Write it as { \"blocks%.%d+%.qkv%.weight\", \"blocks%.%d+%.proj%.weight\" }")
    ok, err = pcall(engine.new, { groups = { { name = "hidden", exclude = { "embed", "head|lm" } } } })
    assert.is_false(ok)
    has(err, "group 1 ('hidden'): exclude[2] = \"head|lm\" uses regex syntax (|)")
  end)

  it("the spelled patterns route as the regex meant", function()
    local eng = engine.new({ groups = { { name = "hidden", match = Rt.lua_spelling("blocks\\.\\d+\\.(qkv|proj)\\.weight") },
      { name = "rest", optimizer = "adamw" } } })
    assert.are.equal("hidden", eng:route("blocks.7.proj.weight", { 4, 4 }).name)
    assert.are.equal("rest", eng:route("blocks.7.mlp.weight", { 4, 4 }).name)
  end)
end)

-- An engine with a Muon group and an AdamW catch-all, and a small model.
local function model(eng)
  local ps = {}
  for i = 0, 1 do
    for _, n in ipairs({ "qkv.weight", "qkv.bias", "mlp.weight" }) do
      local name = ("blocks.%d.%s"):format(i, n)
      local shape = n:find("bias") and { 6 } or { 6, 4 }
      local v = T.randn(shape, #ps + 1)
      eng:add_param(name, v, T.randn(shape, #ps + 100))
      ps[#ps + 1] = { v = v, before = v:clone() }
    end
  end
  return ps
end

describe("a Muon group whose match selects no parameter", function()
  local cfg = { groups = { { name = "hidden", match = "blocks%.%d+%.attn%.weight" },
    { name = "rest", optimizer = "adamw" } } }

  it("fails the first step (and the next ones), naming the group, its pattern and the matrices; nothing changes", function()
    local eng = engine.new(cfg)
    local ps = model(eng)
    for _ = 1, 2 do
      local ok, err = pcall(eng.step, eng)
      assert.is_false(ok)
      assert.are.equal(E.EINVAL, E.code(err))
      has(err, "group 1 ('hidden') (muon: match = \"blocks%.%d+%.attn%.weight\") selects none of the 6 parameters "
        .. "(they are named like 'blocks.0.qkv.weight' [6, 4], 'blocks.0.qkv.bias' [6], 'blocks.0.mlp.weight' [6, 4] and 3 more)")
      has(err, "the model's 4 matrices ('blocks.0.qkv.weight' [6, 4], 'blocks.0.mlp.weight' [6, 4], "
        .. "'blocks.1.qkv.weight' [6, 4] and 1 more) go to group 2 ('rest') (adamw) instead")
    end
    for _, p in ipairs(ps) do H.assert_equal_bits(p.v, p.before) end
    assert.are.equal(0, eng:get("step"))
  end)

  it("is not an error when its match selects names that its exclude or min_dim leave out (a warning)", function()
    local eng = engine.new({ groups = { { name = "hidden", match = "blocks", exclude = "qkv", min_dim = 3 },
      { name = "rest", optimizer = "adamw" } } })
    model(eng)
    local err = H.stderr_of(function() eng:step() end)
    has(err, "muon: warning: config (table): group 1 ('hidden') (muon: match = \"blocks\", exclude = \"qkv\", "
      .. "min_dim = 3) takes no parameter: its match selects 'blocks.0.qkv.weight' [6, 4]")
    assert.are.equal(1, eng:get("step"))
  end)

  it("is a warning when the matrices go to another Newton-Schulz group (they still get it)", function()
    local eng = engine.new({ groups = { { name = "hidden", min_dim = 2 }, { name = "legacy", match = "nothing" },
      { name = "rest", optimizer = "adamw" } } })
    model(eng)
    local err = H.stderr_of(function() eng:step() end)
    has(err, "muon: warning: config (table): group 2 ('legacy') (muon: match = \"nothing\") selects none of the 6 parameters")
    assert.are.equal(1, eng:get("step"))
  end)

  it("from C: mu_engine_step is MU_EINVAL with the message", function()
    local path = H.config_file("return { groups = { { name = 'hidden', match = 'attn' }, { optimizer = 'adamw' } } }\n")
    local rc, ce = H.c_engine_open(path)
    assert.are.equal(0, rc)
    local w, g = ffi.new("float[6]"), ffi.new("float[6]", 1)
    local shape = ffi.new("int64_t[2]", 2, 3)
    assert.are.equal(0, C.mu_engine_add_param(ce, "mlp.weight", C.MU_F32, 2, shape, w, g))
    assert.are.equal(E.EINVAL, C.mu_engine_step(ce))
    has(ffi.string(C.mu_engine_error(ce)), "mu_engine_step: config '" .. path .. "': group 1 ('hidden') (muon: "
      .. "match = \"attn\") selects none of the 1 parameters")
    assert.are.equal(0, w[0])
    os.remove(path)
  end)

  it("muon check lists it as a problem", function()
    local text, problems = H.check_report("return { groups = { { name = 'hidden', match = 'attn' }, "
      .. "{ name = 'rest', optimizer = 'adamw' } } }\n", "mlp.weight 6 4\nmlp.bias 6\n")
    assert.truthy(text:find("mlp.weight", 1, true))
    assert.are.equal(1, #problems)
    has(problems[1], "group 1 ('hidden') (muon: match = \"attn\") selects none of the 2 parameters")
    has(problems[1], "the model's matrix ('mlp.weight' [6, 4]) goes to group 2 ('rest') (adamw) instead")
  end)
end)

describe("other groups left empty: a warning, once", function()
  it("a group whose match selects nothing, one shadowed by an earlier group; never a catch-all", function()
    local eng = engine.new({ groups = {
      { name = "hidden", match = "blocks", min_dim = 2 },
      { name = "conv", optimizer = "adamw", match = "conv" },
      { name = "qkv", optimizer = "adamw", match = "qkv%.weight" },
      { name = "rest", optimizer = "adamw", match = ".*" } } })
    model(eng)
    local err = H.stderr_of(function() eng:step() end)
    has(err, "muon: warning: config (table): group 2 ('conv') (adamw: match = \"conv\") selects none of the 6 parameters")
    has(err, "muon: warning: config (table): group 3 ('qkv') (adamw: match = \"qkv%.weight\") takes no parameter: it "
      .. "would take 'blocks.0.qkv.weight' [6, 4], 'blocks.1.qkv.weight' [6, 4], but group 1 ('hidden') takes them first")
    assert.falsy(err:find("group 4", 1, true), err)
    assert.are.equal("", H.stderr_of(function() eng:step() end)) -- once
    local _, warnings = eng:check_routes()
    assert.are.equal(2, #warnings)
  end)

  it("muon check lists them as warnings (exit status 0)", function()
    local cfg = H.config_file("return { groups = { { name = 'hidden', min_dim = 2 }, { name = 'conv', optimizer = 'adamw', "
      .. "match = 'conv' }, { name = 'rest', optimizer = 'adamw' } } }\n")
    local shapes = H.tmpname(".txt")
    H.write_file(shapes, "mlp.weight 6 4\nmlp.bias 6\n")
    local text, problems, warnings = require("muon.check").run(cfg, shapes)
    assert.truthy(text:find("mlp.weight", 1, true))
    assert.are.same({}, problems)
    assert.are.equal(1, #warnings)
    has(warnings[1], "group 2 ('conv') (adamw: match = \"conv\") selects none of the 2 parameters")
    os.remove(cfg)
    os.remove(shapes)
  end)
end)
