-- Loads libmuon and its FFI declarations (generated from the C headers,
-- src/muon.h and src/muon_ffi.h, and embedded in the library as mu_cdef(),
-- so Lua never keeps a copy).
local ffi = require("ffi")

local core = {}

ffi.cdef [[
const char *mu__boot_cdef(void) __asm__("mu_cdef");
int mu__boot_preset_core(void) __asm__("mu_blas_preset_core");
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

-- OpenBLAS picks its kernels once, when it is loaded (Debian's 0.3.21 picks
-- a generic core on some recent CPUs). So before this loader loads a
-- library file, and OpenBLAS with it, it asks the CPU probe beside that file
-- (libmuon-cpu.so: the one core table, src/blas_core.c) to set
-- OPENBLAS_CORETYPE for this CPU. The probe refuses when that is too late
-- or unsafe (OpenBLAS loaded, another thread running); a value you set
-- always stays. A missing probe changes nothing.
local function preset_core(libpath)
  local probe = try_load((libpath:match("^(.*/)") or "") .. "libmuon-cpu.so")
  if probe then pcall(function() return probe.mu__boot_preset_core() end) end
end

local function load_file(path)
  preset_core(path)
  return try_load(path)
end

local function host_has_library()
  return pcall(function() return ffi.C.mu__boot_cdef ~= nil end)
end

-- The library, in order: the one that made this Lua state when a C host
-- runs it (src/lua_host.c records it in the registry: a path, or true for
-- the host program's own symbols), so a host never gets a second copy;
-- MUON_LIB; the host's own symbols; the source tree or install prefix of
-- these modules; the system's search path. (A host that linked libmuon.a
-- without exporting its symbols gets a second copy from the search.)
local function load_library()
  local embedded = debug.getregistry()["muon.library"]
  if embedded == true and host_has_library() then return ffi.C, "(host)" end
  if type(embedded) == "string" then
    local lib, err = try_load(embedded)
    if not lib then error("cannot load the host's libmuon " .. embedded .. " (" .. tostring(err) .. ")", 0) end
    return lib, embedded
  end
  local env = os.getenv("MUON_LIB")
  if env and env ~= "" then
    local lib, err = load_file(env)
    if not lib then
      error("MUON_LIB=" .. env .. " could not be loaded (" .. tostring(err) .. "); set MUON_LIB to the path of "
        .. "libmuon.so (build/libmuon.so after `make`, or <prefix>/lib/libmuon.so when installed), or unset it", 0)
    end
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
    local lib, err = load_file(path)
    if lib then return lib, path end
    errs[#errs + 1] = path .. ": " .. tostring(err)
  end
  error("cannot find libmuon.so: run `make` in the muon source tree, or set MUON_LIB to the path of libmuon.so; "
    .. "tried:\n  " .. table.concat(errs, "\n  "), 0)
end

local C, path = load_library()
ffi.cdef(ffi.string(C.mu__boot_cdef()))
core.C = C
core.path = path

-- The fastest OpenBLAS core this CPU supports ("SkylakeX", "Haswell"), or
-- nil: the C side's table (mu_blas_cpu_core).
function core.cpu_core_type()
  local s = ffi.string(C.mu_blas_cpu_core())
  if s == "" then return nil end
  return s
end

-- Error objects: { code = <MU_E* number>, msg = <string> }, raised instead
-- of bare strings wherever muon knows what went wrong, so that the C
-- embedding (src/engine.c) returns that code. For Lua callers an object
-- behaves like its message: tostring(err), err .. "x", and the string
-- methods (err:find, err:match, err:gsub, ...) work on it. Objects carry no
-- "file:line: " position (the message names what failed). The type lives
-- here because core.check raises it; lua/muon/errors.lua is the module to
-- use (names, wrapping, hooks).
local Error = {
  __metatable = "muon.error", -- protected: a sandboxed config cannot reach or change it
  __tostring = function(e) return e.msg end,
  __concat = function(a, b) return tostring(a) .. tostring(b) end,
  __index = function(_, k)
    -- through the string metatable: inside a sandboxed config that is the
    -- sandbox's string table (lua/muon/sandbox.lua), not the host's
    local f = ("")[k]
    if f ~= nil then return function(self, ...) return f(self.msg, ...) end end
    return nil
  end,
}

-- A new error object (code: a MU_E* number; tb: optional traceback text).
function core.error_object(code, msg, tb)
  return setmetatable({ code = code, msg = tostring(msg), tb = tb }, Error)
end

-- (By the protected metatable's name, not its identity: a module loaded
-- twice, as busted's insulation does, makes a second Error table.)
function core.is_error(x)
  return type(x) == "table" and getmetatable(x) == "muon.error"
end

-- Raise an error object for a failed status code, naming what was being
-- done; the code is the C status.
function core.check(rc, what)
  if rc ~= 0 then
    local detail = ffi.string(C.mu_last_error())
    local msg = (what and (what .. ": ") or "") .. (detail ~= "" and detail or ffi.string(C.mu_strerror(rc)))
    error(core.error_object(tonumber(rc), msg), 0)
  end
end

-- muon's own Lua files: the directory of this one ("@/.../lua/muon/" in the
-- source tree, "@<prefix>/share/lua/5.1/muon/" installed; optim/ is below
-- it). nil when this file was not loaded from a file (then nothing is
-- blamed).
local OWN = debug.getinfo(1, "S").source:match("^(@.*/)[^/]*$")

-- The position ("file:line: ") of the line that called into muon, found by
-- frame as LuaJIT's lj_err_caller finds the caller of a library function:
-- the nearest frame outside muon's own Lua files. When that frame is a C
-- function (pcall or xpcall, inside muon or around it; a C host's
-- lua_pcall) or there is none, nobody's line called muon: "". No level is
-- passed: whatever depth inside muon the misuse is found at, the first
-- frame that is not muon's is the caller. Only called on failure. (The
-- string library itself, not strings' methods: inside a sandboxed config
-- those are the sandbox's, lua/muon/sandbox.lua.)
local sub, getinfo = string.sub, debug.getinfo
function core.position()
  if OWN == nil then return "" end
  for level = 2, math.huge do
    local info = getinfo(level, "Sl")
    if info == nil or info.what == "C" then return "" end
    if sub(info.source, 1, #OWN) ~= OWN then
      if info.currentline > 0 then return info.short_src .. ":" .. info.currentline .. ": " end
      return ""
    end
  end
end

-- Make reading an unknown name of a module table an error listing the
-- valid ones, so that a typo (muon.optm) fails where it is made. extra:
-- optional list of names the module loads on first use.
function core.strict(t, what, extra)
  local mt = getmetatable(t) or {}
  local lazy = mt.__index
  mt.__index = function(tbl, k)
    if lazy then
      local v = lazy(tbl, k)
      if v ~= nil then return v end
    end
    local names = {}
    for name in pairs(tbl) do
      if type(name) == "string" and name:sub(1, 1) ~= "_" then names[#names + 1] = name end
    end
    for _, name in ipairs(extra or {}) do
      if rawget(tbl, name) == nil then names[#names + 1] = name end
    end
    table.sort(names)
    error(core.error_object(C.MU_EINVAL, core.position()
      .. ("%s has no field '%s' (valid: %s)"):format(what, tostring(k), table.concat(names, ", "))), 0)
  end
  return setmetatable(t, mt)
end

return core
