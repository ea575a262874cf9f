-- Error objects that carry a status code across the C/Lua line.
--
-- muon's Lua code raises `E.raise(E.EINVAL, fmt, ...)` instead of a bare
-- string: the value is a table { code = <MU_E* number>, msg = <string> }
-- that behaves like its message for Lua callers (tostring, .., and the
-- string methods err:find / err:match / err:gsub work on it), and whose
-- code the C embedding (src/engine.c) returns as the status of the call.
-- An object has no "file:line: " position: its message names what failed.
-- Whatever a config hook, schedule or match function raises is tagged
-- MU_ELUA where the hook is called (E.call_hook), so C sees which side
-- failed.
--
--   local E = require("muon.errors")
--   E.raise(E.EINVAL, "group %d: lr must be >= 0, got %s", gi, v)
--   local ok, err = pcall(f); E.code(err)   --> MU_E* number (nil for a plain string)
--   E.name(E.ENONFINITE)                    --> "ENONFINITE"
--
-- The object type itself is in muon.core (core.check raises it).
local ffi = require("ffi")
local core = require("muon.core")
local C = core.C

local E = {}

-- The codes, from the C header's one table (MU_ERRORS in src/muon.h):
-- E.OK = 0, E.EINVAL = -1, ... and back, E.name(-1) = "EINVAL". Codes are
-- 0, -1, -2, ... (the header keeps them without gaps; the scan goes further
-- to be safe).
local BY_CODE = {}
for code = 0, -127, -1 do
  local name = ffi.string(C.mu_errname(code))
  if name ~= "UNKNOWN" then
    E[name] = code
    BY_CODE[code] = name
  end
end

-- The number of a code given as a number or a name ("EINVAL", "MU_EINVAL");
-- nil when it is not a failure code of the table.
local function resolve(code)
  if type(code) == "string" then code = rawget(E, (code:gsub("^MU_", ""))) end
  if type(code) == "number" and code < 0 and BY_CODE[code] then return code end
  return nil
end

E.is = core.is_error

-- A new error object. code: a MU_E* number (or its name); tb: optional
-- traceback text, shown by the C embedding instead of the raise point's.
function E.new(code, msg, tb)
  local c = resolve(code)
  if not c then error(("muon.errors: %s is not a failure code"):format(tostring(code)), 2) end
  return core.error_object(c, msg, tb)
end

-- Raise a coded error; fmt is formatted with the extra arguments, if any.
function E.raise(code, fmt, ...)
  local msg = select("#", ...) > 0 and fmt:format(...) or fmt
  error(E.new(code, msg), 0)
end

-- The code an error value carries, or nil (a plain string, another value).
-- Tables { code = <number or name>, msg = ... } raised by older code count.
function E.code(err)
  if type(err) ~= "table" then return nil end
  if E.is(err) then return err.code end
  return resolve(rawget(err, "code"))
end

function E.name(code) return BY_CODE[code] end

-- The message of any error value, without calling anything it may hold
-- (a table raised by a config may have metamethods of the config's): a
-- string as is, a number as text, a table's string `msg` field, else
-- "(error object is a <type> value)".
function E.message(err)
  local t = type(err)
  if t == "string" then return err end
  if t == "number" then return tostring(err) end
  if t == "table" and type(rawget(err, "msg")) == "string" then return rawget(err, "msg") end
  return ("(error object is a %s value)"):format(t)
end

-- The same error with a prefix on its message (code and traceback kept; a
-- value without a code gets the fallback code, or stays a plain string when
-- there is no fallback).
function E.wrap(err, prefix, fallback)
  local code = E.code(err) or fallback
  local msg = E.message(err)
  if prefix and prefix ~= "" then msg = prefix .. msg end
  if code == nil then return msg end
  return E.new(code, msg, type(err) == "table" and rawget(err, "tb") or nil)
end

-- Where an error was first raised. An error caught and raised again (by
-- the sandbox membrane, by E.call_hook) would otherwise show the traceback
-- of the second raise, without the config's lines: objects keep the first
-- one in their tb field; for a string (which has no fields), the last one
-- caught is remembered together with its text.
local last_string = { msg = nil, tb = nil }

-- The first traceback of err, if it was caught by E.capture before (nil
-- otherwise).
function E.traceback(err)
  if type(err) == "table" and type(rawget(err, "tb")) == "string" then return rawget(err, "tb") end
  if type(err) == "string" and err == last_string.msg then return last_string.tb end
  return nil
end

-- xpcall handler: { err, traceback where err was first raised }.
function E.capture(err)
  local tb = E.traceback(err)
  if tb == nil then
    tb = debug.traceback("", 2):gsub("^\n", "")
    if type(err) == "string" then last_string.msg, last_string.tb = err, tb end
  end
  return { err, tb }
end

-- The message of what a hook raised: E.message, or for a table without a
-- msg its __tostring (a trusted config's own; behind the sandbox membrane
-- such tables have already become error objects, lua/muon/sandbox.lua).
local function hook_message(err)
  if type(err) == "table" and type(rawget(err, "msg")) ~= "string" then
    local ok, s = pcall(tostring, err)
    if ok and type(s) == "string" then return s end
  end
  return E.message(err)
end

local function hook_result(what, ok, ...)
  if ok then return ... end
  local caught = ...
  local err, tb = caught[1], caught[2]
  last_string.msg, last_string.tb = nil, nil -- used: now on the object
  if E.is(err) and err.code == E.ELUA then
    err.tb = tb
    error(err, 0)
  end
  error(E.new(E.ELUA, what .. ": " .. hook_message(err), tb), 0)
end

-- Call a user hook (a function of the config: hook, schedule, match
-- function) and return its results. Whatever it raises comes back as an
-- MU_ELUA object "<what>: <message>", carrying the traceback down to the
-- line that raised.
function E.call_hook(what, fn, ...)
  return hook_result(what, xpcall(fn, E.capture, ...))
end

-- Raise an error object for a failed C status code (core.check).
E.check = core.check

-- A typo (E.EINVALL) is an error, not a nil code.
return setmetatable(E, {
  __index = function(_, k) error(("muon.errors: no code or function '%s'"):format(tostring(k)), 2) end,
})
