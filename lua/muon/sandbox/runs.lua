-- Bounded runs: a sandboxed config's load (R.run_bounded, from
-- lua/muon/config.lua) and each call of the host into a config function at
-- step time (R.call_bounded: the membrane's calls, and a trusted config's
-- functions when it sets hook_budget), each in a coroutine of its own under
-- the limits of lua/muon/sandbox/budget.lua; and loading source text only.
--
-- No JIT: the count hook does not fire inside compiled traces, so every
-- function of a sandboxed chunk (jit.off(chunk, true): nested functions
-- too), and every chunk the sandbox's own load() makes, runs interpreted,
-- for good (at step time as well). While a bounded load runs the JIT is off
-- and flushed for the whole VM, so host loops the config calls into are
-- counted too; it is switched back on afterwards.
local E = require("muon.errors")
local B = require("muon.sandbox.budget")
local N = require("muon.sandbox.nesting")
local St = require("muon.sandbox.strings")
local SE = require("muon.sandbox.errors")

local R = {}

local sbyte, smatch = string.byte, string.match -- (called as functions: the sandbox's string methods may be on)
local set_strings = St.set_strings

-- The sandbox a running config function belongs to (its box: see
-- R.new_box), for functions it hands to the host.
local cur = { box = nil }

function R.current_box() return cur.box end

-- Make box the running one; returns the previous one.
function R.set_box(box)
  local prev = cur.box
  cur.box = box
  return prev
end

-- The xpcall handler of the sandbox's own calls: E.capture as host code
-- (the host's string methods, no limit raised inside it; whoever called
-- xpcall restores both, also when this handler fails).
function R.capture(e)
  local prev, host = set_strings(St.HOST_STRING), B.set_host(true)
  local c = E.capture(e)
  B.set_host(host)
  set_strings(prev)
  return c
end
local capture = R.capture

-- (Was what xpcall(f, capture) gave the VM's own out-of-stack or
-- out-of-memory error? E.caught makes it an MU_ENOMEM object, which
-- crosses as it is.)
function R.exhausted(caught) return type(caught) ~= "table" or rawget(caught, "exhausted") end

-- (in the run's coroutine: tracebacks are taken there)
local function run_captured(f, ...) return xpcall(f, capture, ...) end

-- Run f() (a sandboxed chunk, without arguments) in its own coroutine
-- under limits { instructions, seconds, memory, what = "load" } (box: the
-- sandbox's, R.new_box). Returns true, result; or false, message, code: the
-- message of the exceeded limit or E.message of what f raised (no
-- metamethod of the config's runs); code MU_ENOMEM when memory, the Lua
-- stack or the nesting ran out (else nil: the config cannot choose it).
function R.run_bounded(f, limits, box)
  jit.off(f, true)
  local co = coroutine.create(run_captured)
  local prev = set_strings(St.SAFE_STRING)
  local bounded = not B.unbounded()
  local jit_on = jit.status()
  local d, prev_box = N.depth(), R.set_box(box)
  if bounded then
    jit.off()
    jit.flush()
    B.start(co, limits)
  end
  local resumed, ok, result = coroutine.resume(co, f)
  local err = bounded and B.stop(co)
  if bounded and jit_on then jit.on() end
  set_strings(prev)
  N.leave(d)
  R.set_box(prev_box)
  if err then return false, err.msg, err.code == E.ENOMEM and E.ENOMEM or nil end
  if not resumed then return false, E.message(ok) end
  if coroutine.status(co) ~= "dead" then return false, "coroutine.yield is not allowed in a config" end
  if ok then return true, result end
  local e = E.caught(result)
  local orig = SE.original(e) -- (a host error: never a field of the config's own value is read)
  local nomem = R.exhausted(result) or (orig and orig.code == E.ENOMEM)
  return false, E.message(orig or e), nomem and E.ENOMEM or nil
end

local function finish_call(co, d, resumed, ok, ...)
  local err = B.stop(co)
  N.leave(d)
  if err then
    if not ok then err.tb = select(2, E.caught((...))) end -- (where the limit was hit)
    error(err, 0)
  end
  if not resumed then error(E.exhausted(ok), 0) end
  if coroutine.status(co) ~= "dead" then error(E.yielded("a hook"), 0) end -- (a trusted config's coroutine.yield)
  if ok then return ... end
  local e, tb = E.caught((...))
  if E.is(e) and rawget(e, "tb") == nil then rawset(e, "tb", tb) end
  error(e, 0)
end

-- f(...) as one bounded run (limits as for R.run_bounded, what = "hook"):
-- its results, or raises what it raised; an exceeded limit raises an error
-- object naming it (field `limit`: "hook_budget.instructions", ...). Inside
-- a bounded run (a call nested in another) or under the host's own debug
-- hook, f(...) runs as it is.
function R.call_bounded(limits, f, ...)
  if B.unbounded() then return f(...) end
  local co = coroutine.create(run_captured)
  local d = N.depth()
  B.start(co, limits)
  return finish_call(co, d, coroutine.resume(co, f, ...))
end

-- A sandbox's box: the limits of its calls at step time (box.limits, set
-- by the loader once the config has returned; the default hook budget,
-- B.HOOK_BUDGET, until then) and the host wrappers of its functions.
function R.new_box()
  return { limits = nil, exported = setmetatable({}, { __mode = "kv" }) }
end

-- The limits of a call into box's functions.
function R.limits_of(box)
  local l = box.limits
  if l == nil then
    l = { what = "hook" }
    for k, v in pairs(B.HOOK_BUDGET) do l[k] = v end
  end
  return l
end

-- Does text hold a precompiled chunk (ESC first, or after a '#' first
-- line)? Mode "t" already keeps LuaJIT from reading one (and after a '#'
-- line it refuses bytecode as "malformed" by itself); this gives the
-- clearer message.
function R.is_bytecode(text)
  if sbyte(text, 1) == 35 then text = smatch(text, "^[^\n]*\n(.*)$") or "" end -- a #! line
  return sbyte(text, 1) == 27
end

-- load() for sandboxed code: source text only, in env (or the given
-- environment), never JIT-compiled.
function R.text_load(env, blocked)
  return function(chunk, name, mode, e)
    if mode ~= nil and mode ~= "t" or (type(chunk) == "string" and R.is_bytecode(chunk)) then
      blocked("load of bytecode")
    end
    if type(chunk) ~= "string" then blocked("load of a reader function") end
    if name ~= nil and type(name) ~= "string" then name = nil end
    local f, err = load(chunk, name, "t", e or env)
    if f then jit.off(f, true) end
    return f, err
  end
end

return R
