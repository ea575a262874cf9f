-- Errors on each side of the sandbox membrane (lua/muon/sandbox/init.lua):
-- what a blocked call says, and what an error becomes when it crosses.
--
-- Errors cross both ways, wherever a call crosses: strings stay strings; a
-- muon error object (lua/muon/errors.lua) keeps its code and message;
-- anything else a config raises (a table, a proxy, nil...) reaches the host
-- as an MU_ELUA error object with its `msg` field or "(error object is a
-- <type> value)", never as the config's own value with the config's
-- metamethods. Calls across the membrane run under xpcall with E.capture,
-- which keeps the traceback of the first raise (on error objects, and on
-- the side for strings), so that what the C embedding shows still reaches
-- down to the config's lines.
local E = require("muon.errors")

local SE = {}

local sformat = string.format -- (called as a function: while sandboxed code runs, string methods are the sandbox's)

SE.HOW_TO_ALLOW = "trusted = true (muon run --trust SCRIPT / muon check --trust CONFIG, "
  .. "engine.new(path, { trusted = true }) in Lua, or mu_engine_opts.trusted = 1 with mu_engine_open_ex in C)"

function SE.blocked_message(what)
  return sformat("%s is blocked in sandboxed configs; to allow it load the config with %s", what, SE.HOW_TO_ALLOW)
end

-- The config's own line used something blocked (a member, a function, an
-- option): blamed on that line (E.blame).
function SE.blocked_error(what) E.blame(E.EINVAL, SE.blocked_message(what)) end

-- Host error objects handed to the config (as copies: the config may
-- change a copy's fields) -> the original, given back when the copy leaves
-- (export_error).
local ORIGINAL = setmetatable({}, { __mode = "k" })

-- The host error a copy stands for, or nil.
function SE.original(copy) return ORIGINAL[copy] end

-- Raise err (a host error object) inside the sandbox, as a copy.
function SE.raise_in_sandbox(err)
  local copy = E.new(err.code, err.msg)
  ORIGINAL[copy] = err
  error(copy, 0)
end

local function with_tb(obj, tb)
  if rawget(obj, "tb") == nil then obj.tb = tb end
  return obj
end

-- A host function raised err inside a call from the config: a string as it
-- is; a muon error object as a copy (code and message; its metatable is
-- protected, so the config cannot reach or change it); another host value,
-- which might hold host objects, as its message (with its code if it names
-- one).
function SE.import_error(err, tb)
  if type(err) == "string" then return err end
  local obj = ORIGINAL[err] or (E.is(err) and err or E.wrap(err)) -- (a copy of ours: its original)
  if not E.is(obj) then return obj end -- a message
  with_tb(obj, tb)
  local copy = E.new(obj.code, obj.msg)
  ORIGINAL[copy] = obj
  return copy
end

-- The config raised err, or let a host error through: strings and numbers
-- as they are; a host error object as the original (code, message and
-- traceback as the host raised them, whatever the config did to its copy);
-- anything else becomes an MU_ELUA object with the value's `msg` field or
-- "(error object is a <type> value)": the config cannot choose the status
-- code, and the host never calls the config's metamethods.
function SE.export_error(err, tb)
  local t = type(err)
  if t == "string" or t == "number" then return err end
  local orig = t == "table" and ORIGINAL[err]
  if orig then return with_tb(orig, tb) end
  return E.new(E.ELUA, E.message(err), tb)
end

return SE
