-- The membrane between a sandboxed config and the host (lua/muon/config.lua).
--
-- Tensors are FFI cdata (mu_tensor*): whoever holds one can read its raw
-- fields (t.data, t.dims[i] without bounds checks) and write them, which is
-- arbitrary memory access. So a sandboxed config never holds a tensor, a
-- pointer or a host object: every value crossing into the sandbox is
-- "imported" and every value coming out is "exported":
--
--   host -> sandbox (import)           sandbox -> host (export)
--   tensor cdata -> tensor proxy        tensor proxy -> the same cdata
--   object (table with a metatable,     object proxy -> the object
--     e.g. muon.param, an optimizer)
--     -> read-only object proxy
--   plain table -> deep copy            plain table -> deep copy (metatable dropped)
--   host function -> wrapper            sandbox function -> wrapper
--     (exports args, imports results)     (imports args, exports results)
--   other cdata/userdata -> error       numbers, strings, booleans: as is
--
-- Errors cross too, both ways, wherever a call crosses (see "errors"
-- below): strings stay strings; a muon error object (lua/muon/errors.lua)
-- keeps its code and message; anything else a config raises (a table, a
-- proxy, nil...) reaches the host as an MU_ELUA error object with its `msg`
-- field or "(error object is a <type> value)", never as the config's own
-- value with the config's metamethods.
--
-- A tensor proxy is a Lua table with a protected metatable whose methods are
-- the safe subset of muon.tensor's (no :ptr, :save, raw fields); the real
-- tensor lives in a private weak table the sandbox cannot reach. The config
-- file's result is exported before the engine sees it, so every hook,
-- schedule and match function runs behind the membrane.
local ffi = require("ffi")
local T = require("muon.tensor")
local E = require("muon.errors")

local S = {}

-- (The host's string functions, called as functions: while sandboxed code
-- runs, string methods are the sandbox's, SAFE_STRING, which charge the
-- budget.)
local sformat, sbyte, sfind, ssub, smatch = string.format, string.byte, string.find, string.sub, string.match

S.HOW_TO_ALLOW = "trusted = true (muon run --trust SCRIPT / muon check --trust CONFIG, "
  .. "engine.new(path, { trusted = true }) in Lua, or mu_engine_opts.trusted = 1 with mu_engine_open_ex in C)"

local function blocked_message(what)
  return sformat("%s is blocked in sandboxed configs; to allow it load the config with %s", what, S.HOW_TO_ALLOW)
end

-- The config's own line used something blocked (a member, a function, an
-- option): blamed on that line (E.blame).
function S.blocked_error(what) E.blame(E.EINVAL, blocked_message(what)) end

local REAL = setmetatable({}, { __mode = "k" })        -- proxy -> host value
local PROXY = setmetatable({}, { __mode = "kv" })      -- host value -> proxy
local EXPORTED = setmetatable({}, { __mode = "k" })    -- host wrapper -> sandbox function
local IMPORTED = setmetatable({}, { __mode = "k" })    -- sandbox wrapper -> host function
local IMPORT_OF = setmetatable({}, { __mode = "kv" })  -- host function -> sandbox wrapper

local import, export

local function map_all(f, box, n, ...)
  if n == 0 then return end
  local t = { ... }
  for i = 1, n do t[i] = f(t[i], nil, box) end
  return unpack(t, 1, n)
end
local function import_all(...) return map_all(import, nil, select("#", ...), ...) end
-- (box: the sandbox whose functions these are; see S.new_box)
local function export_all(box, ...) return map_all(export, box, select("#", ...), ...) end

-- ------------------------------------------------------- budget and strings
--
-- What bounds sandboxed code, and how (config.lua runs a config's load
-- through S.run_bounded; every call of the host into a config function at
-- step time, hooks, schedules, match functions, goes through the membrane,
-- call_config below, which runs it with S.call_bounded):
--
-- * Limits per run: a load, or one call of the host into the config (a
--   hook call; calls nested in it count towards it). `limits` =
--   { instructions, seconds, memory, what = "load" | "hook" }:
--   - instructions: a count hook (debug.sethook) fires every BUDGET_STEP VM
--     instructions of the coroutine the run uses and takes them off the
--     budget; the string and table functions whose C work grows with their
--     arguments (patterns, rep, concat, sort, unpack...) charge their worst
--     case (patterns: before the call) or their output (after the call) to
--     the same budget. At load time host functions are charged too (their
--     CPU time, and an estimate first for matmuls, Newton-Schulz and
--     optimizer steps: "host work" below); at step time they are not (a
--     hook's tensor maths is the step's own work) and count in `seconds`.
--   - seconds: CPU time (os.clock, the whole process), checked with the
--     instruction count and after host calls.
--   - memory: growth of the Lua heap (collectgarbage("count")) since the
--     run began, checked with the instruction count, after every GC cycle
--     (the GC probe, arm_gc_probe) and before string.rep; over the limit,
--     a full collection runs first, so that only what the run keeps counts.
--     (Tensor data is C memory outside the Lua heap: a failed allocation
--     there is MU_ENOMEM from the tensor call itself.)
--   Once a limit is exceeded the run's error stays: the sandbox's pcall and
--   xpcall re-raise it (an xpcall handler is not run for it), and so do a
--   host function's return and any later call into the config, until the
--   run returns. A host function the config called is never
--   stopped halfway (it may be in a collective with other ranks, or halfway
--   through its own state): the error is raised when it returns. The host
--   reports the limit's error, an error object (MU_ELUA for instructions
--   and time, MU_ENOMEM for memory) naming the limit, whatever the config
--   raised or returned.
-- * Nesting (the C stack). LuaJIT runs metamethods reached from bytecode,
--   pcall and xpcall in the VM itself (their depth is bounded by the Lua
--   stack: "stack overflow", MU_ENOMEM), but a few library functions call
--   back into Lua from C, each nesting a C frame: string.gsub (a function
--   replacement, or a table's __index), table.sort (the comparator, or the
--   elements' __lt), string.format (%s of a value with __tostring), print
--   (tostring of its arguments), os.time (its table's __index), the xpcall
--   message handler, and load with a reader function (refused). In the
--   sandbox every such callback runs through a shim counting the nesting;
--   pcall, xpcall, tostring and the membrane's crossings (a config calling
--   a host function, the host calling a config function) count too. Deeper
--   than MAX_NESTING, the call raises MU_ENOMEM "C stack: nested library
--   calls deeper than N (<function>)" before the C stack can overflow.
-- * No JIT. The count hook does not fire inside compiled traces, so every
--   function of a sandboxed chunk (jit.off(chunk, true): nested functions
--   too), and every chunk the sandbox's own load() makes, runs
--   interpreted, for good (at step time as well). While a bounded load runs
--   the JIT is off and flushed for the whole VM, so host loops the config
--   calls into are counted too; it is switched back on afterwards.
-- * String methods. The string metatable's __index is shared by every
--   string of the VM; while sandboxed code runs (a bounded load, a call
--   into a config function) it is SAFE_STRING (no string.dump, bounded
--   patterns), and the host's again while a host function the config calls
--   runs; restored on every return and error.
-- * Error values. What a config raises is turned into a message without
--   running its metamethods (E.message: a string, a number, a raw `msg`
--   field); sandbox-made tables leave the sandbox only as raw copies, so
--   the host never runs a config's __tostring, __index, __concat, __eq.
--   (__gc on tables is not run by LuaJIT in Lua 5.1 mode; the sandbox has
--   no newproxy, ffi or collectgarbage.)
--
-- Limits: when the host already runs a debug hook (profiler, debugger,
-- coverage) LuaJIT's single hook slot is left alone and nothing is
-- bounded but the nesting (patterns at step time are then still capped at
-- PATTERN_LIMIT steps per call, and so are groups' match patterns,
-- S.bounded_find). One VM instruction can still do work proportional to the
-- size of its operands (the .. operator on a huge string): such work is
-- bounded by the memory limit and by the CPU-time limit, which are checked
-- every BUDGET_STEP instructions and after every GC cycle, not instruction
-- by instruction. A load's budget error can stop a host function the config
-- called only once it returns; whatever it built belongs to the failed load.
local BUDGET_STEP = 10000
-- The GC's step multiplier during a bounded run (LuaJIT's default: 200).
local GC_STEPMUL = 2 ^ 30
-- Worst-case pattern steps allowed in one call at step time.
S.PATTERN_LIMIT = 1e8
-- Library calls that call back into Lua, nested deeper than this, raise.
-- (A string.gsub frame takes about 9 KB of C stack: 100 fit in 1 MB.)
S.MAX_NESTING = 100
-- The limits of one hook call at step time, unless the config's hook_budget
-- says otherwise (lua/muon/config.lua): far above what a sane hook takes.
S.HOOK_BUDGET = { instructions = 1e10, seconds = 300, memory = 2 ^ 30 }

local budget = {
  active = false, co = nil, what = "load",
  limit = 0, remaining = 0, step = BUDGET_STEP, forced = false,
  seconds = math.huge, deadline = math.huge,
  memory = math.huge, heap0 = 0,
  host = false, -- a host function the config called is running (a limit waits for its return)
  err = nil,    -- the error object, once a limit is exceeded
}

local function in_budget()
  return budget.active and coroutine.running() == budget.co
end

local function heap_bytes() return collectgarbage("count") * 1024 end

-- The Lua heap after the last full collection seen (ours, or a GC cycle's
-- end: the GC probe). A run whose heap has grown well past it starts with a
-- full collection, so that garbage left by the host does not hide what the
-- run allocates (at most one collection each time the heap doubles, as
-- LuaJIT's own GC does).
local live = { bytes = 0 }

local function collect()
  collectgarbage("collect")
  live.bytes = heap_bytes()
end

-- The error for the exceeded limit ("instructions", "seconds", "memory").
local function limit_error(which)
  local load = budget.what == "load"
  local msg, code
  if which == "seconds" then
    msg = sformat("exceeded the %s time limit of %g CPU seconds (%sendless loop?)", budget.what, budget.seconds,
      load and "" or "hook_budget.seconds; ")
    code = E.ELUA
  elseif which == "memory" then
    msg = sformat("exceeded the %s memory limit of %.0f bytes of Lua heap%s", budget.what, budget.memory,
      load and "" or " (hook_budget.memory)")
    code = E.ENOMEM
  else
    msg = sformat("exceeded the %s budget of %.0f Lua instructions (%sendless loop?)", budget.what, budget.limit,
      load and "" or "hook_budget.instructions; ")
    code = E.ELUA
  end
  local err = E.new(code, msg)
  err.limit = load and which or ("hook_budget." .. which)
  return err
end

-- Raise the run's error in sandboxed code (while a host function runs,
-- nothing: it raises when that function returns, in imported_results).
-- Once raised it is raised again wherever sandboxed code could go on: the
-- sandbox's pcall and xpcall, a host function's return, the host's next
-- call into the config (the hook itself stays quiet from then on: it could
-- fire inside an error handler).
local function raise_spent()
  if budget.host then return end
  error(budget.err.msg, 0)
end

local function exceed(which)
  budget.err, budget.remaining = limit_error(which), 0
  raise_spent()
end

-- The memory limit, with `extra` bytes about to be allocated.
local function check_memory(extra)
  if budget.memory == math.huge then return end
  if heap_bytes() + (extra or 0) - budget.heap0 <= budget.memory then return end
  collect() -- (only what the run keeps counts, not its garbage)
  if heap_bytes() + (extra or 0) - budget.heap0 > budget.memory then exceed("memory") end
end

local function hook()
  if coroutine.running() ~= budget.co or not budget.active or budget.err then return end
  if budget.forced then -- (by the GC probe: back to the usual interval, a full one charged)
    budget.forced = false
    debug.sethook(budget.co, hook, "", budget.step)
  end
  budget.remaining = budget.remaining - budget.step
  if budget.remaining <= 0 then return exceed("instructions") end
  if os.clock() > budget.deadline then return exceed("seconds") end
  check_memory()
end

-- The GC probe: a garbage object whose finalizer, at the end of every GC
-- cycle during a bounded run, makes the hook fire at the next instruction
-- (and arms the next probe). Instructions that copy huge strings (s .. s)
-- allocate a lot in few instructions; GC cycles follow the allocation, so
-- the CPU-time and memory limits are checked within a cycle's worth of
-- allocation rather than after BUDGET_STEP such instructions.
-- (One probe at a time: a run that finds one armed, by an earlier run
-- whose cycle has not ended yet, uses it.)
local probe = { armed = false }
local arm_gc_probe
arm_gc_probe = function()
  if probe.armed then return end
  probe.armed = true
  ffi.gc(ffi.new("char[1]"), function()
    probe.armed = false
    live.bytes = heap_bytes()
    if budget.active and not budget.err then
      budget.forced = true
      debug.sethook(budget.co, hook, "", 1)
      arm_gc_probe()
    end
  end)
end

-- Take n instructions' worth of work off the running budget (no-op
-- outside a bounded run); raises the budget error when it is spent.
function S.charge(n)
  if not in_budget() then return end
  if budget.err then return raise_spent() end
  budget.remaining = budget.remaining - n
  if budget.remaining <= 0 then exceed("instructions") end
end

-- S.charge for host work (time in host calls, estimates of big ones): at
-- load time only.
local function charge_host(n)
  if budget.what == "load" then S.charge(n) end
end

-- About to allocate n bytes of Lua heap (a string): within the memory limit?
local function charge_memory(n)
  if in_budget() and not budget.err then check_memory(n) end
end

-- -------------------------------------------------------------- nesting

local nest = { depth = 0 }

-- Host error objects handed to the config (as copies: the config may
-- change a copy's fields) -> the original, given back when the copy leaves
-- (export_error).
local ORIGINAL = setmetatable({}, { __mode = "k" })

-- Raise err (a host error object) inside the sandbox, as a copy.
local function raise_in_sandbox(err)
  local copy = E.new(err.code, err.msg)
  ORIGINAL[copy] = err
  error(copy, 0)
end

-- One more nested library call (what: its name); returns the depth before
-- it, which the caller restores when the call returns (and every place
-- that catches errors restores its own: S.pcall, the membrane, the runs).
local function enter(what)
  local d = nest.depth
  if d >= S.MAX_NESTING then
    local err = E.new(E.ENOMEM, sformat("C stack: nested library calls deeper than %d (%s)", S.MAX_NESTING, what))
    err.limit = "nesting"
    raise_in_sandbox(err)
  end
  nest.depth = d + 1
  return d
end

local function leave(d, ...)
  nest.depth = d
  return ...
end

-- f as a callback of the library function `what`: counted while it runs.
local function counted(f, what)
  return function(...) return leave(enter(what), f(...)) end
end

-- A table whose reads go to t, counted (for string.gsub's table
-- replacement, whose missing keys go to t's __index from C).
local function counted_table(t, what)
  return setmetatable({}, { __index = function(_, k) return leave(enter(what), t[k]) end })
end

local function has_tostring(v)
  local mt = debug.getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

-- v, or when tostring(v) would call its __tostring, a stand-in whose
-- __tostring makes that call counted.
local function counted_tostring(v, what)
  if type(v) ~= "table" or not has_tostring(v) then return v end
  return setmetatable({}, { __tostring = function() return leave(enter(what), tostring(v)) end })
end

local function after_pcall(d, ok, ...)
  nest.depth = d
  if not ok and budget.err and in_budget() then raise_spent() end
  return ok, ...
end

-- pcall and xpcall for sandboxed code: they never catch the budget error.
function S.pcall(f, ...) return after_pcall(enter("pcall"), pcall(f, ...)) end
function S.xpcall(f, handler, ...)
  return after_pcall(enter("xpcall"), xpcall(f, function(e)
    if budget.err and in_budget() then return e end
    return leave(enter("xpcall handler"), handler(e))
  end, ...))
end

-- tostring and print for sandboxed code (print converts its arguments
-- first, so that the C function never calls back).
function S.tostring(...)
  local v = ...
  if select("#", ...) == 0 or type(v) ~= "table" then return tostring(...) end
  return leave(enter("tostring"), tostring(v))
end
function S.print(...)
  local n = select("#", ...)
  local t = { ... }
  for i = 1, n do t[i] = S.tostring(t[i]) end
  return print(unpack(t, 1, n))
end

-- os.time for sandboxed code: a table argument is read in Lua (its
-- __index, if any, runs counted), the C function gets a plain copy.
local TIME_FIELDS = { "sec", "min", "hour", "day", "month", "year", "isdst" }
function S.os_time(t)
  if type(t) ~= "table" then return os.time(t) end
  local plain, d = {}, enter("os.time")
  for _, k in ipairs(TIME_FIELDS) do plain[k] = t[k] end
  nest.depth = d
  return os.time(plain)
end

-- Worst-case work of Lua pattern p on a subject of n characters. lstrlib's
-- matcher backtracks: from one start position, each quantified item (*, +,
-- -) may try up to n + 1 lengths for every way the items before it matched,
-- ? two, and %b and back-references (%1) scan up to n characters; an
-- unanchored search tries n + 1 start positions. Steps = starts * the
-- product of those choices * the number of items. (Malformed patterns are
-- left to the real function, which rejects them.)
local function pattern_cost(p, n)
  local len = #p
  local i, starts, factor, items = 1, n + 1, 1, 1
  if sbyte(p, 1) == 94 then starts, i = 1, 2 end -- ^
  while i <= len do
    local c = sbyte(p, i)
    local single = true
    if c == 40 or c == 41 then -- ( )
      single, i = false, i + 1
    elseif c == 37 then -- %
      local d = sbyte(p, i + 1)
      if d == 98 then -- %bxy
        factor, single, i = factor * (n + 1), false, i + 4
      elseif d == 102 then -- %f[set]
        single, i = false, i + 2
        local close = sfind(p, "]", i + (sbyte(p, i + 1) == 94 and 2 or 1) + 1, true)
        i = (close or len) + 1
      elseif d and d >= 49 and d <= 57 then -- %1-%9
        factor, single, i = factor * (n + 1), false, i + 2
      else
        i = i + 2
      end
    elseif c == 91 then -- [set]
      local j = i + 1
      if sbyte(p, j) == 94 then j = j + 1 end
      if sbyte(p, j) == 93 then j = j + 1 end -- a leading ] is literal
      while j <= len and sbyte(p, j) ~= 93 do
        j = j + (sbyte(p, j) == 37 and 2 or 1)
      end
      i = j + 1
    else
      i = i + 1
    end
    if single then
      items = items + 1
      local q = sbyte(p, i)
      if q == 42 or q == 43 or q == 45 then factor, i = factor * (n + 1), i + 1 -- * + -
      elseif q == 63 then factor, i = factor * 2, i + 1 end -- ?
    end
  end
  return starts * factor * items
end
S.pattern_cost = pattern_cost

-- Check (and charge) a pattern call before it runs.
local function check_pattern(name, s, p, init)
  if type(s) == "number" then s = tostring(s) end
  if type(p) == "number" then p = tostring(p) end
  if type(s) ~= "string" or type(p) ~= "string" then return end -- the real function says what is wrong
  local n = #s
  if type(init) == "number" then
    if init < 0 then init = n + init + 1 end
    if init > 1 then n = math.max(0, n - init + 1) end
  end
  local cost = pattern_cost(p, n)
  -- (at load time the budget alone bounds patterns; at step time, a call
  -- over PATTERN_LIMIT is refused as well, whatever the hook budget)
  if cost > S.PATTERN_LIMIT and not (in_budget() and budget.what == "load") then
    E.blame(E.EINVAL, sformat("string.%s: pattern '%s' on a subject of %d characters may take %.3g matching steps, "
      .. "more than the %.3g a sandboxed config may use in one call", name, #p > 40 and ssub(p, 1, 40) .. "..." or p,
      #s, cost, S.PATTERN_LIMIT))
  end
  S.charge(4 * cost) -- (a matching step costs a few VM instructions' time)
end

-- string.find(s, p) for a pattern the host got from a config (a group's
-- match list): refused, not run, when its worst case exceeds
-- PATTERN_LIMIT steps.
function S.bounded_find(s, p, what)
  local cost = pattern_cost(p, #s)
  if cost > S.PATTERN_LIMIT then
    E.raise(E.EINVAL, "%s: pattern '%s' on '%s' may take %.3g matching steps (more than %.3g); "
      .. "use fewer quantifiers (*, +, -) or a match function", what or "pattern", p, s, cost, S.PATTERN_LIMIT)
  end
  return string.find(s, p)
end

local function charged_result(r)
  if type(r) == "string" then S.charge(#r) end
  return r
end

-- The string library as sandboxed code sees it (methods on strings and the
-- config's `string` table): no dump, pattern functions checked first,
-- functions whose C work grows with their output charged for it.
local SAFE_STRING = {}
for k, v in pairs(string) do SAFE_STRING[k] = v end
S.SAFE_STRING = SAFE_STRING
SAFE_STRING.dump = function() S.blocked_error("string.dump") end
for _, name in ipairs({ "find", "match", "gmatch" }) do
  local f = string[name]
  SAFE_STRING[name] = function(s, p, init, ...)
    check_pattern(name, s, p, init)
    return f(s, p, init, ...)
  end
end
do
  local gsub = string.gsub
  SAFE_STRING.gsub = function(s, p, repl, n)
    check_pattern("gsub", s, p)
    if type(repl) == "function" then repl = counted(repl, "string.gsub")
    elseif type(repl) == "table" then repl = counted_table(repl, "string.gsub") end
    local r, count = gsub(s, p, repl, n)
    return charged_result(r), count
  end
  local rep = string.rep
  SAFE_STRING.rep = function(s, k, sep)
    if type(k) == "number" and k > 0 and (type(s) == "string" or type(s) == "number") then
      local n = k * (#tostring(s) + (type(sep) == "string" and #sep or 0))
      S.charge(n)
      charge_memory(n)
    end
    return rep(s, k, sep)
  end
  -- charged before, by the size of what they make, and called last (a tail
  -- call: an argument error then names the function and the config's line)
  local function len(s)
    if type(s) == "string" then return #s end
    if type(s) == "number" then return 24 end
    return 0
  end
  for _, name in ipairs({ "upper", "lower", "reverse" }) do
    local f = string[name]
    SAFE_STRING[name] = function(s, ...)
      S.charge(len(s))
      return f(s, ...)
    end
  end
  local sub, char, format = string.sub, string.char, string.format
  SAFE_STRING.sub = function(s, i, j, ...)
    if type(s) == "string" and in_budget() then
      local n = #s
      local a, b = tonumber(i) or 1, tonumber(j) or -1
      if a < 0 then a = n + a + 1 end
      if b < 0 then b = n + b + 1 end
      S.charge(math.max(0, math.min(b, n) - math.max(a, 1) + 1))
    end
    return sub(s, i, j, ...)
  end
  SAFE_STRING.char = function(...)
    S.charge(select("#", ...))
    return char(...)
  end
  SAFE_STRING.format = function(fmt, ...)
    local nargs = select("#", ...)
    if in_budget() then
      local n = len(fmt)
      for k = 1, nargs do n = n + len((select(k, ...))) end
      S.charge(n)
    end
    for k = 1, nargs do -- (%s of a value with __tostring calls it from C: counted)
      local v = select(k, ...)
      if type(v) == "table" and has_tostring(v) then
        local args = { ... }
        for j = k, nargs do args[j] = counted_tostring(args[j], "string.format") end
        return format(fmt, unpack(args, 1, nargs))
      end
    end
    return format(fmt, ...)
  end
end

local function less(a, b) return a < b end

-- table functions with C work that grows with their arguments.
function S.safe_table()
  local t = {}
  for k, v in pairs(table) do t[k] = v end
  local concat, sort = table.concat, table.sort
  t.concat = function(list, sep, i, j)
    if type(list) == "table" and in_budget() then -- (this loop is counted too)
      local n, step = 0, type(sep) == "string" and #sep or 0
      for k = tonumber(i) or 1, tonumber(j) or #list do
        local v = rawget(list, k)
        n = n + (type(v) == "string" and #v or 24) + step
      end
      S.charge(n)
      charge_memory(n)
    end
    return concat(list, sep, i, j)
  end
  t.sort = function(list, cmp)
    if type(list) == "table" then
      local n = #list
      S.charge(8 * n * math.max(1, math.log(n + 1) / math.log(2))) -- (8: a comparison's worth of instructions)
      -- (the comparator, or without one the elements' __lt, is called from C: counted)
      if type(cmp) == "function" then
        cmp = counted(cmp, "table.sort")
      elseif cmp == nil then
        for i = 1, n do
          local tv = type(rawget(list, i))
          if tv ~= "number" and tv ~= "string" then
            cmp = counted(less, "table.sort")
            break
          end
        end
      end
    end
    return sort(list, cmp)
  end
  -- insert and remove at a position shift the elements after it; maxn
  -- walks the whole table
  -- (at the end they are O(1): charged only with a position)
  local positional = { insert = 2, remove = 1, maxn = 0 }
  for name, nargs in pairs(positional) do
    local f = table[name]
    if f then
      t[name] = function(list, ...)
        if type(list) == "table" and select("#", ...) >= nargs then S.charge(#list) end
        return f(list, ...)
      end
    end
  end
  return t
end

function S.unpack(list, i, j)
  i = i or 1
  if type(list) == "table" then
    j = j or #list
    if type(i) == "number" and type(j) == "number" and j >= i then S.charge(j - i + 1) end
  end
  return unpack(list, i, j)
end

local string_mt = getmetatable("")
local HOST_STRING = string_mt.__index

-- Point the string metatable at index (SAFE_STRING or HOST_STRING) and
-- return the previous one.
local function set_strings(index)
  local prev = string_mt.__index
  string_mt.__index = index
  return prev
end

-- ------------------------------------------------------------ bounded runs

-- The sandbox a running config function belongs to (its box: see
-- S.new_box), for functions it hands to the host.
local cur = { box = nil }

local function start(co, limits)
  budget.active, budget.co, budget.err, budget.forced, budget.host = true, co, nil, false, false
  budget.what = limits.what or "hook"
  budget.limit = limits.instructions or math.huge
  budget.remaining = budget.limit
  budget.seconds = limits.seconds or math.huge
  budget.deadline = os.clock() + budget.seconds
  budget.memory = limits.memory or math.huge
  if budget.memory < math.huge and heap_bytes() > 2 * live.bytes + 2 ^ 20 then collect() end
  budget.heap0 = heap_bytes()
  budget.step = math.max(1, math.min(BUDGET_STEP, math.floor(budget.limit)))
  -- (GC cycles that finish within an allocation or two, not after many:
  -- the GC probe then fires each time a huge string doubles)
  budget.stepmul = collectgarbage("setstepmul", GC_STEPMUL)
  debug.sethook(co, hook, "", budget.step)
  arm_gc_probe()
end

-- End the run; its limit error, if one was exceeded.
local function stop(co)
  debug.sethook(co)
  collectgarbage("setstepmul", budget.stepmul)
  live.bytes = math.min(live.bytes, budget.heap0) -- (what the run made is garbage now, mostly)
  local err = budget.err
  budget.active, budget.co, budget.err, budget.host = false, nil, nil, false
  return err
end

-- The xpcall handler of the sandbox's own calls: E.capture as host code
-- (the host's string methods, no limit raised inside it; whoever called
-- xpcall restores both, also when this handler fails).
local function capture(e)
  local prev, host = set_strings(HOST_STRING), budget.host
  budget.host = true
  local c = E.capture(e)
  budget.host = host
  set_strings(prev)
  return c
end

-- (Was what xpcall(f, capture) gave the VM's own out-of-stack or
-- out-of-memory error? E.caught makes it an MU_ENOMEM object, which
-- crosses as it is.)
local function exhausted(caught) return type(caught) ~= "table" or rawget(caught, "exhausted") end

-- (in the run's coroutine: tracebacks are taken there)
local function run_captured(f, ...) return xpcall(f, capture, ...) end

-- May the host's own debug hook be there (then nothing is bounded)?
local function unbounded() return budget.active or debug.gethook() ~= nil end

-- Run f() (a sandboxed chunk, without arguments) in its own coroutine
-- under limits { instructions, seconds, memory, what = "load" } (box: the
-- sandbox's, S.new_box). Returns true, result; or false, message, code: the
-- message of the exceeded limit or E.message of what f raised (no
-- metamethod of the config's runs); code MU_ENOMEM when memory, the Lua
-- stack or the nesting ran out (else nil: the config cannot choose it).
function S.run_bounded(f, limits, box)
  jit.off(f, true)
  local co = coroutine.create(run_captured)
  local prev = set_strings(SAFE_STRING)
  local bounded = not unbounded()
  local jit_on = jit.status()
  local d, prev_box = nest.depth, cur.box
  cur.box = box
  if bounded then
    jit.off()
    jit.flush()
    start(co, limits)
  end
  local resumed, ok, result = coroutine.resume(co, f)
  local err = bounded and stop(co)
  if bounded and jit_on then jit.on() end
  set_strings(prev)
  nest.depth, cur.box = d, prev_box
  if err then return false, err.msg, err.code == E.ENOMEM and E.ENOMEM or nil end
  if not resumed then return false, E.message(ok) end
  if coroutine.status(co) ~= "dead" then return false, "coroutine.yield is not allowed in a config" end
  if ok then return true, result end
  local e = E.caught(result)
  local orig = ORIGINAL[e] -- (a host error: never a field of the config's own value is read)
  local nomem = exhausted(result) or (orig and orig.code == E.ENOMEM)
  return false, E.message(orig or e), nomem and E.ENOMEM or nil
end

local function finish_call(co, d, resumed, ok, ...)
  local err = stop(co)
  nest.depth = d
  if err then
    if not ok then err.tb = select(2, E.caught((...))) end -- (where the limit was hit)
    error(err, 0)
  end
  if not resumed then error(E.exhausted(ok), 0) end
  if ok then return ... end
  local e, tb = E.caught((...))
  if E.is(e) and rawget(e, "tb") == nil then rawset(e, "tb", tb) end
  error(e, 0)
end

-- f(...) as one bounded run (limits as for S.run_bounded, what = "hook"):
-- its results, or raises what it raised; an exceeded limit raises an error
-- object naming it (field `limit`: "hook_budget.instructions", ...). Inside
-- a bounded run (a call nested in another) or under the host's own debug
-- hook, f(...) runs as it is.
function S.call_bounded(limits, f, ...)
  if unbounded() then return f(...) end
  local co = coroutine.create(run_captured)
  local d = nest.depth
  start(co, limits)
  return finish_call(co, d, coroutine.resume(co, f, ...))
end

-- A sandbox's box: the limits of its calls at step time (box.limits, set
-- by the loader once the config has returned; S.HOOK_BUDGET until then)
-- and the host wrappers of its functions.
function S.new_box()
  return { limits = nil, exported = setmetatable({}, { __mode = "kv" }) }
end

local DEFAULT_BOX = S.new_box()

local function limits_of(box)
  local l = box.limits
  if l == nil then
    l = { what = "hook" }
    for k, v in pairs(S.HOOK_BUDGET) do l[k] = v end
  end
  return l
end

-- Does text hold a precompiled chunk (ESC first, or after a '#' first
-- line)? Mode "t" already keeps LuaJIT from reading one (and after a '#'
-- line it refuses bytecode as "malformed" by itself); this gives the
-- clearer message.
function S.is_bytecode(text)
  if sbyte(text, 1) == 35 then text = smatch(text, "^[^\n]*\n(.*)$") or "" end -- a #! line
  return sbyte(text, 1) == 27
end

-- load() for sandboxed code: source text only, in env (or the given
-- environment), never JIT-compiled.
function S.text_load(env, blocked)
  return function(chunk, name, mode, e)
    if mode ~= nil and mode ~= "t" or (type(chunk) == "string" and S.is_bytecode(chunk)) then
      blocked("load of bytecode")
    end
    if type(chunk) ~= "string" then blocked("load of a reader function") end
    if name ~= nil and type(name) ~= "string" then name = nil end
    local f, err = load(chunk, name, "t", e or env)
    if f then jit.off(f, true) end
    return f, err
  end
end

-- ------------------------------------------------------------------ errors

-- Calls across the membrane run under xpcall with E.capture (capture), which keeps
-- the traceback of the first raise (on error objects, and on the side for
-- strings), so that what the C embedding shows still reaches down to the
-- config's lines.
local function with_tb(obj, tb)
  if rawget(obj, "tb") == nil then obj.tb = tb end
  return obj
end


-- A host function raised err inside a call from the config: a string as it
-- is; a muon error object as a copy (code and message; its metatable is
-- protected, so the config cannot reach or change it); another host value,
-- which might hold host objects, as its message (with its code if it names
-- one).
local function import_error(err, tb)
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
local function export_error(err, tb)
  local t = type(err)
  if t == "string" or t == "number" then return err end
  local orig = t == "table" and ORIGINAL[err]
  if orig then return with_tb(orig, tb) end
  return E.new(E.ELUA, E.message(err), tb)
end

local function imported_results(prev, d, host, t0, ok, ...)
  set_strings(prev)
  nest.depth, budget.host = d, host
  if t0 then
    charge_host((os.clock() - t0) * S.HOST_RATE)
    if budget.err then raise_spent() end
    if os.clock() > budget.deadline then exceed("seconds") end
    check_memory()
  end
  if ok then return import_all(...) end
  local err, tb = E.caught((...))
  error(import_error(err, tb), 0)
end

local function exported_results(prev, d, host, prev_box, box, ok, ...)
  set_strings(prev)
  nest.depth, budget.host, cur.box = d, host, prev_box
  if ok then return export_all(box, ...) end
  local caught = ...
  local err, tb = E.caught(caught)
  if exhausted(caught) then error(err, 0) end
  error(export_error(err, tb), 0)
end

-- The config calls host function f: arguments exported, results and
-- errors imported; the host's string methods while f runs.
-- (The arguments are converted before the switch: a conversion error
-- must not leave the strings switched.)
local function call_host_args(f, ...)
  local d = enter("a call into muon")
  local host = budget.host
  local prev = set_strings(HOST_STRING)
  budget.host = true
  local t0 = in_budget() and os.clock()
  return imported_results(prev, d, host, t0, xpcall(f, capture, ...))
end
local function call_host(f, ...)
  return call_host_args(f, export_all(cur.box, ...))
end

local function spent() raise_spent() end

-- The host calls config function f (of the sandbox `box`): arguments
-- imported, results and errors exported; the sandbox's string methods
-- while f runs.
local function call_config_args(f, box, ...)
  local d = enter("a call into the config")
  local host, prev_box = budget.host, cur.box
  local prev = set_strings(SAFE_STRING)
  budget.host, cur.box = false, box
  if budget.err and in_budget() then f = spent end -- (the run's limit was exceeded in a host call)
  return exported_results(prev, d, host, prev_box, box, xpcall(f, capture, ...))
end
local function call_config_now(f, box, ...)
  return call_config_args(f, box, import_all(...))
end
-- (a call from the host outside any bounded run, at step time: one run
-- under the box's limits)
local function call_config(f, box, ...)
  if unbounded() then return call_config_now(f, box, ...) end
  return S.call_bounded(limits_of(box), call_config_now, f, box, ...)
end

-- ------------------------------------------------------------ host work
--
-- Inside a bounded load every host call is charged its CPU time afterwards
-- (HOST_RATE instructions per second: call_host above), and the calls whose
-- time grows faster than their arguments' size are charged an estimate
-- before they run, so that one call cannot take far longer than the budget
-- (matmuls, Newton-Schulz, optimizer steps; FLOPS_PER_INSTRUCTION floating
-- point operations count as one instruction).
S.HOST_RATE = 1e9
local FLOPS_PER_INSTRUCTION = 16

-- a (..., m, k) @ b (..., k, n): 2 * batch * m * k * n flops (1-D operands
-- are a row or a column).
local function matmul_cost(a, b)
  if not (T.is_tensor(a) and T.is_tensor(b)) then return 0 end
  local sa, sb = a:size(), b:size()
  local m = #sa >= 2 and sa[#sa - 1] or 1
  local n = #sb >= 2 and sb[#sb] or 1
  return 2 * math.max(a:numel() * n, b:numel() * m) / FLOPS_PER_INSTRUCTION
end

-- Newton-Schulz on x (a matrix or a batch of them) with these options: the
-- flops of the cost model (muon.ns.cost; 0 for options the call refuses).
local function ns_cost(x, opts)
  if not T.is_tensor(x) or x:dim() < 2 then return 0 end
  local s, batch = x:size(), 1
  for d = 1, #s - 2 do batch = batch * s[d] end
  local ok, flops = pcall(require("muon.ns").cost, s[#s - 1], s[#s], opts)
  return ok and batch * flops / FLOPS_PER_INSTRUCTION or 0
end

-- One step of an optimizer made by the config over these (host) params:
-- ns_steps iterations on each core matrix (as the "legacy" schedule, which
-- runs any number of them), plus the elementwise passes.
local function step_cost(params, opts)
  local steps = type(opts) == "table" and tonumber(opts.ns_steps) or 5
  local ns_opts = { variant = "legacy", steps = math.max(0, math.min(math.floor(steps), 1000)) }
  local cost = 0
  if type(params) ~= "table" then return 0 end
  for _, p in ipairs(params) do
    local v = type(p) == "table" and rawget(p, "value")
    if T.is_tensor(v) then
      local ok, flops = pcall(require("muon.ns").shape_cost, v:size(), "batch", ns_opts)
      cost = cost + (ok and flops / FLOPS_PER_INSTRUCTION or 0) + 32 * v:numel()
    end
  end
  return cost
end
local STEP_COST = setmetatable({}, { __mode = "k" }) -- optimizer -> its step's estimate

-- ------------------------------------------------------------ tensor proxy

-- Methods a sandboxed config may call on a tensor (all bounds-checked).
-- The maths (add, mul_, where, sum, matmul, ...: T.math_names) check every
-- argument's type in Lua before any FFI call.
local SAFE_METHODS = { "size", "stride", "numel", "dim", "dtype", "is_contiguous", "shares_storage", "view",
  "reshape", "transpose", "narrow", "select", "squeeze", "unsqueeze", "contiguous", "clone", "to", "copy",
  "fill", "zero", "fill_", "zero_", "copy_", "all_finite", "get", "set", "totable", "flat" }
for _, name in ipairs(T.math_names) do SAFE_METHODS[#SAFE_METHODS + 1] = name end
-- Members that exist on real tensors but not behind the membrane.
local BLOCKED_MEMBERS = {
  ptr = "tensor:ptr() (raw FFI pointer)", save = "tensor:save() (file write)",
  data = "tensor.data (raw FFI field)", storage = "tensor.storage (raw FFI field)",
  offset = "tensor.offset (raw FFI field)", scalar = "tensor.scalar (raw FFI field; use :dtype())",
  ndim = "tensor.ndim (raw FFI field; use :dim())", dims = "tensor.dims (raw FFI field; use :size())",
  strides = "tensor.strides (raw FFI field; use :stride())",
}

-- Methods whose first argument must be a tensor (checked here: an FFI call
-- would turn a plain table into a temporary struct).
local TENSOR_ARG = { copy = true, copy_ = true, shares_storage = true }
-- Methods charged a matmul's estimate first.
local MATMULS = { matmul = true, mm = true, bmm = true }

local tensor_methods = {}
for _, name in ipairs(SAFE_METHODS) do
  local m = T.methods[name]
  tensor_methods[name] = function(self, ...)
    local real = REAL[self]
    if real == nil or not T.is_tensor(real) then
      E.blame(E.EINVAL, "tensor:%s called on %s, not a tensor", name, type(self))
    end
    if TENSOR_ARG[name] then
      local other = REAL[(...)]
      if other == nil or not T.is_tensor(other) then E.blame(E.EINVAL, "tensor:%s: argument is not a tensor", name) end
    end
    if MATMULS[name] then charge_host(matmul_cost(real, REAL[(...)])) end
    return call_host(m, real, ...)
  end
end

local tensor_mt = {
  __metatable = "muon.tensor (sandboxed)",
  __index = function(_, k)
    local m = tensor_methods[k]
    if m then return m end
    if BLOCKED_MEMBERS[k] then S.blocked_error(BLOCKED_MEMBERS[k]) end
    if T.methods[k] then S.blocked_error("tensor:" .. tostring(k)) end -- (an unknown name raises there)
  end,
  __newindex = function(_, k)
    E.blame(E.EINVAL, "cannot set field '%s' of a tensor in a sandboxed config", tostring(k))
  end,
  __tostring = function(self) return tostring(REAL[self]) end,
  __eq = function(a, b) return REAL[a] == REAL[b] end,
}
-- Operators: the real tensors' own (the FFI metatype's __add, ...), on the
-- exported operands; a plain table or a config's own cdata is rejected there.
-- (Through call_host: the host's string methods and the time charge.)
local function add(a, b) return a + b end
local function sub(a, b) return a - b end
local function mul(a, b) return a * b end
local function div(a, b) return a / b end
local function unm(a) return -a end
local function pow(a, b) return a ^ b end
tensor_mt.__add = function(a, b) return call_host(add, a, b) end
tensor_mt.__sub = function(a, b) return call_host(sub, a, b) end
tensor_mt.__mul = function(a, b) return call_host(mul, a, b) end
tensor_mt.__div = function(a, b) return call_host(div, a, b) end
tensor_mt.__unm = function(a) return call_host(unm, a) end
tensor_mt.__pow = function(a, b) return call_host(pow, a, b) end

-- ------------------------------------------------------------ object proxy

-- Methods of host objects (optimizers made by the config) a config may
-- call; everything else that is a function, and every "_" member, is
-- blocked (opt:save/opt:load write and read files; the internal phases
-- take forged plans).
local OBJECT_METHODS = { step = true, params = true, state_dict = true, load_state_dict = true }
local OBJECT_BLOCKED = { save = "(file write)", load = "(file read)" }

local object_mt = {
  __metatable = "muon object (sandboxed)",
  __index = function(self, k)
    local real = REAL[self]
    local v = real[k]
    if type(k) == "string" and (ssub(k, 1, 1) == "_" or (type(v) == "function" and not OBJECT_METHODS[k])) then
      S.blocked_error(sformat("object member '%s' %s", k, OBJECT_BLOCKED[k] or "(internal)"))
    end
    local cost = k == "step" and STEP_COST[real]
    if cost then
      local step = import(v)
      return function(...)
        charge_host(cost)
        return step(...)
      end
    end
    return import(v)
  end,
  __newindex = function(_, k)
    E.blame(E.EINVAL, "cannot set field '%s' of a host object in a sandboxed config", tostring(k))
  end,
  __call = function(self, ...) return call_host(REAL[self], ...) end,
  __tostring = function(self) return tostring(REAL[self]) end,
  __len = function(self) return #REAL[self] end,
}

local function proxy_of(v, mt)
  local p = PROXY[v]
  if p == nil then
    p = setmetatable({}, mt)
    REAL[p] = v
    PROXY[v] = p
  end
  return p
end

local function copy_table(t, f, seen, box)
  local c = seen[t]
  if c then return c end
  c = {}
  seen[t] = c
  for k, v in pairs(t) do
    c[f(k, seen, box)] = f(v, seen, box)
  end
  return c
end

function import(v, seen)
  local tv = type(v)
  if tv == "nil" or tv == "number" or tv == "string" or tv == "boolean" then return v end
  if tv == "cdata" then
    if T.is_tensor(v) then return proxy_of(v, tensor_mt) end
    E.raise(E.EINVAL, blocked_message("passing an FFI value (" .. tostring(v) .. ") into the config"))
  end
  if tv == "function" then
    local orig = EXPORTED[v]
    if orig then return orig end -- a sandbox function coming back
    local w = IMPORT_OF[v]
    if w == nil then
      w = function(...) return call_host(v, ...) end
      IMPORTED[w] = v
      IMPORT_OF[v] = w
    end
    return w
  end
  if tv == "table" then
    if REAL[v] ~= nil then return v end -- already a proxy
    if getmetatable(v) ~= nil then return proxy_of(v, object_mt) end
    return copy_table(v, import, seen or {})
  end
  E.raise(E.EINVAL, blocked_message("passing a " .. tv .. " into the config"))
end

-- (box: the sandbox v comes from; its functions get wrappers that call
-- them under its limits)
function export(v, seen, box)
  local tv = type(v)
  if tv == "nil" or tv == "number" or tv == "string" or tv == "boolean" then return v end
  if tv == "table" then
    local real = REAL[v]
    if real ~= nil then return real end
    return copy_table(v, export, seen or {}, box)
  end
  if tv == "function" then
    local orig = IMPORTED[v]
    if orig then return orig end -- a host function going back
    box = box or DEFAULT_BOX
    local w = box.exported[v]
    if w == nil then
      w = function(...) return call_config(v, box, ...) end
      EXPORTED[w] = v
      box.exported[v] = w
    end
    return w
  end
  if tv == "cdata" then return v end -- value cdata made by the config itself (1LL): no pointers reach it
  E.raise(E.EINVAL, "a sandboxed config returned a %s, which cannot leave the sandbox", tv)
end

S.import = import
-- v (a value of the sandbox `box`, S.new_box; default: S.HOOK_BUDGET's
-- limits) as the host sees it.
function S.export(v, box) return export(v, nil, box) end

function S.is_proxy(v) return REAL[v] ~= nil end

-- ------------------------------------------------------------------ facade

-- Imported copies of the listed fields of a host module.
local function pick(mod, names)
  local t = {}
  for _, k in ipairs(names) do t[k] = import(mod[k]) end
  return t
end

local function facade_of(fields, blocked_prefix, blocked_names)
  return setmetatable(fields, {
    __metatable = "muon module (sandboxed)",
    __index = function(_, k)
      if blocked_names[k] then S.blocked_error(blocked_prefix .. tostring(k) .. " " .. blocked_names[k]) end
      return nil
    end,
  })
end

-- The modules a sandboxed config may require, built lazily per sandbox so
-- that one config cannot change what another sees.
local BUILDERS = {}

BUILDERS["muon.tensor"] = function()
  local names = {}
  for _, list in ipairs({ T.function_names, T.math_names }) do
    for _, name in ipairs(list) do names[#names + 1] = name end
  end
  local Tf = pick(T, names)
  Tf.is_tensor = function(x) return REAL[x] ~= nil and T.is_tensor(REAL[x]) end
  for name in pairs(MATMULS) do
    local f = Tf[name]
    Tf[name] = function(a, b, ...)
      charge_host(matmul_cost(REAL[a], REAL[b]))
      return f(a, b, ...)
    end
  end
  return facade_of(Tf, "muon.tensor.", { wrap = "(wraps a raw pointer)", load = "(file read)",
    adopt = "(raw FFI handle)", methods = "(the shared FFI method table)" })
end

BUILDERS["muon.ns"] = function()
  local ns = require("muon.ns")
  local f = pick(ns, { "zeropower", "coefficients", "validate", "VARIANTS", "DEFAULT_STEPS",
    "DEFAULT_VARIANT", "DEFAULT_EPS" })
  local zp = f.zeropower
  f.zeropower = function(x, opts)
    if type(opts) == "table" and opts.workspace ~= nil then S.blocked_error("muon.ns.zeropower's workspace option") end
    charge_host(ns_cost(REAL[x], opts))
    return zp(x, opts)
  end
  return facade_of(f, "muon.ns.", { workspace = "(raw workspace handle)",
    zeropower_into = "(takes raw workspace handles)", resolve = "(returns raw FFI options)" })
end

BUILDERS["muon.foreach"] = function()
  return facade_of(pick(require("muon.foreach"), { "momentum", "apply", "scale", "adamw", "all_finite",
    "pack", "unpack", "numel" }), "muon.foreach.", {})
end

-- Pure functions of numbers: safe to hand out as they are.
BUILDERS["muon.schedules"] = function()
  return pick(require("muon.schedules"), { "warmup_cosine", "warmup_constant", "wsd" })
end

BUILDERS["muon.param"] = function()
  local P = require("muon.param")
  local f = { new = import(P.new), is_param = function(x) return P.is_param(REAL[x]) end,
    shape_string = import(P.shape_string), same_shape = import(P.same_shape) }
  return setmetatable(f, { __metatable = "muon module (sandboxed)",
    __call = function(_, ...) return f.new(...) end })
end

local function optim_facade(name, mod)
  local function new(params, opts)
    local o = call_host(mod.new, params, opts)
    local real = REAL[o]
    if real ~= nil then
      local ok, cost = pcall(step_cost, export(params), type(opts) == "table" and export(opts) or nil)
      STEP_COST[real] = ok and cost or nil
    end
    return o
  end
  local f = { new = new,
    DEFAULTS = import(mod.DEFAULTS), OPTIONS = import(mod.OPTIONS) }
  return setmetatable(f, { __metatable = "muon." .. name .. " (sandboxed)",
    __call = function(_, ...) return f.new(...) end })
end

-- Every optimizer kind (the list: muon.optim.kind) as its module and as
-- muon.optim.<class>.
local KINDS = require("muon.optim.kind").KINDS
for _, k in ipairs(KINDS) do
  BUILDERS[k.module] = function() return optim_facade(k.module:sub(6), require(k.module)) end
end
BUILDERS["muon.optim.options"] = function() return pick(require("muon.optim.options"), { "is_finite" }) end

BUILDERS["muon.optim"] = function(get)
  local f = {}
  for _, k in ipairs(KINDS) do f[k.class] = get(k.module) end
  return f
end

BUILDERS["muon"] = function(get)
  local muon = require("muon")
  local f = { _VERSION = muon._VERSION, tensor = get("muon.tensor"), ns = get("muon.ns"),
    param = get("muon.param"), optim = get("muon.optim"), foreach = get("muon.foreach"),
    blas_info = import(muon.blas_info) }
  return facade_of(f, "muon.", { core = "(raw FFI library)", safetensors = "(file reads and writes)",
    comm = "(MPI communicators)", host = "(script host)", config = "(config loader)",
    engine = "(engine; open engines from the host program)", dist = "(distributed planner)",
    check = "(muon check)", optim_state = "(checkpoint files)" })
end

function S.new_require(path)
  local loaded = {}
  local req
  local function get(name)
    local m = loaded[name]
    if m == nil then
      m = BUILDERS[name](get)
      loaded[name] = m
    end
    return m
  end
  req = function(name)
    if type(name) == "string" and BUILDERS[name] then return get(name) end
    E.blame(E.EINVAL, sformat("config '%s': require('%s') is blocked in sandboxed configs (allowed: muon, muon.tensor, "
      .. "muon.ns, muon.param, muon.optim, muon.foreach, muon.schedules); to allow it load the config with %s",
      path, tostring(name), S.HOW_TO_ALLOW))
  end
  return req
end

return S
