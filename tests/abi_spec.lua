-- The library's exported surface and its ABI: libmuon.so exports muon.h's
-- functions under the symbol version MUON_0, muon_ffi.h's under
-- MUON_PRIVATE and nothing else (src/libmuon.map); the CPU probe exports
-- public functions only. The public ABI matches the committed baseline
-- (src/abi/libmuon.abi, `make abi-baseline`) up to additions
-- (tests/abi/abi.sh, libabigail); and that checker fails on each kind of
-- incompatible change, shown on a small library of its own.
local R = require("readme")
local q = R.sh_quote

local ABI = R.root .. "/tests/abi/abi.sh"
-- (the sanitizer runtime the specs may run under stays out of the tools)
local ENV = "unset LD_PRELOAD; "

local function header_names(path)
  local names = {}
  for name in R.read(path):gmatch("\nMU_API[^(]-([%w_]+)%(") do names[#names + 1] = name end
  return names
end

-- name -> "MUON_0" etc. of a library's exported functions (nm -D: "T name@@VERSION").
local function exported(lib)
  local out, status = R.run_status(ENV .. "nm -D --defined-only " .. q(lib))
  assert(status == 0, out)
  local map, count = {}, 0
  for kind, name, version in out:gmatch("%x+ (%a) ([%w_]+)@@([%w_]+)") do
    if kind ~= "A" then
      map[name] = version
      count = count + 1
    end
  end
  local unversioned = {}
  for line in out:gmatch("[^\n]+") do
    if not line:find("@", 1, true) and not line:find("^%x+ A ") then unversioned[#unversioned + 1] = line end
  end
  return map, count, unversioned
end

local function have_tools()
  return select(2, R.run_status("command -v abidw && command -v abidiff")) == 0
end

describe("exported symbols", function()
  local public = header_names(R.root .. "/src/muon.h")
  local private = header_names(R.root .. "/src/muon_ffi.h")

  it("libmuon.so: muon.h's functions under MUON_0, muon_ffi.h's under MUON_PRIVATE, nothing else", function()
    assert.is_true(#public >= 30 and #public <= 40, #public .. " public functions")
    local map, count, unversioned = exported(R.build .. "/libmuon.so")
    for _, n in ipairs(public) do assert.are.equal("MUON_0", map[n], n) end
    for _, n in ipairs(private) do assert.are.equal("MUON_PRIVATE", map[n], n) end
    assert.are.equal(#public + #private, count)
    assert.are.same({}, unversioned)
  end)

  it("libmuon-cpu.so: the core calls (switch_core too) and the error calls, public, under MUON_0", function()
    local map, count, unversioned = exported(R.build .. "/libmuon-cpu.so")
    local is_public = {}
    for _, n in ipairs(public) do is_public[n] = true end
    for name, version in pairs(map) do
      assert.is_true(is_public[name], name)
      assert.are.equal("MUON_0", version, name)
    end
    assert.are.equal("MUON_0", map.mu_blas_cpu_core)
    assert.are.equal("MUON_0", map.mu_blas_preset_core)
    assert.are.equal("MUON_0", map.mu_blas_switch_core)
    assert.are.equal("MUON_0", map.mu_last_error)
    assert.are.equal(6, count)
    assert.are.same({}, unversioned)
  end)
end)

describe("the public ABI (libabigail)", function()
  it("build/libmuon.so is compatible with src/abi/libmuon.abi", function()
    if not have_tools() then
      pending("abidw/abidiff missing (Debian abigail-tools; make deps installs it)")
      return
    end
    local lib = R.build .. "/libmuon.so"
    local sections = R.capture(ENV .. "readelf -S " .. q(lib))
    if not sections:find(".debug_info", 1, true) then
      pending("built without debug info (-g): nothing to compare")
      return
    end
    local out, status = R.run_status(ENV .. "bash " .. q(ABI) .. " check " .. q(R.root .. "/src/abi/libmuon.abi") .. " "
      .. q(lib) .. " " .. q(R.root .. "/src/muon.h"))
    assert.are.equal(0, status, out)
    assert.truthy(out:find("abi: compatible with ", 1, true), out)
  end)

  -- A library of three public functions and one private, versioned as
  -- libmuon (the header's functions under T_0, the others under T_PRIVATE),
  -- a baseline of it, then one change at a time: the verdict of
  -- tests/abi/abi.sh check.
  describe("the checker, on a small library", function()
    local HEADER = [[
#define MU_API __attribute__((visibility("default")))
/* A box. */
typedef struct mu_box {
    int a; /* a */
    double b; /* b */
} mu_box;
/* Doc. */
MU_API int mu_get(const mu_box *box);
/* Doc. */
MU_API int mu_scale(mu_box *box, double s);
/* Doc. */
MU_API void mu_clear(mu_box *box);
]]
    local SOURCE = [[
#include "t.h"
int mu_get(const mu_box *box) { return box->a; }
int mu_scale(mu_box *box, double s) { box->b *= s; return 0; }
void mu_clear(mu_box *box) { box->a = 0; box->b = 0; }
MU_API int mu_private(int x);
int mu_private(int x) { return x; }
]]
    local dir

    -- libt.so from the header and source texts
    local function build(header, source)
      R.write(dir .. "/t.h", header)
      R.write(dir .. "/t.c", source)
      local names = {}
      for name in header:gmatch("\nMU_API[^(]-([%w_]+)%(") do names[#names + 1] = name .. ";" end
      R.write(dir .. "/t.map", "T_0 { global: " .. table.concat(names, " ") .. " local: *; };\n"
        .. "T_PRIVATE { global: mu_*; };\n")
      local out, status = R.run_status(ENV .. "cd " .. q(dir) .. " && cc -shared -fPIC -g -O0 -fvisibility=hidden "
        .. "-Wl,-soname,libt.so.1 -Wl,--version-script=t.map -o libt.so t.c")
      assert(status == 0, out)
    end

    -- builds the library, runs check
    local function verdict(header, source)
      build(header, source)
      local out, status = R.run_status(ENV .. "bash " .. q(ABI) .. " check " .. q(dir .. "/base.abi") .. " " .. q(dir .. "/libt.so")
        .. " " .. q(dir .. "/t.h"))
      return status, out
    end

    local function sub(text, from, to)
      local i, j = text:find(from, 1, true)
      assert(i, from)
      return text:sub(1, i - 1) .. to .. text:sub(j + 1)
    end

    setup(function()
      if not have_tools() then return end
      dir = R.tmpdir()
      build(HEADER, SOURCE)
      local out, status = R.run_status(ENV .. "cd " .. q(dir) .. " && bash " .. q(ABI) .. " dump libt.so t.h > base.abi")
      assert(status == 0, out)
    end)
    teardown(function()
      if dir then os.execute("rm -rf " .. q(dir)) end
    end)

    local cases = {
      { "unchanged", 0, HEADER, SOURCE, "(0 functions added)" },
      { "a function added", 0, HEADER .. "/* Doc. */\nMU_API int mu_new(int x);\n",
        SOURCE .. "int mu_new(int x) { return x; }\n", "(1 functions added)" },
      { "a private function changed", 0, HEADER, sub(SOURCE, "int mu_private(int x) { return x; }",
        "int mu_private(int x, int y) { return x + y; }"):gsub("int mu_private%(int x%);", "int mu_private(int x, int y);"),
        "(0 functions added)" },
      { "a parameter's type changed", 1, sub(HEADER, "double s);", "float s);"), sub(SOURCE, "double s)", "float s)"),
        "INCOMPATIBLE" },
      { "a return type changed", 1, sub(HEADER, "MU_API int mu_get", "MU_API long mu_get"),
        sub(SOURCE, "int mu_get", "long mu_get"), "INCOMPATIBLE" },
      { "a struct grown at its end", 1, sub(HEADER, "    double b; /* b */\n", "    double b; /* b */\n    int c; /* c */\n"),
        SOURCE, "INCOMPATIBLE" },
      { "a struct member's type changed", 1, sub(HEADER, "    int a; /* a */", "    long a; /* a */"), SOURCE,
        "INCOMPATIBLE" },
      { "a function removed", 1, sub(HEADER, "/* Doc. */\nMU_API void mu_clear(mu_box *box);\n", ""),
        sub(SOURCE, "void mu_clear(mu_box *box) { box->a = 0; box->b = 0; }\n", ""), "INCOMPATIBLE" },
      { "a function left out of the header (still exported, under T_PRIVATE)", 1,
        sub(HEADER, "/* Doc. */\nMU_API void mu_clear(mu_box *box);\n", ""),
        sub(SOURCE, "void mu_clear", "MU_API void mu_clear(mu_box *box);\nvoid mu_clear"), "INCOMPATIBLE" },
    }
    for _, c in ipairs(cases) do
      it(c[1] .. ": " .. (c[2] == 0 and "compatible" or "incompatible"), function()
        if not have_tools() then
          pending("abidw/abidiff missing (Debian abigail-tools)")
          return
        end
        local status, out = verdict(c[3], c[4])
        assert.are.equal(c[2], status, out)
        assert.truthy(out:find(c[5], 1, true), out)
      end)
    end
  end)
end)
