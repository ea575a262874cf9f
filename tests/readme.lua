-- The README's runnable blocks: a fenced code block right after a line
-- `<!-- test: NAME -->` is block NAME. tests/readme_spec.lua and
-- tests/install_spec.lua run them exactly as printed.
local R = {}

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
R.sh_quote = sh_quote

local function capture(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return out
end
R.capture = capture

-- Runs a shell command line; its stdout+stderr text and exit status.
local function run_status(cmd)
  local out = capture(cmd .. " 2>&1; echo \"__status=$?\"")
  local status = tonumber(out:match("__status=(%d+)%s*$"))
  return out:gsub("__status=%d+%s*$", ""), status
end
R.run_status = run_status

-- The source tree (absolute) and the build tree in use (build-san under SAN=1).
R.root = capture("cd " .. sh_quote((debug.getinfo(1, "S").source:match("^@(.*)/tests/[^/]*$")) or ".")
  .. " && pwd"):match("[^\n]+")
R.build = R.root .. "/" .. (os.getenv("MUON_BUILD") or "build")

function R.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

function R.write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

function R.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

function R.tmpdir()
  return capture("mktemp -d"):match("[^\n]+")
end

-- env(1) options that drop what a test run sets but a user's shell does
-- not have: make's variables (make test SAN=1 must not turn the recipe's
-- `make install` into a sanitizer build) and muon's search paths.
R.clean_env = "-u SAN -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MUON_BUILD -u MUON_LUA_PATH -u MUON_LIB -u LUA_PATH"

-- name -> text of every marked block (with its final newline).
function R.blocks(text)
  text = text or R.read(R.root .. "/README.md")
  local blocks, lines = {}, {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  local i = 1
  while i <= #lines do
    local name = lines[i]:match("^<!%-%- test: ([%w_%-]+) %-%->%s*$")
    if name then
      assert(lines[i + 1] and lines[i + 1]:match("^```"), "README: block '" .. name .. "' must start right after its marker")
      assert(blocks[name] == nil, "README: block '" .. name .. "' appears twice")
      local body, j = {}, i + 2
      while lines[j] and not lines[j]:match("^```%s*$") do
        body[#body + 1] = lines[j]
        j = j + 1
      end
      assert(lines[j], "README: block '" .. name .. "' is not closed")
      blocks[name] = table.concat(body, "\n") .. "\n"
      i = j
    end
    i = i + 1
  end
  return blocks
end

-- Runs a shell text (`set -e`, bash) in dir with extra environment
-- assignments (a list of "NAME=value"); returns output and exit status.
function R.run_sh(script, dir, env)
  local file = os.tmpname()
  R.write(file, "set -e\n" .. script)
  local out, status = run_status("cd " .. sh_quote(dir) .. " && env " .. table.concat(env or {}, " ")
    .. " bash " .. sh_quote(file))
  os.remove(file)
  return out, status
end

-- The numbers of a text, in order.
function R.numbers(text)
  local list = {}
  for n in text:gmatch("%-?%d+%.?%d*e?[%-+]?%d*") do list[#list + 1] = tonumber(n) end
  return list
end

return R
