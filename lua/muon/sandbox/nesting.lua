-- How deep sandboxed code nests library calls that call back into Lua from
-- C (the C stack), and the base functions a sandbox gets in counted form.
--
-- LuaJIT runs metamethods reached from bytecode, pcall and xpcall in the VM
-- itself (their depth is bounded by the Lua stack: "stack overflow",
-- MU_ENOMEM), but a few library functions call back into Lua from C, each
-- nesting a C frame: string.gsub (a function replacement, or a table's
-- __index), table.sort (the comparator, or the elements' __lt),
-- string.format (%s of a value with __tostring), print (tostring of its
-- arguments), os.time (its table's __index), the xpcall message handler,
-- and load with a reader function (refused). In the sandbox every such
-- callback runs through a shim counting the nesting; pcall, xpcall,
-- tostring and the membrane's crossings (a config calling a host function,
-- the host calling a config function) count too. Deeper than MAX_NESTING,
-- the call raises MU_ENOMEM "C stack: nested library calls deeper than N
-- (<function>)" before the C stack can overflow.
local E = require("muon.errors")
local B = require("muon.sandbox.budget")
local SE = require("muon.sandbox.errors")

local N = {}

local sformat = string.format -- (called as a function: while sandboxed code runs, string methods are the sandbox's)

-- Library calls that call back into Lua, nested deeper than this, raise.
-- (A string.gsub frame takes about 9 KB of C stack: 100 fit in 1 MB.)
N.MAX_NESTING = 100

local nest = { depth = 0 }

-- The depth now (whoever catches errors restores its own with N.leave).
function N.depth() return nest.depth end

-- One more nested library call (what: its name); returns the depth before
-- it, which the caller restores when the call returns (and every place
-- that catches errors restores its own: N.pcall, the membrane, the runs).
local function enter(what)
  local d = nest.depth
  if d >= N.MAX_NESTING then
    local err = E.new(E.ENOMEM, sformat("C stack: nested library calls deeper than %d (%s)", N.MAX_NESTING, what))
    err.limit = "nesting"
    SE.raise_in_sandbox(err)
  end
  nest.depth = d + 1
  return d
end
N.enter = enter

-- Back at depth d; returns the rest of its arguments.
local function leave(d, ...)
  nest.depth = d
  return ...
end
N.leave = leave

-- f as a callback of the library function `what`: counted while it runs.
function N.counted(f, what)
  return function(...) return leave(enter(what), f(...)) end
end

-- A table whose reads go to t, counted (for string.gsub's table
-- replacement, whose missing keys go to t's __index from C).
function N.counted_table(t, what)
  return setmetatable({}, { __index = function(_, k) return leave(enter(what), t[k]) end })
end

-- Would tostring(v) call a __tostring?
local function has_tostring(v)
  local mt = debug.getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end
N.has_tostring = has_tostring

-- v, or when tostring(v) would call its __tostring, a stand-in whose
-- __tostring makes that call counted.
function N.counted_tostring(v, what)
  if type(v) ~= "table" or not has_tostring(v) then return v end
  return setmetatable({}, { __tostring = function() return leave(enter(what), tostring(v)) end })
end

local function after_pcall(d, ok, ...)
  nest.depth = d
  if not ok and B.spent() then B.raise_spent() end
  return ok, ...
end

-- pcall and xpcall for sandboxed code: they never catch the budget error.
function N.pcall(f, ...) return after_pcall(enter("pcall"), pcall(f, ...)) end
function N.xpcall(f, handler, ...)
  return after_pcall(enter("xpcall"), xpcall(f, function(e)
    if B.spent() then return e end
    return leave(enter("xpcall handler"), handler(e))
  end, ...))
end

-- tostring and print for sandboxed code (print converts its arguments
-- first, so that the C function never calls back).
function N.tostring(...)
  local v = ...
  if select("#", ...) == 0 or type(v) ~= "table" then return tostring(...) end
  return leave(enter("tostring"), tostring(v))
end
function N.print(...)
  local n = select("#", ...)
  local t = { ... }
  for i = 1, n do t[i] = N.tostring(t[i]) end
  return print(unpack(t, 1, n))
end

-- os.time for sandboxed code: a table argument is read in Lua (its
-- __index, if any, runs counted), the C function gets a plain copy.
local TIME_FIELDS = { "sec", "min", "hour", "day", "month", "year", "isdst" }
function N.os_time(t)
  if type(t) ~= "table" then return os.time(t) end
  local plain, d = {}, enter("os.time")
  for _, k in ipairs(TIME_FIELDS) do plain[k] = t[k] end
  nest.depth = d
  return os.time(plain)
end

return N
