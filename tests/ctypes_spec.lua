-- libmuon in a host that loads it with dlopen(RTLD_LOCAL), as Python's
-- ctypes does by default (tests/fixtures/ctypes_host.py): the Lua C
-- modules the engine loads (cjson) must still find the Lua runtime, the
-- engine opens, takes a parameter and steps it to the hand-computed values,
-- errors read back through mu_engine_error_copy; the CPU probe
-- (libmuon-cpu.so), loaded first, sets OPENBLAS_CORETYPE only while the
-- process runs one thread; and mu_blas_info, laid out from src/muon.h
-- itself (cffi), is filled without a byte written past it. Skipped when
-- there is no python3.
local R = require("readme")
local q = R.sh_quote

local function python()
  if R.exists("/usr/bin/python3") then return "/usr/bin/python3" end
  local p = R.capture("command -v python3 2>/dev/null"):gsub("%s+$", "")
  return p ~= "" and p or nil
end

-- AdamW with lr 0.01, no decay, one step: w - 0.01 * g / (|g| + 1e-8).
local CONFIG = [[
return { groups = { { optimizer = "adamw", match = ".*", lr = 0.01, betas = { 0.9, 0.999 },
  eps = 1e-8, weight_decay = 0 } } }
]]

describe("libmuon in a Python host (ctypes, default dlopen flags)", function()
  it("opens an engine, registers a parameter and steps it; the CPU probe sets the core before", function()
    local py = python()
    if not py then
      pending("no python3 on this machine")
      return
    end
    local dir = R.tmpdir()
    local cfg = dir .. "/adamw.lua"
    R.write(cfg, CONFIG)
    -- the sanitizer build needs its runtime first in an uninstrumented host
    local pre = ""
    if R.build:find("build%-san$") then
      pre = "LD_PRELOAD=" .. q((R.capture((os.getenv("CC") or "cc") .. " -print-file-name=libasan.so"):gsub("%s+$", "")))
        .. " ASAN_OPTIONS=detect_leaks=0 "
    end
    local out = R.capture("cd " .. q(dir) .. " && env " .. R.clean_env .. " -u OPENBLAS_CORETYPE " .. pre .. q(py) .. " "
      .. q(R.root .. "/tests/fixtures/ctypes_host.py") .. " " .. q(R.build) .. " " .. q(cfg) .. " "
      .. q(R.root .. "/src/muon.h") .. " 2>&1")
    os.execute("rm -rf " .. q(dir))
    local v = {}
    for k, val in out:gmatch("([%w_]+)=([^\n]*)") do v[k] = val end
    assert.are.equal("1", v.done, out)

    -- the probe: refused while another thread ran, then set the table's core
    assert.are.equal("-8", v.preset_threaded, out) -- MU_ESTATE
    assert.are.equal("-", v.preset_threaded_env, out)
    assert.truthy(v.preset_threaded_msg:find("more than one thread", 1, true), out)
    assert.are.equal("0", v.preset, out)
    if v.cpu_core ~= "-" then
      assert.are.equal(v.cpu_core, v.preset_env, out)
      assert.are.equal(v.cpu_core:lower(), v.blas_core:lower(), out) -- OpenBLAS read it when it loaded
    end

    -- mu_blas_info as the header lays it out: filled, the guard bytes after it
    -- untouched; after a declaration without its last field (bf16, as an
    -- earlier fixture had it) the library's writes reach the guard
    assert.are.equal("0", v.blas_rc, out)
    assert.are.equal("1", v.blas_guard_intact, out)
    assert.are.equal("0", v.blas_guard_intact_without_bf16, out)
    assert.truthy(tonumber(v.blas_threads) >= 1, out)
    assert.truthy(v.blas_bf16:find("^oneDNN ") or v.blas_bf16:find("^none "), out)

    -- the engine (cjson loaded: the Lua runtime is reachable from its C modules)
    assert.are.equal("0", v.open, out)
    assert.are.equal("0", v.add_param, out)
    assert.are.equal("0", v.step, out)
    assert.are.equal("1.0", v.steps, out)
    local w = {}
    for x in v.w:gmatch("[^,]+") do w[#w + 1] = tonumber(x) end
    local want = { 1 - 0.01, 2 + 0.01, 3 - 0.01 }
    for i = 1, 3 do
      assert.is_true(math.abs(w[i] - want[i]) < 1e-6, ("w[%d] = %.9g, want %.9g"):format(i, w[i], want[i]))
    end
    assert.are.equal("-1", v.get_bad, out) -- MU_EINVAL
    assert.are.equal("0", v.error_copy, out)
    assert.truthy(v.error:find("mu_engine_get", 1, true) and v.error:find("no_such_key", 1, true), out)
  end)
end)
