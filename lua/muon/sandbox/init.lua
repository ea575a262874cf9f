-- muon.sandbox: what a sandboxed config runs behind (lua/muon/config.lua
-- builds its environment from these parts), one job per file:
--
--   membrane.lua  the membrane: values crossing between the config and the
--                 host (tensor and object proxies, copies, wrappers)
--   errors.lua    errors crossing it, and what a blocked call says
--   facades.lua   the muon modules a config may require, as facades
--   runs.lua      bounded runs: a load, each call into the config; source
--                 text only, never JIT-compiled
--   budget.lua    the limits of one run: instructions, CPU time, Lua heap
--   costs.lua     host work a load is charged for (matmuls, Newton-Schulz)
--   nesting.lua   how deep library calls nest (the C stack); counted
--                 pcall, xpcall, tostring, print, os.time
--   strings.lua   the string and table libraries as the sandbox sees them
--                 (bounded patterns, charged copies, no string.dump)
--
-- Trusted configs run without the membrane; their functions still run as
-- bounded runs when they set hook_budget (config.lua, R.call_bounded).
local B = require("muon.sandbox.budget")
local N = require("muon.sandbox.nesting")
local St = require("muon.sandbox.strings")
local R = require("muon.sandbox.runs")
local SE = require("muon.sandbox.errors")
local C = require("muon.sandbox.costs")
local M = require("muon.sandbox.membrane")
local F = require("muon.sandbox.facades")

local S = {
  HOW_TO_ALLOW = SE.HOW_TO_ALLOW, blocked_error = SE.blocked_error,
  -- the membrane
  import = M.import, export = M.export, is_proxy = M.is_proxy, new_require = F.new_require,
  -- runs and their budget
  run_bounded = R.run_bounded, call_bounded = R.call_bounded, new_box = R.new_box, charge = B.charge,
  is_bytecode = R.is_bytecode, text_load = R.text_load,
  -- a sandbox's base functions and libraries
  pcall = N.pcall, xpcall = N.xpcall, tostring = N.tostring, print = N.print, os_time = N.os_time,
  SAFE_STRING = St.SAFE_STRING, safe_table = St.safe_table, unpack = St.unpack,
  pattern_cost = St.pattern_cost, bounded_find = St.bounded_find,
}

-- The tunables live in the module that reads them; S.HOOK_BUDGET,
-- S.PATTERN_LIMIT, S.MAX_NESTING and S.HOST_RATE read and set them there.
local TUNABLE = { HOOK_BUDGET = B, PATTERN_LIMIT = St, MAX_NESTING = N, HOST_RATE = C }
return setmetatable(S, {
  __index = function(_, k)
    local owner = TUNABLE[k]
    return owner and owner[k]
  end,
  __newindex = function(t, k, v)
    local owner = TUNABLE[k]
    if owner then owner[k] = v else rawset(t, k, v) end
  end,
})
