-- muon: the Muon optimizer engine. require("muon") loads the C core
-- (build/libmuon.so, $MUON_LIB, or the host's own symbols) through the FFI.
--[[ reference muon
    The top module. muon.<name> loads a submodule on first use; any other
    name raises an error listing the valid ones ("muon has no field 'optm'
    (valid: blas_info, check, comm, ...)"). Each submodule's reference is
    at the top of its file (`muon help API` prints them all).
muon._VERSION
    The version string ("0.2.0"), from mu_version().
muon.tensor
    The tensor module (muon.tensor, loaded with muon).
muon.param
    muon.param(name, value, grad): a named parameter (see muon.param).
muon.blas_info()
    The running OpenBLAS: { core = "SkylakeX", threads = 2, config = "...",
    expected = the fastest core for this CPU (mu_blas_cpu_core) or nil,
    library = the path of libmuon.so, bf16 = the bfloat16 products' path
    (oneDNN and its CPU ISA, or "none (...)") }. Warns once on stderr
    when a generic core (Prescott, Core2, Nehalem, Barcelona, Bulldozer)
    runs on a CPU that has a faster one: export
    OPENBLAS_CORETYPE=<expected> before starting.
muon.world()
    This process in the job: a read-only table { size = N, rank = R }
    (muon.comm.world_info: mpirun's world without initializing MPI, or
    the dry run's of muon check --world N --rank R; { size = 1, rank = 0 }
    for one process). Sandboxed configs have it too: one config for every
    rank count.
muon.clock()
    Seconds on a monotonic clock (CLOCK_MONOTONIC), for timing: the
    difference of two calls is the time between them.
muon.config_path(name)
    The path of a shipped config ("muon" or "muon.lua", "normuon",
    "adamw", ...): configs/ of the source tree, or <prefix>/share/muon/
    configs/ of an installed muon, found from where the modules live.
    EINVAL for a name that is not a plain file name, EIO when no such
    config is shipped (naming the paths tried).
muon.check
muon.comm
muon.dist
muon.engine
muon.errors
muon.foreach
muon.ns
muon.optim
muon.plot
muon.safetensors
muon.schedules
    The public submodules, loaded on first use (each documents itself).
muon.config
muon.core
muon.host
muon.router
muon.sandbox
muon.step
    Internal modules (config loading, the FFI loader, the C hosts' glue,
    routing, the config sandbox, the step protocol): reachable, but not an
    API; their functions may change.
]]
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")

local C = core.C
local muon = {
  _VERSION = ffi.string(C.mu_version()),
  tensor = require("muon.tensor"),
}
muon.param = require("muon.param")

-- { core = "SkylakeX", threads = 2, config = "...", expected = "SkylakeX",
--   bf16 = "oneDNN 2.6.3 avx512_core_bf16 (AVX512_BF16 instructions)" }.
-- Warns once (stderr) when OpenBLAS runs a generic core on a CPU that has a
-- fast one: that is a 7x slower sgemm.
local warned = false
function muon.blas_info()
  local info = ffi.new("mu_blas_info")
  core.check(C.mu_blas_get_info(info), "blas_info")
  local r = {
    core = ffi.string(info.core),
    config = ffi.string(info.config),
    threads = info.threads,
    bf16 = ffi.string(info.bf16), -- the bfloat16 products' path (oneDNN and its CPU ISA)
    expected = core.cpu_core_type(),
    library = core.path,
  }
  local generic = r.core:match("^Prescott") or r.core:match("^Core2") or r.core:match("^Nehalem")
    or r.core:match("^Barcelona") or r.core:match("^Bulldozer") or r.core:match("^Generic")
  if generic and r.expected and not warned then
    warned = true
    io.stderr:write(("muon: OpenBLAS runs its generic %s core on a CPU that supports %s; "
      .. "sgemm is several times slower. Fix: export OPENBLAS_CORETYPE=%s before starting.\n")
      :format(r.core, r.expected, r.expected))
  end
  return r
end

-- (Its contract: the reference block at the top.)
local READ_ONLY = function() error(E.new(E.EINVAL, E.position() .. "muon.world() is read-only"), 0) end
function muon.world()
  local size, rank = require("muon.comm").world_info()
  return setmetatable({}, { __index = { size = size, rank = rank }, __newindex = READ_ONLY, __metatable = false })
end

function muon.clock() return tonumber(C.mu_clock()) end

-- The path of a config shipped with muon ("muon" or "muon.lua", "normuon",
-- ...): configs/ of the source tree these modules are in, or
-- <prefix>/share/muon/configs/ of an installed muon. Found from where this
-- file lives, so scripts that use it run from any directory.
function muon.config_path(name)
  if type(name) ~= "string" or not name:match("^[%w_%-]+$") and not name:match("^[%w_%-]+%.lua$") then
    E.blame(E.EINVAL, "config_path: expected a shipped config's name such as 'muon' or 'adamw.lua', got " .. tostring(name))
  end
  local file = name:match("%.lua$") and name or (name .. ".lua")
  local lua_dir = debug.getinfo(1, "S").source:match("^@(.*)/muon/init%.lua$") or "."
  local tried = {}
  for _, dir in ipairs({ lua_dir .. "/../configs/", lua_dir .. "/../../muon/configs/" }) do
    local f = io.open(dir .. file, "r")
    if f then
      f:close()
      return dir .. file
    end
    tried[#tried + 1] = dir .. file
  end
  E.blame(E.EIO, "config_path: no shipped config '" .. file .. "' (looked for " .. table.concat(tried, ", ") .. ")")
end

-- The other modules load on first use (muon.engine, muon.ns, ...); any
-- other name is an error listing the valid ones (muon.optm is a typo, not
-- nil).
local MODULES = { "check", "comm", "config", "core", "dist", "engine", "errors", "foreach", "host", "ns", "optim",
  "plot", "router", "safetensors", "sandbox", "schedules", "step" }
local is_module = {}
for _, k in ipairs(MODULES) do is_module[k] = true end
setmetatable(muon, {
  __index = function(t, k)
    if not is_module[k] then return nil end
    local ok, mod = pcall(require, "muon." .. k)
    if not ok then error(E.wrap(mod, E.position()), 0) end -- (a string stays one)
    rawset(t, k, mod)
    return mod
  end,
})
core.strict(muon, "muon", MODULES)

return muon
