-- The string and table libraries as sandboxed code sees them, and the
-- switch of the strings' methods.
--
-- String methods: the string metatable's __index is shared by every string
-- of the VM; while sandboxed code runs (a bounded load, a call into a
-- config function) it is SAFE_STRING (no string.dump, bounded patterns),
-- and the host's again while a host function the config calls runs;
-- restored on every return and error (lua/muon/sandbox/runs.lua and
-- membrane.lua switch it with St.set_strings). The functions whose C work
-- grows with their arguments charge the run's budget
-- (lua/muon/sandbox/budget.lua): patterns their worst case before the call,
-- rep, concat, sort, unpack... their size; the ones that call back into
-- Lua from C count the nesting (lua/muon/sandbox/nesting.lua).
local E = require("muon.errors")
local B = require("muon.sandbox.budget")
local N = require("muon.sandbox.nesting")
local SE = require("muon.sandbox.errors")

local St = {}

-- (The host's string functions, called as functions: while sandboxed code
-- runs, string methods are the sandbox's, SAFE_STRING, which charge the
-- budget.)
local sformat, sbyte, sfind, ssub = string.format, string.byte, string.find, string.sub

-- Worst-case pattern steps allowed in one call at step time.
St.PATTERN_LIMIT = 1e8

-- Worst-case work of Lua pattern p on a subject of n characters. lstrlib's
-- matcher backtracks: from one start position, each quantified item (*, +,
-- -) may try up to n + 1 lengths for every way the items before it matched,
-- ? two, and %b and back-references (%1) scan up to n characters; an
-- unanchored search tries n + 1 start positions. Steps = starts * the
-- product of those choices * the number of items. A quantified item that
-- ends the pattern (only capture closes after it: ".*", "(%w+)") cannot
-- fail once reached, so it brings no choices, only one scan of up to n + 1
-- characters when the match succeeds. (Malformed patterns are left to the
-- real function, which rejects them.)
local function pattern_cost(p, n)
  local len = #p
  local i, starts, factor, items, tail = 1, n + 1, 1, 1, 0
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
      if (q == 42 or q == 43 or q == 45 or q == 63) and sfind(p, "^%)*$", i + 1) then -- the last item
        tail, i = n + 1, i + 1
      elseif q == 42 or q == 43 or q == 45 then factor, i = factor * (n + 1), i + 1 -- * + -
      elseif q == 63 then factor, i = factor * 2, i + 1 end -- ?
    end
  end
  return starts * factor * items + tail
end
St.pattern_cost = pattern_cost

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
  if cost > St.PATTERN_LIMIT and not (B.in_budget() and B.is_load()) then
    E.blame(E.EINVAL, sformat("string.%s: pattern '%s' on a subject of %d characters may take %.3g matching steps, "
      .. "more than the %.3g a sandboxed config may use in one call", name, #p > 40 and ssub(p, 1, 40) .. "..." or p,
      #s, cost, St.PATTERN_LIMIT))
  end
  B.charge(4 * cost) -- (a matching step costs a few VM instructions' time)
end

-- string.find(s, p) for a pattern the host got from a config (a group's
-- match list): refused, not run, when its worst case exceeds
-- PATTERN_LIMIT steps.
function St.bounded_find(s, p, what)
  local cost = pattern_cost(p, #s)
  if cost > St.PATTERN_LIMIT then
    local shown = #s > 60 and sformat("%s...' (%d bytes)", ssub(s, 1, 60), #s) or s .. "'"
    E.raise(E.EINVAL, "%s: pattern '%s' on '%s may take %.3g matching steps (more than %.3g); "
      .. "use fewer quantifiers (*, +, -) or a match function", what or "pattern", p, shown, cost, St.PATTERN_LIMIT)
  end
  return string.find(s, p)
end

local function charged_result(r)
  if type(r) == "string" then B.charge(#r) end
  return r
end

-- The string library as sandboxed code sees it (methods on strings and the
-- config's `string` table): no dump, pattern functions checked first,
-- functions whose C work grows with their output charged for it.
local SAFE_STRING = {}
for k, v in pairs(string) do SAFE_STRING[k] = v end
St.SAFE_STRING = SAFE_STRING
SAFE_STRING.dump = function() SE.blocked_error("string.dump") end
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
    if type(repl) == "function" then repl = N.counted(repl, "string.gsub")
    elseif type(repl) == "table" then repl = N.counted_table(repl, "string.gsub") end
    local r, count = gsub(s, p, repl, n)
    return charged_result(r), count
  end
  local rep = string.rep
  SAFE_STRING.rep = function(s, k, sep)
    if type(k) == "number" and k > 0 and (type(s) == "string" or type(s) == "number") then
      local n = k * (#tostring(s) + (type(sep) == "string" and #sep or 0))
      B.charge(n)
      B.charge_memory(n)
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
      B.charge(len(s))
      return f(s, ...)
    end
  end
  local sub, char, format = string.sub, string.char, string.format
  SAFE_STRING.sub = function(s, i, j, ...)
    if type(s) == "string" and B.in_budget() then
      local n = #s
      local a, b = tonumber(i) or 1, tonumber(j) or -1
      if a < 0 then a = n + a + 1 end
      if b < 0 then b = n + b + 1 end
      B.charge(math.max(0, math.min(b, n) - math.max(a, 1) + 1))
    end
    return sub(s, i, j, ...)
  end
  SAFE_STRING.char = function(...)
    B.charge(select("#", ...))
    return char(...)
  end
  SAFE_STRING.format = function(fmt, ...)
    local nargs = select("#", ...)
    if B.in_budget() then
      local n = len(fmt)
      for k = 1, nargs do n = n + len((select(k, ...))) end
      B.charge(n)
    end
    for k = 1, nargs do -- (%s of a value with __tostring calls it from C: counted)
      local v = select(k, ...)
      if type(v) == "table" and N.has_tostring(v) then
        local args = { ... }
        for j = k, nargs do args[j] = N.counted_tostring(args[j], "string.format") end
        return format(fmt, unpack(args, 1, nargs))
      end
    end
    return format(fmt, ...)
  end
end

local function less(a, b) return a < b end

-- table functions with C work that grows with their arguments.
function St.safe_table()
  local t = {}
  for k, v in pairs(table) do t[k] = v end
  local concat, sort = table.concat, table.sort
  t.concat = function(list, sep, i, j)
    if type(list) == "table" and B.in_budget() then -- (this loop is counted too)
      local n, step = 0, type(sep) == "string" and #sep or 0
      for k = tonumber(i) or 1, tonumber(j) or #list do
        local v = rawget(list, k)
        n = n + (type(v) == "string" and #v or 24) + step
      end
      B.charge(n)
      B.charge_memory(n)
    end
    return concat(list, sep, i, j)
  end
  t.sort = function(list, cmp)
    if type(list) == "table" then
      local n = #list
      B.charge(8 * n * math.max(1, math.log(n + 1) / math.log(2))) -- (8: a comparison's worth of instructions)
      -- (the comparator, or without one the elements' __lt, is called from C: counted)
      if type(cmp) == "function" then
        cmp = N.counted(cmp, "table.sort")
      elseif cmp == nil then
        for i = 1, n do
          local tv = type(rawget(list, i))
          if tv ~= "number" and tv ~= "string" then
            cmp = N.counted(less, "table.sort")
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
        if type(list) == "table" and select("#", ...) >= nargs then B.charge(#list) end
        return f(list, ...)
      end
    end
  end
  return t
end

function St.unpack(list, i, j)
  i = i or 1
  if type(list) == "table" then
    j = j or #list
    if type(i) == "number" and type(j) == "number" and j >= i then B.charge(j - i + 1) end
  end
  return unpack(list, i, j)
end

local string_mt = getmetatable("")
-- The host's string methods.
St.HOST_STRING = string_mt.__index

-- Point the string metatable at index (SAFE_STRING or HOST_STRING) and
-- return the previous one.
function St.set_strings(index)
  local prev = string_mt.__index
  string_mt.__index = index
  return prev
end

return St
