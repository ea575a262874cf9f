-- `make install DESTDIR=<stage>` (PREFIX /usr/local) as a packager runs it:
-- the versioned library with its SONAME and symlinks, header, Lua modules,
-- CLI, configs and muon.pc; the README's C trainer (tests/readme.lua) built
-- out of tree against the staged files, from another directory, trains and
-- reports failures through its exit status; the Python package imports
-- from its staged directory; `make uninstall DESTDIR=<stage>` leaves
-- nothing behind.
local R = require("readme")

local q = R.sh_quote

local function run(cmd, dir) return R.run_status("cd " .. q(dir or "/") .. " && " .. cmd) end

local VERSION = R.read(R.root .. "/src/cdef.c"):match('mu_version%(void%) { return "([^"]+)"')
local MAJOR = VERSION:match("^(%d+)")

describe("make install DESTDIR=... / make uninstall DESTDIR=...", function()
  it("stages a versioned library, and the README's C trainer builds and runs against it out of tree", function()
    local stage, work = R.tmpdir(), R.tmpdir()
    local out, status = run("env " .. R.clean_env .. " make -s install DESTDIR=" .. q(stage), R.root)
    assert.are.equal(0, status, out)
    local d = stage .. "/usr/local"
    for _, f in ipairs({ "lib/libmuon.so." .. VERSION, "lib/libmuon.a", "lib/libmuon-cpu.so", "include/muon.h", "bin/muon",
                         "lib/pkgconfig/muon.pc", "share/lua/5.1/muon/init.lua",
                         "share/lua/5.1/muon/engine.lua", "share/lua/5.1/muon/optim/muon.lua",
                         "share/muon/configs/muon.lua" }) do
      assert.is_true(R.exists(d .. "/" .. f), "missing " .. f)
    end
    -- libmuon.so -> libmuon.so.0 -> libmuon.so.<version>, whose SONAME is libmuon.so.0
    assert.are.equal("libmuon.so." .. MAJOR .. "\n", R.capture("readlink " .. q(d .. "/lib/libmuon.so")))
    assert.are.equal("libmuon.so." .. VERSION .. "\n", R.capture("readlink " .. q(d .. "/lib/libmuon.so." .. MAJOR)))
    local dyn = R.capture("readelf -d " .. q(d .. "/lib/libmuon.so." .. VERSION))
    assert.truthy(dyn:find("(SONAME)", 1, true) and dyn:find("[libmuon.so." .. MAJOR .. "]", 1, true), dyn)
    -- the public header alone: the private one (src/muon_ffi.h) is not installed
    assert.are.equal("muon.h\n", R.capture("ls " .. q(d .. "/include")))
    -- muon.pc names the final prefix, not the staging directory
    assert.truthy(R.read(d .. "/lib/pkgconfig/muon.pc"):find("^prefix=/usr/local\n"))

    -- The README's trainer, built from another directory with only pkg-config
    -- pointed at the stage; nothing points at the source tree.
    R.write(work .. "/trainer.c", R.blocks()["c-trainer"])
    local env = "env " .. R.clean_env .. " PKG_CONFIG_PATH=" .. q(d .. "/lib/pkgconfig")
      .. " PKG_CONFIG_SYSROOT_DIR=" .. q(stage) .. " LD_LIBRARY_PATH=" .. q(d .. "/lib")
    out, status = run(env .. " sh -c 'cc trainer.c $(pkg-config --cflags --libs muon) -o trainer'", work)
    assert.are.equal(0, status, out)
    assert.truthy(R.capture("readelf -d " .. q(work .. "/trainer")):find("[libmuon.so." .. MAJOR .. "]", 1, true))
    local ldd = R.capture(env .. " ldd " .. q(work .. "/trainer"))
    assert.truthy(ldd:find("libmuon.so." .. MAJOR .. " => " .. d .. "/lib/", 1, true),
      "the staged library must be the one loaded (is another muon installed in /usr/local?):\n" .. ldd)

    local run_dir = R.tmpdir()
    out, status = run(env .. " " .. q(work .. "/trainer") .. " " .. q(d .. "/share/muon/configs/muon.lua"), run_dir)
    assert.are.equal(0, status, out)
    local l1 = tonumber(out:match("step%s+1%s+loss ([%d%.]+)"))
    local l1000 = tonumber(out:match("step 1000%s+loss ([%d%.]+)"))
    assert.are.equal(25.0, l1) -- sum over (i % 5 - 2)^2 for i = 0..11
    assert.is_true(l1000 < 0.1 * l1, out)
    assert.is_true(R.exists(run_dir .. "/minimal_opt.safetensors"), "checkpoint in the working directory")
    -- failures exit 1: a missing config, an unwritable checkpoint
    out, status = run(env .. " " .. q(work .. "/trainer") .. " missing.lua", run_dir)
    assert.are.equal(1, status, out)
    out, status = run(env .. " " .. q(work .. "/trainer") .. " " .. q(d .. "/share/muon/configs/muon.lua")
      .. " no/such/dir/x.safetensors", run_dir)
    assert.are.equal(1, status, out)

    -- the staged CLI finds the staged modules (from the library's own prefix)
    out, status = run(env .. " " .. q(d .. "/bin/muon") .. " info", run_dir)
    assert.are.equal(0, status, out)
    assert.truthy(out:find("lua modules%s+" .. (d .. "/share/lua/5.1"):gsub("%p", "%%%0")), out)
    -- the staged reference: the modules' blocks and the staged muon.h
    out, status = run(env .. " " .. q(d .. "/bin/muon") .. " help mu_engine_step", run_dir)
    assert.are.equal(0, status, out)
    assert.truthy(out:find("MU_API int mu_engine_step(mu_engine *eng);", 1, true), out)
    out, status = run(env .. " " .. q(d .. "/bin/muon") .. " help Engine:step", run_dir)
    assert.are.equal(0, status, out)
    assert.truthy(out:find("Engine:step(closure)", 1, true), out)
    -- a private call is not documented as installed
    out, status = run(env .. " " .. q(d .. "/bin/muon") .. " help mu_tensor_new", run_dir)
    assert.are.equal(1, status, out)
    out, status = run(env .. " " .. q(d .. "/bin/muon") .. " help API", run_dir)
    assert.are.equal(0, status, out)
    assert.truthy(out:find("== C: muon.h ", 1, true), out)
    assert.falsy(out:find("== C: muon_ffi.h", 1, true), out)
    -- errors from the staged modules blame the script's line, never a staged muon file
    R.write(run_dir .. "/blame.lua", "local T = require('muon').tensor\nlocal r = T.zeros({ 2 }):add({})\nreturn r\n")
    out, status = run(env .. " " .. q(d .. "/bin/muon") .. " run blame.lua", run_dir)
    assert.are.equal(1, status, out)
    assert.are.equal("muon: blame.lua:2: add: other must be a tensor or a number, got table", out:match("^[^\n]*"))
    assert.falsy(out:find("muon/[%w_/]+%.lua:%d"), out)

    -- the staged Lua loader asks the staged CPU probe (lib/libmuon-cpu.so,
    -- beside the library) for the OpenBLAS core before it loads the library:
    -- OpenBLAS then runs that core (the table's, as the probe reports it)
    local lua = "env " .. R.clean_env .. " -u OPENBLAS_CORETYPE LUA_PATH=" .. q(d .. "/share/lua/5.1/?.lua;"
      .. d .. "/share/lua/5.1/?/init.lua;;") .. " luajit -e " .. q("local m = require('muon') local b = m.blas_info() "
      .. "print(b.library, tostring(b.expected), b.core, os.getenv('OPENBLAS_CORETYPE'))")
    out, status = run(lua, run_dir)
    assert.are.equal(0, status, out)
    local lib, expected, running, env_core = out:match("^(%S+)%s+(%S+)%s+(%S+)%s+(%S+)")
    assert.are.equal(R.capture("realpath " .. q(d .. "/lib/libmuon.so")), R.capture("realpath " .. q(lib or "")), out)
    if expected ~= "nil" then
      assert.are.equal(expected, env_core, out)
      assert.are.equal(expected:lower(), running:lower(), out)
    end

    -- the Python package, in /usr/local's dist-packages for Debian's python3,
    -- its declarations the staged muon.h preprocessed, the library found
    -- from the prefix it was installed for (MUON_LIB here: it is staged)
    local py = R.exists("/usr/bin/python3") and "/usr/bin/python3" or "python3"
    local pyver = R.capture(q(py) .. " -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'"):match("[%d.]+")
    local pkg = d .. "/lib/python" .. pyver .. "/dist-packages/libmuon"
    for _, f in ipairs({ "__init__.py", "_lib.py", "optimizer.py", "muon_cdef.h", "_paths.py" }) do
      assert.is_true(R.exists(pkg .. "/" .. f), "missing " .. pkg .. "/" .. f)
    end
    assert.are.equal('LIBDIR = "/usr/local/lib"\n', R.read(pkg .. "/_paths.py"))
    local pre = R.capture("cc -E -P -DMU_FFI_CDEF " .. q(d .. "/include/muon.h") .. " | grep -v '^[[:space:]]*$'")
    assert.are.equal(pre, R.read(pkg .. "/muon_cdef.h"))
    local _, has = R.run_status(q(py) .. " -c 'import cffi, numpy'")
    if has == 0 then
      out, status = run("env " .. R.clean_env .. " -u PYTHONPATH MUON_LIB=" .. q(d .. "/lib/libmuon.so") .. " PYTHONPATH="
        .. q(d .. "/lib/python" .. pyver .. "/dist-packages") .. " " .. q(py) .. " -c " .. q("import libmuon, numpy as np; "
        .. "w = np.ones(3, np.float32); o = libmuon.AdamW([('b', w, np.ones(3, np.float32))], lr=0.5, weight_decay=0); o.step(); "
        .. "print(libmuon.__file__, libmuon._lib.CDEF, w[0])"), run_dir)
      assert.are.equal(0, status, out)
      local file, cdef, w0 = out:match("^(%S+) (%S+) (%S+)")
      assert.are.equal(pkg .. "/__init__.py", file, out)
      assert.are.equal(pkg .. "/muon_cdef.h", cdef, out)
      assert.is_true(math.abs(tonumber(w0) - 0.5) < 1e-6, out)
    end

    out, status = run("env " .. R.clean_env .. " make -s uninstall DESTDIR=" .. q(stage), R.root)
    assert.are.equal(0, status, out)
    assert.are.equal("", R.capture("find " .. q(stage) .. " -mindepth 1"))
    os.execute("rm -rf " .. q(stage) .. " " .. q(work) .. " " .. q(run_dir))
  end)
end)
