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

function H.tmpname(suffix)
  return os.tmpname() .. (suffix or "")
end

function H.write_file(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
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

-- Kill process pid (SIGKILL) as soon as `file` exists, i.e. while it is in
-- the middle of a save that writes that temporary file; returns true if it
-- was caught there, false if the file never appeared within `seconds`.
-- Polling for the file makes the "killed mid-save" tests independent of
-- timing (a fixed sleep can always miss the save).
function H.kill_when_exists(pid, file, seconds)
  local C = require("ffi").C
  local caught = false
  for _ = 1, math.floor((seconds or 10) * 20000) do
    if C.access(file, 0) == 0 then
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

function H.listdir(p)
  local out = {}
  local f = io.popen("ls -A '" .. p .. "'")
  for line in f:lines() do out[#out + 1] = line end
  f:close()
  table.sort(out)
  return out
end

H.T = T
H.muon = muon
return H
