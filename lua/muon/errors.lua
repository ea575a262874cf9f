-- Error objects that carry a status code across the C/Lua line.
--
-- muon's Lua code raises `E.raise(E.EINVAL, fmt, ...)` instead of a bare
-- string: the value is a table { code = <MU_E* number>, msg = <string> }
-- that behaves like its message for Lua callers (tostring, .., and the
-- string methods err:find / err:match / err:gsub work on it), and whose
-- code the C embedding (src/engine.c) returns as the status of the call.
-- Whatever a config hook, schedule or match function raises is tagged
-- MU_ELUA where the hook is called (E.call_hook), so C sees which side
-- failed.
--
-- Positions. Messages for user mistakes name what the user controls
-- (option, parameter, file, their own line), never muon's own files, and
-- no level is ever counted or passed along:
-- * E.raise: no "file:line: " position; the message names what failed.
-- * E.blame: misuse of a public function (a bad argument, option, shape):
--   the message starts with the position of the user's line that called
--   into muon, found by frame (E.position: the nearest frame outside
--   muon's own Lua files; none when that is C: a pcall inside muon, a C
--   host). It is decided where the misuse is found, at any depth, and
--   costs nothing until then.
-- * A public function that runs muon's work under pcall raises what it
--   caught again with E.reraise (objects as they are).
-- Unknown names go through E.unknown / E.check_keys (valid names listed,
-- the closest one suggested).
--
--   local E = require("muon.errors")
--   E.raise(E.EINVAL, "group %d: lr must be >= 0, got %s", gi, v)
--   E.blame(E.EINVAL, "values must be a table")  -- in T.from
--   --> "train.lua:12: values must be a table"
--   E.check_keys(opts, { lr = true, momentum = true }, "option", "Muon")
--   --> "Muon: unknown option 'momentm' (did you mean 'momentum'?); valid options: lr, momentum"
--   E.unexpected("Muon", { "momentm" }, { lr = true, momentum = true })  -- constructors: the seed's text
--   --> "Muon got unexpected keyword arguments: momentm (did you mean 'momentum' for 'momentm'?); valid options: lr, momentum"
--   local ok, err = pcall(f); E.code(err)   --> MU_E* number (nil for a plain string)
--   E.name(E.ENONFINITE)                    --> "ENONFINITE"
--
-- The object type itself is in muon.core (core.check raises it).
--[[ reference muon.errors
    Error objects { code = MU_E* number, msg = text } that behave like
    their message (tostring, .., err:find, err:match, err:gsub) and carry a
    status code across the C/Lua line. Reading an unknown name raises.
muon.errors.OK
muon.errors.EINVAL
muon.errors.ENOMEM
muon.errors.EIO
muon.errors.EFORMAT
muon.errors.EDTYPE
muon.errors.ESHAPE
muon.errors.ENONFINITE
muon.errors.ESTATE
muon.errors.ELUA
muon.errors.ECOMM
    The status codes, from muon.h's MU_ERRORS table (0, -1, -2, ...):
    bad argument or value; out of memory; file missing or unreadable;
    malformed file; dtype; shape; NaN/Inf; wrong state; a user's Lua
    raised; MPI failure.
muon.errors.new(code, msg, tb)
    A new error object (code a number or its name; tb an optional
    traceback shown by the C embedding).
muon.errors.raise(code, fmt, ...)
    Raise an error object, fmt formatted with the arguments; no position.
muon.errors.blame(code, fmt, ...)
    Raise one for misuse of a public function, its message starting with
    the position of the user's line that called into muon (none when
    called from C or under a pcall inside muon).
muon.errors.position()
    That position ("file:line: ") or "".
muon.errors.reraise(err, fallback)
    Raise a caught error again: an object as it is, anything else as an
    object with code fallback.
muon.errors.wrap(err, prefix, fallback)
    The same error with a prefix on its message (code and traceback kept;
    without a code: fallback, or a plain string without one).
muon.errors.is(x)
    Whether x is an error object.
muon.errors.code(err)
    The code an error carries, or nil (a plain string, a table a config
    raised).
muon.errors.name(code)
    The code's name ("EINVAL"), or nil.
muon.errors.message(err)
    The message of any error value, without calling anything it holds.
muon.errors.value(v)
    A value as a message names it: a number or boolean as itself, a string
    as `the string "0.02"` (so that lr = "0.02" does not read as a
    number), anything else by its type ("a table").
muon.errors.check(rc, what)
    Raise an error object for a failed C status (mu_last_error() as the
    detail, prefixed by what).
muon.errors.unknown(what, bad, valid)
    "unknown option 'momentm' (did you mean 'momentum'?); valid options:
    lr, momentum" for a name or a list of names.
muon.errors.unexpected(cls, bad, valid)
    The seed's message for unknown constructor options, then suggestions
    and the valid names: "Muon got unexpected keyword arguments: momentm,
    zz (did you mean 'momentum' for 'momentm'?); valid options: lr,
    momentum".
muon.errors.check_keys(t, valid, what, where)
    Raise EINVAL "<where>: unknown ..." when t has keys outside the set
    valid.
muon.errors.closest(name, valid)
    The valid name closest to name, or nil when none is close.
muon.errors.distance(a, b)
    Edit distance (a swap of neighbours counts once).
muon.errors.capture(err)
    xpcall handler keeping the traceback cut to the user's frames.
muon.errors.caught(caught)
    The error and traceback from what xpcall(f, E.capture) returned (the
    VM's own stack and memory errors as ENOMEM objects).
muon.errors.exhausted(err)
    An ENOMEM object for the VM's out-of-stack or out-of-memory error.
muon.errors.traceback(err)
    The first traceback of err if E.capture saw it, else nil.
muon.errors.trim_traceback(tb)
    A traceback cut to the user's frames.
muon.errors.call_hook(what, fn, ...)
    Call a config function (hook, schedule, match); what it raises comes
    back as an ELUA object "<what>: <message>" with its traceback (ENOMEM
    when memory or stack ran out). It runs in a coroutine of its own: a
    coroutine.yield in it fails it (E.yielded).
muon.errors.call_hook_on(subject, what, fn, ...)
    call_hook naming subject ("parameter 'w'") when the call exceeds the
    hook budget.
muon.errors.yielded(what)
    The ELUA error of a coroutine.yield that reached what ("a hook", a
    call of the engine's): refused, nothing changed.
muon.errors.hook_seconds()
    Seconds spent in the calls of call_hook / call_hook_on so far (the
    outermost ones: a hook's own hook calls count once); a step's hook time
    is the difference over the step.
]]
local ffi = require("ffi")
local core = require("muon.core")
local C = core.C

local E = {}
local format = string.format -- (not the strings' method: a sandboxed caller's may differ)

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
  if not c then error(core.position() .. ("muon.errors: %s is not a failure code"):format(tostring(code)), 0) end
  return core.error_object(c, msg, tb)
end

-- Raise a coded error; fmt is formatted with the extra arguments, if any.
function E.raise(code, fmt, ...)
  local msg = select("#", ...) > 0 and format(fmt, ...) or fmt
  error(E.new(code, msg), 0)
end

-- The position ("file:line: ") of the line of the user's code that called
-- into muon (the nearest frame outside muon's own Lua files), or "" when
-- muon was called from C (a C host, pcall, xpcall): core.position.
E.position = core.position

-- Raise a coded error blamed on the user's line that called muon (see
-- E.position): for misuse of a public function (a bad argument, option or
-- shape), wherever inside muon it is found; no level to pass along. Called
-- under a pcall inside muon, or from a C host, the message has no position.
function E.blame(code, fmt, ...)
  local msg = select("#", ...) > 0 and format(fmt, ...) or fmt
  error(E.new(code, E.position() .. msg), 0)
end

-- The code an error value carries, or nil (a plain string, another value).
-- Only muon's own error objects carry one: a table a config or a hook
-- raises cannot choose the status code, whatever fields it has.
function E.code(err)
  if E.is(err) then return err.code end
  return nil
end

function E.name(code) return BY_CODE[code] end

-- A short description of a value, read raw (no metamethod is called).
local function describe_value(v)
  local t = type(v)
  if t == "string" then return ("%q"):format(#v > 40 and (v:sub(1, 40) .. "...") or v) end
  if t == "number" or t == "boolean" then return tostring(v) end
  return t
end

-- A value as a message names it (read raw: no metamethod is called): a
-- number, boolean or nil as itself, a string as 'the string "0.02"' (cut
-- at 40 bytes), else "a <type>".
function E.value(v)
  local t = type(v)
  if t == "string" then return "the string " .. describe_value(v) end
  if t == "number" or t == "boolean" or t == "nil" then return tostring(v) end
  return "a " .. t
end

-- The message of any error value, without calling anything it may hold
-- (a table raised by a config may have metamethods of the config's): a
-- string as is, a number as text, a table's string `msg` field, else a
-- description: '(error object is a table value: { n = 3, reason = "x" })'
-- or "(error object is a <type> value)".
function E.message(err)
  local t = type(err)
  if t == "string" then return err end
  if t == "number" then return tostring(err) end
  if t == "table" and type(rawget(err, "msg")) == "string" then return rawget(err, "msg") end
  if t == "table" then
    local keys = {}
    for k in next, err do
      if type(k) == "string" or type(k) == "number" then keys[#keys + 1] = k end
      if #keys > 8 then break end
    end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    local fields = {}
    for i = 1, math.min(#keys, 6) do
      local k = keys[i]
      fields[i] = (type(k) == "string" and k or ("[" .. k .. "]")) .. " = " .. describe_value(rawget(err, k))
    end
    if #keys > 6 then fields[#fields + 1] = "..." end
    if #fields > 0 then return "(error object is a table value: { " .. table.concat(fields, ", ") .. " })" end
  end
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

-- Raise a caught error again at the public edge: an error object as it is;
-- anything else as an object with the fallback code and its message.
function E.reraise(err, fallback)
  if E.is(err) then error(err, 0) end
  error(E.new(fallback, E.message(err)), 0)
end

-- Unknown names (options, keys, hooks): one message for every place that
-- checks names, listing the valid ones and the closest match.
--
--   E.unknown("option", { "momentm" }, { "lr", "momentum" })
--   --> "unknown option 'momentm' (did you mean 'momentum'?); valid options: lr, momentum"

-- Edit distance (insertions, deletions, substitutions; a swap of two
-- neighbours counts once).
local function distance(a, b)
  local la, lb = #a, #b
  if la == 0 then return lb end
  if lb == 0 then return la end
  local d = {}
  for i = 0, la do d[i] = { [0] = i } end
  for j = 0, lb do d[0][j] = j end
  for i = 1, la do
    local ca = a:byte(i)
    for j = 1, lb do
      local cb = b:byte(j)
      local cost = ca == cb and 0 or 1
      local v = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and ca == b:byte(j - 1) and a:byte(i - 1) == cb then
        v = math.min(v, d[i - 2][j - 2] + 1)
      end
      d[i][j] = v
    end
  end
  return d[la][lb]
end
E.distance = distance

-- The valid name closest to name, or nil when none is close (a few edits
-- for its length, the same name in other case, or one a prefix of the other).
function E.closest(name, valid)
  if type(name) ~= "string" then return nil end
  local lname = name:lower()
  local best, best_d
  for _, v in ipairs(valid) do
    local lv = tostring(v):lower()
    local d = distance(lname, lv)
    local limit = math.max(1, math.min(3, math.floor(#name / 3)))
    local prefix = #name >= 4 and (lv:sub(1, #lname) == lname or lname:sub(1, #lv) == lv)
    if (d <= limit or prefix) and (best_d == nil or d < best_d) then best, best_d = v, d end
  end
  return best
end

local function sorted_names(valid)
  local list = {}
  if #valid > 0 then
    for i, v in ipairs(valid) do list[i] = tostring(v) end
  else
    for k in pairs(valid) do list[#list + 1] = tostring(k) end
  end
  table.sort(list)
  return list
end

-- The message for unknown names bad (a name or a list) of a kind what
-- ("option", "key", "hook"), given the valid ones (a list or a set).
function E.unknown(what, bad, valid)
  if type(bad) ~= "table" then bad = { bad } end
  local names = sorted_names(valid)
  local parts = {}
  for i, b in ipairs(bad) do
    local s = type(b) == "string" and ("'" .. b .. "'") or tostring(b)
    local near = E.closest(b, names)
    if near then s = s .. (" (did you mean '%s'?)"):format(near) end
    parts[i] = s
  end
  return ("unknown %s%s %s; valid %ss: %s"):format(what, #bad > 1 and "s" or "", table.concat(parts, ", "),
    what, table.concat(names, ", "))
end

-- The seed's message for unknown constructor options of the class cls
-- ("Muon got unexpected keyword arguments: a, b": its text, names sorted),
-- then our suggestions and the valid names:
--
--   E.unexpected("Muon", { "momentm", "zz" }, { "lr", "momentum" })
--   --> "Muon got unexpected keyword arguments: momentm, zz (did you mean
--        'momentum' for 'momentm'?); valid options: lr, momentum"
function E.unexpected(cls, bad, valid)
  local names = sorted_names(valid)
  local list, near = {}, {}
  for i, b in ipairs(bad) do list[i] = tostring(b) end
  table.sort(list)
  for _, b in ipairs(list) do
    local n = E.closest(b, names)
    if n then near[#near + 1] = ("'%s' for '%s'"):format(n, b) end
  end
  return ("%s got unexpected keyword arguments: %s%s; valid options: %s"):format(cls, table.concat(list, ", "),
    #near > 0 and (" (did you mean " .. table.concat(near, ", ") .. "?)") or "", table.concat(names, ", "))
end

-- Raise EINVAL "<where>: unknown ..." when t has keys outside valid (a set);
-- where may be nil.
function E.check_keys(t, valid, what, where)
  local bad = {}
  for k in pairs(t) do
    if valid[k] == nil then bad[#bad + 1] = k end
  end
  if #bad == 0 then return end
  table.sort(bad, function(a, b) return tostring(a) < tostring(b) end)
  E.raise(E.EINVAL, "%s%s", where and (where .. ": ") or "", E.unknown(what, bad, valid))
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

-- A frame of muon's own Lua files (source tree lua/muon/..., installed
-- share/lua/5.1/muon/...), or of the C functions that call into them.
local function own_frame(line)
  return line:find("lua/muon/", 1, true) or line:find("5.1/muon/", 1, true)
    or line:find("^%s*%[C%]: in function '[xp]*pcall'") or line:find("^%s*%[C%]: in function 'error'")
    or line:find("^%s*%[C%]: in function 'assert'")
end

-- A traceback cut to the user's frames: from the deepest frame of the
-- user's code (frames of muon's files above it, where a library call the
-- hook made raised, are dropped) to the last consecutive frame of theirs
-- (where muon called the hook). Unchanged when it has no user frame.
function E.trim_traceback(tb)
  local head, body = tb:match("^(stack traceback:)\n(.*)$")
  if not head then return tb end
  local kept, started = {}, false
  for line in body:gmatch("[^\n]+") do
    if own_frame(line) then
      if started then break end
    elseif not line:find("^%s*%(tail call%)") then
      started = true
      kept[#kept + 1] = line
    end
  end
  if #kept == 0 then return tb end
  return head .. "\n" .. table.concat(kept, "\n")
end

local function capture(err)
  local tb = E.traceback(err)
  if tb == nil then
    tb = E.trim_traceback((debug.traceback("", 4):gsub("^\n", ""))) -- (above capture, pcall, E.capture)
    if type(err) == "string" then last_string.msg, last_string.tb = err, tb end
  end
  return { err, tb }
end

-- xpcall handler: { err, traceback where err was first raised, cut to the
-- user's frames (E.trim_traceback) }. Read what xpcall gave back with
-- E.caught: when the VM itself ran out of Lua stack or memory, the handler
-- (which needs both) fails too, and xpcall returns a string instead.
function E.capture(err)
  local ok, c = pcall(capture, err)
  if ok then return c end
  return { err, exhausted = true } -- (no stack or memory left for a traceback)
end

-- An MU_ENOMEM object for the VM's own out-of-stack or out-of-memory error
-- err (LuaJIT raises them as strings: "...: stack overflow", "not enough
-- memory"), naming the limit.
function E.exhausted(err)
  if E.is(err) and err.code == E.ENOMEM then return err end
  local m = E.message(err)
  local e
  if string.find(m, "stack overflow", 1, true) then -- (the string library: this may run in a sandbox's string context)
    e = E.new(E.ENOMEM, "Lua stack overflow: calls nested deeper than the Lua stack allows "
      .. "(65500 slots; endless recursion?)")
  elseif m == "not enough memory" then
    e = E.new(E.ENOMEM, "out of memory (Lua heap)")
  else
    e = E.new(E.ENOMEM, "out of Lua stack or memory while handling an error (" .. m .. ")")
  end
  e.limit = "Lua VM" -- (a limit: E.call_hook_on names the parameter)
  return e
end

-- The error and its traceback from what a failed xpcall(f, E.capture)
-- returned (the VM's own stack and memory errors as MU_ENOMEM objects).
function E.caught(caught)
  if type(caught) ~= "table" then return E.exhausted(caught), nil end -- the handler itself failed
  if rawget(caught, "exhausted") then return E.exhausted(caught[1]), nil end
  return caught[1], caught[2]
end

-- The message of what a hook raised: E.message, or for a table without a
-- msg its __tostring (a trusted config's own; behind the sandbox membrane
-- such tables have already become error objects, lua/muon/sandbox/errors.lua).
local function hook_message(err)
  if type(err) == "table" and type(rawget(err, "msg")) ~= "string" then
    local mt = debug.getmetatable(err)
    local f = type(mt) == "table" and rawget(mt, "__tostring")
    if type(f) == "function" then
      local ok, s = pcall(f, err)
      if ok and type(s) == "string" then return s end
    end
  end
  return E.message(err)
end

local function hook_result(what, subject, ok, ...)
  if ok then return ... end
  local err, tb = E.caught((...))
  last_string.msg, last_string.tb = nil, nil -- used: now on the object
  if E.is(err) and rawget(err, "hook") then -- named by an inner call_hook
    err.tb = tb or rawget(err, "tb")
    error(err, 0)
  end
  local msg = hook_message(err)
  -- (a limit of the hook budget, lua/muon/sandbox/budget.lua: which parameter's call hit it)
  if subject and E.is(err) and rawget(err, "limit") then msg = subject .. ": " .. msg end
  local e = E.new(E.code(err) == E.ENOMEM and E.ENOMEM or E.ELUA, what .. ": " .. msg, tb or rawget(err, "tb"))
  e.hook = what
  error(e, 0)
end

-- The error of a coroutine.yield that reached a call of muon's (a hook's,
-- or one of the engine's own calls): refused, since what it runs inside (a
-- step: its agreements, its commit) cannot be suspended and left.
function E.yielded(what)
  return E.new(E.ELUA, ("coroutine.yield inside %s: a hook must return, not yield (the call it runs in cannot be "
    .. "suspended; nothing was changed)"):format(what))
end

-- The time spent in config functions (E.hook_seconds: the outermost
-- calls only, a hook that calls another counts once).
local hook_depth, hook_spent = 0, 0
local mu_clock = C.mu_clock

-- A hook runs as the body of a coroutine of its own, so that a
-- coroutine.yield in it (a trusted config's) comes back here, failing the
-- hook, instead of suspending the caller's call (a step left half-way,
-- its engine busy for good once that coroutine is dropped).
local co_create, co_resume, co_status = coroutine.create, coroutine.resume, coroutine.status
local function captured(fn, ...) return xpcall(fn, E.capture, ...) end
local function hook_done(what, subject, t0, co, resumed, ...)
  hook_depth = hook_depth - 1
  if t0 then hook_spent = hook_spent + (mu_clock() - t0) end
  if not resumed then return hook_result(what, subject, false, (...)) end -- (the handler itself failed)
  if co_status(co) ~= "dead" then return hook_result(what, subject, false, { E.yielded("a hook") }) end
  return hook_result(what, subject, ...)
end

-- Call a user hook (a function of the config: hook, schedule, match
-- function) and return its results. Whatever it raises comes back as an
-- MU_ELUA object "<what>: <message>" (MU_ENOMEM when memory or stack ran
-- out), carrying the traceback down to the line that raised; a hook that
-- yields fails so (E.yielded).
function E.call_hook(what, fn, ...)
  return E.call_hook_on(nil, what, fn, ...)
end

-- E.call_hook for a hook that runs on one parameter or group: subject
-- ("parameter 'w'", "group 1 ('hidden')") is named in the message when
-- the call exceeds a limit of the hook budget.
function E.call_hook_on(subject, what, fn, ...)
  hook_depth = hook_depth + 1
  local t0 = hook_depth == 1 and mu_clock() or nil
  local co = co_create(captured)
  return hook_done(what, subject, t0, co, co_resume(co, fn, ...))
end

-- Seconds spent in config functions called through call_hook(_on) since
-- muon.errors loaded (the step's hook time is a difference of two calls).
function E.hook_seconds() return hook_spent end

-- Raise an error object for a failed C status code (core.check).
E.check = core.check

-- A typo (E.EINVALL) is an error, not a nil code.
return setmetatable(E, {
  __index = function(_, k) error(core.position() .. ("muon.errors: no code or function '%s'"):format(tostring(k)), 0) end,
})
