-- Shared test helpers: tensor comparison against references.
local muon = require("muon")
local T = muon.tensor

local H = {}

H.root = os.getenv("PWD") or "."
H.fixtures = "tests/fixtures"

-- Max |a - b| over all elements (a, b tensors or flat tables).
function H.max_abs_diff(a, b)
  local fa = type(a) == "table" and a or a:flat()
  local fb = type(b) == "table" and b or b:flat()
  assert(#fa == #fb, ("element counts differ: %d vs %d"):format(#fa, #fb))
  local m = 0
  for i = 1, #fa do
    local d = math.abs(fa[i] - fb[i])
    if d ~= d then return math.huge end
    if d > m then m = d end
  end
  return m
end

-- Every bit an engine keeps for the named parameters on this rank, as one
-- string: its step count first, then (sorted) the shapes describe() shows
-- and each parameter's value, state tensors (bfloat16 exactly, through
-- float64) and state scalars.
function H.engine_bits(eng, names)
  local parts = {}
  for _, row in ipairs(eng:describe()) do parts[#parts + 1] = row.name .. T.shape_string(row.shape) end
  for _, name in ipairs(names) do
    parts[#parts + 1] = name .. "=" .. table.concat(eng:param(name).value:clone("float64"):flat(), ",")
    for k, v in pairs(eng:state(name) or {}) do
      parts[#parts + 1] = name .. "/" .. k .. "="
        .. (T.is_tensor(v) and table.concat(v:clone("float64"):flat(), ",") or tostring(v))
    end
  end
  table.sort(parts)
  return eng:get("step") .. ";" .. table.concat(parts, ";")
end

-- Assert a and b agree elementwise within tol (absolute).
function H.assert_close(a, b, tol, what)
  local d = H.max_abs_diff(a, b)
  assert(d <= tol, ("%s: max abs diff %.3g > tol %.3g"):format(what or "tensors", d, tol))
  return d
end

-- Assert bitwise-equal float contents.
function H.assert_equal_bits(a, b, what)
  local fa, fb = a:flat(), b:flat()
  assert(#fa == #fb, (what or "tensors") .. ": element counts differ")
  for i = 1, #fa do
    if fa[i] ~= fb[i] and not (fa[i] ~= fa[i] and fb[i] ~= fb[i]) then
      error(("%s: element %d differs: %.17g vs %.17g"):format(what or "tensors", i, fa[i], fb[i]), 2)
    end
  end
end

-- What fn writes to io.stderr (io.stderr replaced while it runs; an error
-- in fn is raised again after io.stderr is restored).
function H.stderr_of(fn)
  local lines, saved = {}, io.stderr
  io.stderr = { write = function(_, ...) for _, x in ipairs({ ... }) do lines[#lines + 1] = x end end } -- luacheck: ignore 122
  local ok, err = pcall(fn)
  io.stderr = saved -- luacheck: ignore 122
  if not ok then error(err, 0) end
  return table.concat(lines)
end

function H.tmpname(suffix)
  return os.tmpname() .. (suffix or "")
end

function H.write_file(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
end

-- Fails unless tostring(msg) holds text (plain), showing both.
function H.has(msg, text)
  assert(tostring(msg):find(text, 1, true), ("expected %q in:\n%s"):format(text, tostring(msg)))
end

-- mu_engine_open(path) through the FFI, as a C trainer calls it: its status
-- and the engine (closed by the GC; nil when the open failed).
function H.c_engine_open(path)
  local ffi = require("ffi")
  local C = require("muon.core").C
  local box = ffi.new("mu_engine *[1]")
  local rc = C.mu_engine_open(box, path)
  return rc, rc == 0 and ffi.gc(box[0], C.mu_engine_close) or nil
end

-- muon.check.run on a config text and a shapes text (temporary files,
-- removed after): the report and its problems.
function H.check_report(config_text, shapes_text)
  local cfg, shapes = H.tmpname(".lua"), H.tmpname(".txt")
  H.write_file(cfg, config_text)
  H.write_file(shapes, shapes_text)
  local text, problems = require("muon.check").run(cfg, shapes)
  os.remove(cfg)
  os.remove(shapes)
  return text, problems
end

-- A new temporary .lua file holding text (a config); its path.
function H.config_file(text)
  local path = H.tmpname(".lua")
  H.write_file(path, text)
  return path
end

function H.read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- libc process calls used by the crash-during-save tests (fork, then
-- kill the child mid-save).
pcall(require("ffi").cdef, [[
int fork(void);
int kill(int pid, int sig);
int waitpid(int pid, int *status, int options);
void _exit(int status);
int usleep(unsigned int usec);
int getpid(void);
int access(const char *path, int mode);
]])
pcall(require("ffi").cdef, [[
typedef struct mu_test_dir mu_test_dir;
mu_test_dir *opendir(const char *name);
int closedir(mu_test_dir *d);
struct mu_test_dirent { uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type; char d_name[256]; };
struct mu_test_dirent *readdir(mu_test_dir *d);
struct mu_test_rlimit { unsigned long cur, max; };
int getrlimit(int resource, struct mu_test_rlimit *rl);
int setrlimit(int resource, const struct mu_test_rlimit *rl);
]])

-- Whether directory dir has an entry whose name contains substr (plain
-- match), without starting a process (fast enough to poll).
function H.dir_has(dir, substr)
  local ffi = require("ffi")
  local d = ffi.C.opendir(dir)
  if d == nil then return false end
  local found = false
  while true do
    local e = ffi.C.readdir(d)
    if e == nil then break end
    if ffi.string(e.d_name):find(substr, 1, true) then found = true break end
  end
  ffi.C.closedir(d)
  return found
end

-- Run fn with no file descriptor available (RLIMIT_NOFILE = 0: every
-- open fails with EMFILE, even for root); returns pcall's results.
function H.without_fds(fn, ...)
  local ffi = require("ffi")
  local RLIMIT_NOFILE = 7 -- Linux
  local old = ffi.new("struct mu_test_rlimit")
  assert(ffi.C.getrlimit(RLIMIT_NOFILE, old) == 0)
  local none = ffi.new("struct mu_test_rlimit", { 0, old.max })
  assert(ffi.C.setrlimit(RLIMIT_NOFILE, none) == 0)
  local function restore(...)
    assert(ffi.C.setrlimit(RLIMIT_NOFILE, old) == 0)
    return ...
  end
  return restore(pcall(fn, ...))
end

-- Save the OpenBLAS thread count and MU_NS_THREADS before each test of the
-- enclosing describe block and restore them after it (busted's hooks are
-- the spec's, not globals: pass them in). Returns with_threads(blas,
-- workers, fn): fn() run with OpenBLAS at `blas` threads and MU_NS_THREADS
-- = workers (nil: unset, so the worker count follows OpenBLAS), OpenBLAS
-- put back after it; fn's result.
function H.keep_threads(before_each, after_each)
  local ffi = require("ffi")
  local C = require("muon.core").C
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
  pcall(ffi.cdef, "int unsetenv(const char *name);")
  local saved_threads, saved_env
  before_each(function()
    saved_threads = muon.blas_info().threads
    saved_env = os.getenv("MU_NS_THREADS")
  end)
  after_each(function()
    C.mu_blas_set_threads(saved_threads)
    if saved_env then ffi.C.setenv("MU_NS_THREADS", saved_env, 1) else ffi.C.unsetenv("MU_NS_THREADS") end
  end)
  return function(blas, workers, fn)
    C.mu_blas_set_threads(blas)
    if workers then ffi.C.setenv("MU_NS_THREADS", tostring(workers), 1) else ffi.C.unsetenv("MU_NS_THREADS") end
    local r = fn()
    C.mu_blas_set_threads(saved_threads)
    return r
  end
end

-- Kill process pid (SIGKILL) as soon as `file` exists, i.e. while it is in
-- the middle of a save that writes that temporary file; returns true if it
-- was caught there, false if the file never appeared within `seconds`.
-- Polling for the file makes the "killed mid-save" tests independent of
-- timing (a fixed sleep can always miss the save).
-- `file` may also be a function: kill when it returns true.
function H.kill_when_exists(pid, file, seconds)
  local C = require("ffi").C
  local caught = false
  local exists = type(file) == "function" and file or function() return C.access(file, 0) == 0 end
  for _ = 1, math.floor((seconds or 10) * 20000) do
    if exists() then
      caught = true
      break
    end
    C.usleep(50)
  end
  C.kill(pid, 9)
  C.waitpid(pid, require("ffi").new("int[1]"), 0)
  return caught
end

-- A fresh empty directory, its removal, and its sorted entries.
function H.tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p '" .. p .. "'") == 0)
  return p
end

function H.rmrf(p) os.execute("rm -rf '" .. p .. "'") end

-- The target a symbolic link names (readlink), or nil.
function H.readlink(p)
  local f = io.popen("readlink '" .. p .. "'")
  local out = f:read("*l")
  f:close()
  return out
end

function H.listdir(p)
  local out = {}
  local f = io.popen("ls -A '" .. p .. "'")
  for line in f:lines() do out[#out + 1] = line end
  f:close()
  table.sort(out)
  return out
end

-- Float rounding references (the foreach and tensor maths specs). f32(x): x rounded
-- to float32. +, -, *, / and sqrt of float32 values computed in double and
-- rounded once to float32 are correctly rounded (53 >= 2*24 + 2), so
-- f32(a op b) mirrors the float32 operation exactly.
local ffi_ = require("ffi")
local f32box = ffi_.new("float[1]")
function H.f32(x)
  f32box[0] = x
  return f32box[0]
end

-- Correctly rounded float32 fma(a, b, c) for float32 a, b, c, in Lua: a*b
-- is exact in double; s = p + c rounds once and TwoSum gives the exact
-- error; the float32 rounding of s can only be wrong when s is exactly a
-- float32 midpoint, then the error's sign decides.
function H.fmaf(a, b, c)
  local f32 = H.f32
  local p = a * b
  local s = p + c
  local bb = s - p
  local err = (p - (s - bb)) + (c - bb)
  local r = f32(s)
  if err ~= 0 and r ~= s then
    local other = 2 * s - r
    if f32(other) == other then -- s is the midpoint of r and other
      if err > 0 then return math.max(r, other) else return math.min(r, other) end
    end
  end
  return r
end

-- float64 fma: the C library's (correctly rounded by IEEE 754 and C99).
pcall(ffi_.cdef, "double fma(double x, double y, double z);")
function H.fma(a, b, c) return ffi_.C.fma(a, b, c) end

-- Row-major element values of any tensor (strided or 0-d) read one by one
-- with :get, which computes the address itself (no strided loop).
function H.values(t)
  local dims, out = t:size(), {}
  local n = #dims
  if n == 0 then return { t:get() } end
  for _, d in ipairs(dims) do if d == 0 then return out end end
  local idx = {}
  for i = 1, n do idx[i] = 1 end
  while true do
    out[#out + 1] = t:get(unpack(idx))
    local i = n
    while i >= 1 do
      idx[i] = idx[i] + 1
      if idx[i] <= dims[i] then break end
      idx[i] = 1
      i = i - 1
    end
    if i == 0 then return out end
  end
end

-- Bitwise equality of two doubles up to NaN payloads: NaN matches NaN, and
-- 0 does not match -0.
function H.same(a, b)
  if a ~= a then return b ~= b end
  return a == b and (a ~= 0 or 1 / a == 1 / b)
end

-- Assert a list of values equals the expected list with H.same.
function H.assert_same(got, want, what)
  assert(#got == #want, ("%s: %d values, expected %d"):format(what or "values", #got, #want))
  for i = 1, #want do
    if not H.same(got[i], want[i]) then
      error(("%s: element %d is %.17g, expected %.17g"):format(what or "values", i, got[i], want[i]), 2)
    end
  end
end

-- 10 steps of an engine beside a reference. specs: { { name, shape,
-- adamw = (optional) } }; parameter i starts as T.randn(shape, 10 * i,
-- dtype) (init(w, spec) may change it) and its grad at each step is
-- T.randn(shape, 1000 * step + i, dtype). refs[name] = { value =, grad =,
-- shape =, adamw = } (flat lists) and list (the same, in the specs' order)
-- hold the reference's side: each step runs before(step, refs) (if given),
-- eng:step(), then ref(step, refs, list), which steps the reference. At the
-- end every parameter is within tol of its reference value. Returns ps
-- ({ name -> { w =, g = } }) and refs.
function H.trajectory(eng, specs, dtype, tol, ref, before, init)
  local ps, refs, list = {}, {}, {}
  for i, s in ipairs(specs) do
    local w = T.randn(s[2], 10 * i, dtype)
    if init then init(w, s) end
    local g = T.zeros(s[2], dtype)
    eng:add_param(s[1], w, g)
    ps[s[1]] = { w = w, g = g }
    refs[s[1]] = { value = w:flat(), shape = s[2], adamw = s.adamw }
    list[i] = refs[s[1]]
  end
  for step = 1, 10 do
    for i, s in ipairs(specs) do
      local g = T.randn(s[2], 1000 * step + i, dtype)
      ps[s[1]].g:copy(g)
      refs[s[1]].grad = g:flat()
    end
    if before then before(step, refs) end
    eng:step()
    ref(step, refs, list)
  end
  for _, s in ipairs(specs) do
    H.assert_close(ps[s[1]].w, refs[s[1]].value, tol, s[1] .. " " .. dtype)
  end
  return ps, refs
end

-- A copy of each tensor of a list (t:clone(dtype): dtype nil keeps t's).
function H.clones(list, dtype)
  local out = {}
  for i, t in ipairs(list) do out[i] = t:clone(dtype) end
  return out
end

-- The values of a list of tensors in one flat list, in order (H.values of
-- each).
function H.values_of(list)
  local vals = {}
  for _, r in ipairs(list) do
    for _, v in ipairs(H.values(r)) do vals[#vals + 1] = v end
  end
  return vals
end

-- fn() with MU_TENSOR_NOSIMD=1 (the portable kernels), then fn() with it
-- empty (the AVX2+FMA kernels where the CPU has them): both results.
pcall(ffi_.cdef, "int setenv(const char *name, const char *value, int overwrite);")
function H.portable_then_simd(fn)
  ffi_.C.setenv("MU_TENSOR_NOSIMD", "1", 1)
  local portable = fn()
  ffi_.C.setenv("MU_TENSOR_NOSIMD", "", 1)
  return portable, fn()
end

-- fn() with the environment variables of vars set (false: unset), then
-- restored (also when fn fails); fn's result.
pcall(ffi_.cdef, "int unsetenv(const char *name);")
function H.with_env(vars, fn)
  local saved = {}
  for k, v in pairs(vars) do
    saved[k] = os.getenv(k) or false
    if v then ffi_.C.setenv(k, v, 1) else ffi_.C.unsetenv(k) end
  end
  local ok, r = pcall(fn)
  for k, v in pairs(saved) do
    if v then ffi_.C.setenv(k, v, 1) else ffi_.C.unsetenv(k) end
  end
  if not ok then error(r, 0) end
  return r
end

-- Newton-Schulz inputs at every scale: the scales tests sweep (float32's
-- smallest subnormal to near its largest value), and randn with its
-- largest |value| 1, times s, as float32.
H.NS_SCALES = { 1e-45, 3e-44, 5e-43, 1e-40, 1e-38, 1e-35, 1e-30, 1e-25, 1e-20, 1e-16, 1e-14, 1e-12, 1e-11, 1e-10,
  1e-9, 1e-8, 1e-6, 1e-3, 1, 1e3, 1e8, 1e12, 0x1p40, 1e13, 1e20, 1e30, 1e36, 1e38, 3e38 }
function H.scaled_randn(shape, seed, s)
  local x = T.randn(shape, seed, "float64")
  return x:div(x:abs():amax()):mul(s):clone("float32")
end

H.T = T
H.muon = muon
return H
