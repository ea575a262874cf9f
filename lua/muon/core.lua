-- Loads libmuon and its FFI declarations (generated from src/muon.h and
-- embedded in the library as mu_cdef(), so Lua never keeps a copy).
local ffi = require("ffi")

local core = {}

-- OpenBLAS reads OPENBLAS_CORETYPE once, when it is loaded. Debian's 0.3.21
-- picks a generic core on recent AMD CPUs, so choose from the CPU flags
-- before the library (and OpenBLAS with it) is loaded; a user's value wins.
local function cpu_core_type()
  local f = io.open("/proc/cpuinfo", "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local flags = text:match("\nflags%s*:([^\n]*)") or text:match("^flags%s*:([^\n]*)") or ""
  if flags:find(" avx512f") and flags:find(" avx512bw") and flags:find(" avx512vl") then
    return "SkylakeX"
  elseif flags:find(" avx2") then
    return "Haswell"
  end
  return nil
end
core.cpu_core_type = cpu_core_type

ffi.cdef [[
int setenv(const char *name, const char *value, int overwrite);
const char *mu__boot_cdef(void) __asm__("mu_cdef");
]]

local function here_dir()
  local src = debug.getinfo(1, "S").source
  return src:sub(1, 1) == "@" and src:sub(2):match("^(.*)/[^/]*$") or "."
end

local function try_load(path)
  local ok, lib = pcall(ffi.load, path)
  if ok then return lib end
  return nil, lib
end

local function host_has_library()
  return pcall(function() return ffi.C.mu__boot_cdef ~= nil end)
end

local function load_library()
  local env = os.getenv("MUON_LIB")
  if env and env ~= "" then
    local lib, err = try_load(env)
    if not lib then error("MUON_LIB=" .. env .. " could not be loaded: " .. tostring(err), 0) end
    return lib, env
  end
  if host_has_library() then return ffi.C, "(host)" end
  local dir = here_dir()
  local candidates = {
    dir .. "/../../build/libmuon.so", -- source tree: lua/muon -> build/
    dir .. "/../../../../lib/libmuon.so", -- installed: share/lua/5.1/muon -> lib/
    "libmuon.so",
  }
  local errs = {}
  for _, path in ipairs(candidates) do
    local lib, err = try_load(path)
    if lib then return lib, path end
    errs[#errs + 1] = path .. ": " .. tostring(err)
  end
  error("cannot find libmuon.so (run `make`, or set MUON_LIB):\n  " .. table.concat(errs, "\n  "), 0)
end

if (os.getenv("OPENBLAS_CORETYPE") or "") == "" then
  local ct = cpu_core_type()
  if ct then ffi.C.setenv("OPENBLAS_CORETYPE", ct, 1) end
end

local C, path = load_library()
ffi.cdef(ffi.string(C.mu__boot_cdef()))
core.C = C
core.path = path

-- Raise a Lua error for a failed status code, naming what was being done.
function core.check(rc, what, level)
  if rc ~= 0 then
    local detail = ffi.string(C.mu_last_error())
    local msg = (what and (what .. ": ") or "") .. (detail ~= "" and detail or ffi.string(C.mu_strerror(rc)))
    error(msg, (level or 2) + 1)
  end
end

return core
