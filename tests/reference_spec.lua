-- The API reference lives next to the code: every public Lua name has an
-- entry in its module's reference block (lua/muon/reference.lua defines the
-- format), every entry names something that exists, and every MU_API
-- declaration of the C headers (src/muon.h, the public API; src/muon_ffi.h,
-- the private FFI surface) has a comment right above it, each name in one
-- of them only. `muon help` and `make reference` print that same text.
local R = require("muon.reference")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function has(list, pattern)
  for _, s in ipairs(list) do
    if s:find(pattern, 1, true) then return true end
  end
  return false
end

local BIN = (os.getenv("MUON_BUILD") or "build") .. "/muon"

local function run(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"exit=$?\"")
  local out = p:read("*a")
  p:close()
  local status = tonumber(out:match("exit=(%d+)%s*$"))
  return out:gsub("exit=%d+%s*$", ""), status
end

describe("reference blocks of the Lua modules", function()
  for _, spec in ipairs(R.MODULES) do
    it(spec.name .. ": every public name has an entry, every entry names something", function()
      local mod = require(spec.name)
      local problems = R.check_module(spec, mod)
      assert(#problems == 0, "\n" .. table.concat(problems, "\n"))
    end)
  end

  it("the blocks find real names (not an empty check): Tensor:add, muon.engine.new, Optimizer:step", function()
    local keys = {}
    for _, spec in ipairs(R.MODULES) do
      for _, e in ipairs((R.load(spec))) do
        for _, h in ipairs(e.heads) do keys[h.key] = true end
      end
    end
    assert.is_true(keys["muon.blas_info"])
    assert.is_true(keys["muon.reference.check_module"])
    assert.is_true(keys["Tensor:add"])
    assert.is_true(keys["Tensor:exp_"]) -- from lua/muon/tensor_math.lua's block
    assert.is_true(keys["muon.engine.new"])
    assert.is_true(keys["Optimizer:step"])
    assert.is_true(keys["Engine:step"])
    assert.is_true(keys["muon.tensor.zeros"])
  end)
end)

describe("the checker reports what is missing (a fake module)", function()
  local fake = {
    documented = function() end,
    undocumented = function() end,
    _private = 1,
  }
  local methods = { run = function() end, hidden = function() end }
  local spec = {
    name = "fake.mod",
    files = { "fake/mod.lua" },
    classes = { Thing = function() return { "run", "hidden" } end },
    texts = { ["fake/mod.lua"] = table.concat({
      "-- A fake module.",
      "--[[ reference fake.mod",
      "fake.mod.documented(x)",
      "    Documented.",
      "fake.mod.ghost()",
      "    Names nothing.",
      "Thing:run()",
      "    A method.",
      "Thing:gone()",
      "    No such method.",
      "fake.mod.documented(x, y)",
      "    Twice.",
      "fake.mod.bare()",
      "not an entry line",
      "]]",
      "local M = {}",
    }, "\n") },
  }
  local problems = R.check_module(spec, fake)

  it("an undocumented function and method", function()
    assert.is_true(has(problems, "'fake.mod.undocumented' has no entry"), table.concat(problems, "\n"))
    assert.is_true(has(problems, "'Thing:hidden' has no entry"), table.concat(problems, "\n"))
    assert.is_false(has(problems, "'fake.mod.documented' has no entry"))
    assert.is_false(has(problems, "_private"))
    assert.is_nil(methods.nope)
  end)

  it("an entry naming nothing, an entry without a description, a stray line", function()
    assert.is_true(has(problems, "entry 'fake.mod.ghost' (line 5) names nothing"), table.concat(problems, "\n"))
    assert.is_true(has(problems, "entry 'Thing:gone' (line 9) names nothing"), table.concat(problems, "\n"))
    assert.is_true(has(problems, "fake/mod.lua:13: entry 'fake.mod.bare()' has no description"), table.concat(problems, "\n"))
    assert.is_true(has(problems, "fake/mod.lua:14: 'not an entry line' is not an entry"), table.concat(problems, "\n"))
    assert.is_true(has(problems, "'fake.mod.documented' has two entries (fake/mod.lua:3 and fake/mod.lua:11): keep one"),
      table.concat(problems, "\n"))
  end)

  it("a block that is missing or comes after code", function()
    local s = { name = "fake.mod", files = { "f.lua" }, texts = { ["f.lua"] = "local M = {}\n--[[ reference fake.mod\n]]\n" } }
    local p = R.check_module(s, { a = 1 })
    assert.is_true(has(p, "f.lua:1: no reference block"), table.concat(p, "\n"))
    assert.is_true(has(p, "'fake.mod.a' has no entry"), table.concat(p, "\n"))
  end)

  it("a strict module's valid names count as public", function()
    local strict = setmetatable({}, { __index = function(_, k)
      error("strict has no field '" .. tostring(k) .. "' (valid: lazy, other)", 0)
    end })
    local s = { name = "fake.mod", files = { "f.lua" }, texts = { ["f.lua"] = "--[[ reference fake.mod\nfake.mod.lazy\n    A lazy module.\n]]\n" } }
    local p = R.check_module(s, strict)
    assert.is_true(has(p, "'fake.mod.other' has no entry"), table.concat(p, "\n"))
    assert.is_false(has(p, "'fake.mod.lazy'"))
  end)

  it("the README names the options of the kinds and points to muon help; it writes none of their defaults", function()
    local readme = read("README.md")
    local K, kinds = require("muon.optim.kind"), require("muon.optim.kinds")
    for _, k in ipairs(K.KINDS) do
      assert.truthy(readme:find("muon help muon.optim." .. (k.class == "Muon" and "Muon" or ""), 1, true), k.class)
      for name in pairs(kinds.get(k.name).OPTIONS) do
        local at = readme:find("`" .. name .. "` [%d\"{%-]")
        assert.is_nil(at, ("%s: %s"):format(name, at and readme:sub(at, at + 40) or ""))
      end
    end
  end)

  -- (An option's default is written once, in its schema: the blocks write
  -- "opts.name = {default}" and muon help prints the schema's value.)
  it("options with a schema: defaults printed from it, never written by hand; every option named", function()
    local schema = { DEFAULTS = { lr = 0.02, betas = { 0.9, 0.999 }, eps = 1e-8, mode = "fast" },
      OPTIONS = { lr = true, betas = true, eps = true, mode = true, hook = true } }
    local s = { name = "fake.mod", files = { "f.lua" }, defaults = function(h)
      if h.key == "fake.mod.Opt" then return schema.DEFAULTS, schema.OPTIONS end
    end, texts = { ["f.lua"] = "--[[ reference fake.mod\nfake.mod.Opt(params, opts)\n"
      .. "    opts.lr = {default}, opts.betas = {default}\n    opts.eps = 1e-8: by hand.\n"
      .. "    opts.hook = {default}: none.\n]]\n" } }
    local p = R.check_module(s, { Opt = 1 })
    assert.is_true(has(p, "f.lua:2: 'fake.mod.Opt' writes the default of opts.eps (1e-8) by hand"), table.concat(p, "\n"))
    assert.is_true(has(p, "f.lua:2: 'fake.mod.Opt' does not name its option opts.mode"), table.concat(p, "\n"))
    assert.are.equal(2, #p, table.concat(p, "\n"))
    local entries = R.load(s)
    assert.same({ "    opts.lr = 0.02, opts.betas = {0.9, 0.999}", "    opts.eps = 1e-8: by hand.",
      "    opts.hook = nil: none." }, R.expand(s, entries[1]))
    -- the kinds: muon help prints each default of each schema
    local K, kinds = require("muon.optim.kind"), require("muon.optim.kinds")
    for _, k in ipairs(K.KINDS) do
      local text = R.lookup("muon.optim." .. k.class)
      for name, v in pairs(kinds.get(k.name).DEFAULTS) do
        local want = type(v) == "string" and ("%q"):format(v) or type(v) == "table" and "{" or tostring(v)
        assert.truthy(text:find("opts." .. name .. " = " .. want, 1, true) or type(v) == "number"
          and text:find("opts." .. name .. " = " .. ("%.10g"):format(v):gsub("e([-+])0*(%d)", "e%1%2"), 1, true),
          k.class .. "." .. name .. "\n" .. text)
      end
    end
  end)
end)

describe("src/muon.h and src/muon_ffi.h", function()
  local HEADERS = { "src/muon.h", "src/muon_ffi.h" }
  local text = read("src/muon.h")
  -- no problem from check(text, path) in either header
  local function each_header_clean(check)
    for _, path in ipairs(HEADERS) do
      local problems = check(read(path), path)
      assert(#problems == 0, "\n" .. table.concat(problems, "\n"))
    end
  end

  it("every MU_API declaration has a comment right above it", function()
    each_header_clean(R.check_header)
  end)

  it("the installed header is the small public API (at most 40 functions), the rest private", function()
    local public, private = #R.header_entries(text), #R.header_entries(read("src/muon_ffi.h"))
    assert.is_true(public >= 30 and public <= 40, "muon.h declares " .. public .. " functions")
    assert.is_true(private >= 90, "muon_ffi.h declares only " .. private .. " functions")
    -- the embedding API is public; the kernels are not
    local names = {}
    for _, e in ipairs(R.header_entries(text)) do names[e.name] = true end
    for _, n in ipairs({ "mu_engine_open", "mu_engine_step", "mu_engine_save", "mu_script_run", "mu_blas_fix_core",
                         "mu_strerror", "mu_version" }) do
      assert.is_true(names[n], n)
    end
    for _, n in ipairs({ "mu_tensor_new", "mu_cdef", "mu_file_check", "mu_ns_zeropower", "mu_comm_world" }) do
      assert.is_nil(names[n], n)
    end
  end)

  it("every MU_API name is declared once, in one header", function()
    local seen = {}
    for _, path in ipairs(HEADERS) do
      for _, e in ipairs(R.header_entries(read(path))) do
        assert(not seen[e.name], e.name .. " is declared in " .. tostring(seen[e.name]) .. " and " .. path)
        seen[e.name] = path
      end
    end
  end)

  it("every struct field and enum is documented", function()
    each_header_clean(R.check_header_types)
  end)

  it("the type checker reports an undocumented field and enum", function()
    local h = table.concat({
      "typedef struct mu_x {",
      "    int a; /* documented */",
      "    /* documented above */",
      "    int b;",
      "    int c;",
      "    int d; /* a comment over two lines;",
      "            * its second line holds a ';' */",
      "} mu_x;",
      "/* Documented. */",
      "enum { MU_A = 1 };",
      "",
      "enum { MU_B = 2 };",
    }, "\n")
    assert.are.same({ "x.h:5: field 'c' of mu_x has no comment", "x.h:12: enum 'MU_B' has no comment above it" },
      R.check_header_types(h, "x.h"))
  end)

  it("the checker reports an undocumented declaration (and parses multi-line ones)", function()
    local h = table.concat({
      "/* Documented. */",
      "MU_API int mu_a(int x);",
      "MU_API int mu_b(int x,",
      "                int y);",
      "",
      "/* Not directly above. */",
      "",
      "MU_API int mu_c(void);",
      "/*",
      " * A block.",
      " */",
      "MU_API void mu_d(void);",
    }, "\n")
    local e = R.header_entries(h)
    assert.are.same({ "mu_a", "mu_b", "mu_c", "mu_d" }, { e[1].name, e[2].name, e[3].name, e[4].name })
    assert.are.equal("MU_API int mu_b(int x,\n                int y);", e[2].decl)
    local p = R.check_header(h, "x.h")
    assert.are.same({ "x.h:3: MU_API mu_b has no comment right above it", "x.h:8: MU_API mu_c has no comment right above it" }, p)
  end)
end)

describe("muon help and the Markdown reference", function()
  it("muon help API prints every module and both headers, the private one said so", function()
    local out, status = run(BIN .. " help API")
    assert.are.equal(0, status, out)
    assert.truthy(out:find("== muon.tensor", 1, true))
    assert.truthy(out:find("Engine:step(closure)", 1, true))
    assert.truthy(out:find("MU_API int mu_engine_step(mu_engine *eng);", 1, true))
    local pub, priv = out:find("\n== C: muon.h ", 1, true), out:find("\n== C: muon_ffi.h ", 1, true)
    assert.truthy(pub and priv and pub < priv, out:sub(-2000))
    assert.truthy(out:find("src/muon_ffi.h): private: ", 1, true))
    local tensor_new = out:find("MU_API int mu_tensor_new(", 1, true)
    assert.truthy(tensor_new and tensor_new > priv)
  end)

  it("muon help NAME prints one entry; an unknown name exits 1", function()
    local out, status = run(BIN .. " help muon.engine.new")
    assert.are.equal(0, status, out)
    assert.truthy(out:find("muon.engine.new(config, opts)", 1, true), out)
    assert.falsy(out:find("Engine:step(", 1, true), out)
    out, status = run(BIN .. " help Tensor:add")
    assert.are.equal(0, status, out)
    assert.truthy(out:find("x + alpha*y", 1, true), out)
    out, status = run(BIN .. " help mu_engine_close")
    assert.are.equal(0, status, out)
    assert.truthy(out:find("MU_API void mu_engine_close", 1, true), out)
    assert.falsy(out:find("private", 1, true), out)
    out, status = run(BIN .. " help mu_tensor_new")
    assert.are.equal(0, status, out)
    assert.truthy(out:find("^%(muon_ffi%.h, private: [^\n]*not installed"), out)
    assert.truthy(out:find("MU_API int mu_tensor_new(", 1, true), out)
    out, status = run(BIN .. " help no_such_name_at_all")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("no reference entry for 'no_such_name_at_all'", 1, true), out)
  end)

  it("muon help finds C enums, constants, structs and fields, options, and entries by their last name segments", function()
    local cases = {
      { "MU_F32", "(muon.h constant)", "enum { MU_F32 = 0, MU_F64 = 1 };" },
      { "MU_EINVAL", "(muon.h constant of MU_ERRORS)", 'X(EINVAL, -1, "invalid argument")' },
      { "mu_engine_opts", "(muon.h struct)", "typedef struct mu_engine_opts {" },
      { "mu_engine_opts.lua_path", "(muon.h field of mu_engine_opts)", "const char *lua_path;" },
      { "trusted", "(muon.h field of mu_engine_opts)", "int trusted;" },
      { "trusted", "(muon.engine, option trusted)", "muon.engine.new(config, opts)" },
      { "MU_MAP_ADD", "(muon_ffi.h constant of mu_map_op, private", "x0 + alpha*x1" },
      { "zeropower", "(muon.ns)", "muon.ns.zeropower(x, opts)" },
      { "ns.zeropower", "(muon.ns)", "muon.ns.zeropower(x, opts)" },
      { "nesterov", "(muon.optim, option nesterov)", "muon.optim.Muon(params, opts)" },
    }
    for _, c in ipairs(cases) do
      local out, status = run(BIN .. " help " .. c[1])
      assert.are.equal(0, status, out)
      assert.truthy(out:find(c[2], 1, true), c[1] .. ": " .. out)
      assert.truthy(out:find(c[3], 1, true), c[1] .. ": " .. out)
    end
    -- every struct field and enum constant of the public header is found
    for _, t in ipairs(R.header_types(read("src/muon.h"))) do
      assert.truthy(R.lookup(t.name), t.name)
      if t.kind == "field" or t.kind == "constant" then assert.truthy(t.comment, t.name .. " has no comment") end
    end
  end)

  it("the Markdown has a section per module and every MU_API function of both headers", function()
    local md = R.markdown()
    for _, spec in ipairs(R.MODULES) do
      assert.truthy(md:find("## `" .. spec.name .. "`", 1, true), spec.name)
    end
    local private = md:find("## C: `muon_ffi.h`\n\nPrivate: ", 1, true)
    assert.truthy(private)
    for _, path in ipairs({ "src/muon.h", "src/muon_ffi.h" }) do
      for _, e in ipairs(R.header_entries(read(path))) do
        local at = md:find(e.decl, 1, true)
        assert.truthy(at, e.name)
        assert.are.equal(path == "src/muon_ffi.h", at > private, e.name)
      end
    end
  end)
end)
