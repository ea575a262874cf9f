-- The budget of one bounded run (lua/muon/sandbox/runs.lua): a config's
-- load, or one call of the host into a config function at step time (a
-- hook, a schedule, a match function; calls nested in it count towards
-- it). `limits` = { instructions, seconds, memory, what = "load" | "hook",
-- trusted = true for a trusted config's code (see "Once a limit...") }:
--
-- * instructions: a count hook (debug.sethook) fires every BUDGET_STEP VM
--   instructions and takes them off the budget; the string and table
--   functions whose C work grows with their arguments (patterns, rep,
--   concat, sort, unpack...: lua/muon/sandbox/strings.lua) charge their
--   worst case (patterns: before the call) or their output (after the
--   call) to the same budget. At load time host functions are charged too
--   (their CPU time, and an estimate first for matmuls, Newton-Schulz and
--   optimizer steps: lua/muon/sandbox/costs.lua); at step time they are not
--   (a hook's tensor maths is the step's own work) and count in `seconds`.
-- * seconds: CPU time (os.clock, the whole process), checked with the
--   instruction count and after host calls.
-- * memory: growth of the Lua heap (collectgarbage("count")) since the run
--   began, checked with the instruction count, after every GC cycle (the
--   GC probe, arm_gc_probe) and before string.rep; over the limit, a full
--   collection runs first, so that only what the run keeps counts. (Tensor
--   data is C memory outside the Lua heap: a failed allocation there is
--   MU_ENOMEM from the tensor call itself.)
--
-- Coroutines: LuaJIT has one hook for the whole VM, and the host waits in
-- coroutine.resume while the run's coroutine runs, so every coroutine that
-- runs Lua code meanwhile, but the host's own, runs on the run's behalf: a
-- coroutine the run creates (a trusted config has coroutine.create, wrap
-- and resume; a sandboxed one has none) is counted and timed like the
-- run's own.
--
-- Once a limit is exceeded the run's error stays: the sandbox's pcall and
-- xpcall re-raise it (an xpcall handler is not run for it), and so do a
-- host function's return and any later call into the config, until the run
-- returns. A trusted config's code has the VM's own pcall and
-- coroutine.resume, which would catch it: there (limits.trusted) the hook
-- raises it again at every instruction of the run until the run returns.
-- (One way out stays open to trusted code: LuaJIT runs an xpcall message
-- handler for an error raised by the hook with the hook held off, so a
-- handler that never returns is not stopped.) A host function the config called is never stopped halfway (it
-- may be in a collective with other ranks, or halfway through its own
-- state): the error is raised when it returns. The host reports the
-- limit's error, an error object (MU_ELUA for instructions and time,
-- MU_ENOMEM for memory) naming the limit, whatever the config raised or
-- returned.
--
-- Limits: when the host already runs a debug hook (profiler, debugger,
-- coverage) LuaJIT's single hook slot is left alone and nothing is bounded
-- but the nesting (lua/muon/sandbox/nesting.lua; patterns at step time are
-- then still capped at PATTERN_LIMIT steps per call, and so are groups'
-- match patterns). One VM instruction can still do work proportional to
-- the size of its operands (the .. operator on a huge string): such work is
-- bounded by the memory limit and by the CPU-time limit, which are checked
-- every BUDGET_STEP instructions and after every GC cycle, not instruction
-- by instruction. A load's budget error can stop a host function the
-- config called only once it returns; whatever it built belongs to the
-- failed load.
local ffi = require("ffi")
local E = require("muon.errors")

local B = {}

local sformat = string.format -- (called as a function: while sandboxed code runs, string methods are the sandbox's)

local BUDGET_STEP = 10000
-- The GC's step multiplier during a bounded run (LuaJIT's default: 200).
local GC_STEPMUL = 2 ^ 30
-- The limits of one hook call at step time, unless the config's hook_budget
-- says otherwise (lua/muon/config.lua): far above what a sane hook takes.
B.HOOK_BUDGET = { instructions = 1e10, seconds = 300, memory = 2 ^ 30 }

local budget = {
  active = false, co = nil, what = "load",
  starter = nil, -- the coroutine that started the run (the host's: never counted)
  trusted = false, -- the run's code can catch errors itself (limits.trusted)
  limit = 0, remaining = 0, step = BUDGET_STEP, forced = false,
  seconds = math.huge, deadline = math.huge,
  memory = math.huge, heap0 = 0,
  host = false, -- a host function the config called is running (a limit waits for its return)
  err = nil,    -- the error object, once a limit is exceeded
}

-- Is a bounded run going on, and is this code part of it (any coroutine
-- but the one that started the run)?
local function in_budget()
  return budget.active and coroutine.running() ~= budget.starter
end
B.in_budget = in_budget

-- Is this code part of a run whose limit was exceeded?
function B.spent() return budget.err ~= nil and in_budget() end

-- Is the running budget a load's (host work charged) rather than a hook's?
function B.is_load() return budget.what == "load" end

-- Mark whether a host function the config called is running (a limit
-- waits for its return); returns the previous mark.
function B.set_host(on)
  local prev = budget.host
  budget.host = on
  return prev
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
-- nothing: it raises when that function returns, B.after_host). Once
-- raised it is raised again wherever sandboxed code could go on: the
-- sandbox's pcall and xpcall, a host function's return, the host's next
-- call into the config (the hook itself stays quiet from then on: it could
-- fire inside an error handler).
local function raise_spent()
  if budget.host then return end
  error(budget.err.msg, 0)
end
B.raise_spent = raise_spent

local hook

local function exceed(which)
  budget.err, budget.remaining = limit_error(which), 0
  if budget.trusted then debug.sethook(budget.co, hook, "", 1) end -- (from now on at every instruction)
  raise_spent()
end

-- The memory limit, with `extra` bytes about to be allocated.
local function check_memory(extra)
  if budget.memory == math.huge then return end
  if heap_bytes() + (extra or 0) - budget.heap0 <= budget.memory then return end
  collect() -- (only what the run keeps counts, not its garbage)
  if heap_bytes() + (extra or 0) - budget.heap0 > budget.memory then exceed("memory") end
end

function hook()
  if not in_budget() then return end
  if budget.err then -- (spent: a trusted run's code may have caught the error)
    if budget.trusted and not budget.host then error(budget.err.msg, 0) end
    return
  end
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
function B.charge(n)
  if not in_budget() then return end
  if budget.err then return raise_spent() end
  budget.remaining = budget.remaining - n
  if budget.remaining <= 0 then exceed("instructions") end
end

-- B.charge for host work (time in host calls, estimates of big ones): at
-- load time only.
function B.charge_host(n)
  if budget.what == "load" then B.charge(n) end
end

-- About to allocate n bytes of Lua heap (a string): within the memory limit?
function B.charge_memory(n)
  if in_budget() and not budget.err then check_memory(n) end
end

-- When a host function the config called returns (it started at CPU time
-- t0, when the call was part of a run): its time charged at HOST_RATE
-- instructions per second (a load's), then the run's error if a limit was
-- exceeded meanwhile or is now.
function B.after_host(t0, host_rate)
  if not t0 then return end
  B.charge_host((os.clock() - t0) * host_rate)
  if budget.err then raise_spent() end
  if os.clock() > budget.deadline then exceed("seconds") end
  check_memory()
end

-- May the host's own debug hook be there (then nothing is bounded), or is
-- a run already going on (a call nested in it runs as part of it)?
function B.unbounded() return budget.active or debug.gethook() ~= nil end

-- Start the run of coroutine co under limits (the caller resumes co next).
function B.start(co, limits)
  budget.active, budget.co, budget.err, budget.forced, budget.host = true, co, nil, false, false
  budget.starter, budget.trusted = coroutine.running(), limits.trusted == true
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
function B.stop(co)
  debug.sethook(co)
  collectgarbage("setstepmul", budget.stepmul)
  live.bytes = math.min(live.bytes, budget.heap0) -- (what the run made is garbage now, mostly)
  local err = budget.err
  budget.active, budget.co, budget.err, budget.host, budget.starter = false, nil, nil, false, nil
  return err
end

return B
