-- How a config's groups take parameters (the engine routes by it, muon
-- check shows it), and what makes a routing silently wrong:
--
--   local Rt = require("muon.routing")
--   Rt.pattern_problem(p)     -- a match/exclude pattern Lua cannot mean as written: regex syntax, malformed
--   Rt.lua_spelling(regex)    -- the regex as a list of Lua patterns ({ "blocks%.%d+%.qkv%.weight", ... })
--   Rt.route(groups, name, shape)  -- the first group that takes the parameter (config.resolve's groups)
--   Rt.report(groups, params) -- errors and warnings about groups left empty (params: { name, shape, group })
--
-- What is an error (the README's "Routing" says it once): a pattern using
-- regex syntax (config load), and a Newton-Schulz group (Muon) whose match
-- selects no parameter while another group takes the model's matrices
-- (the first step, muon check). A group left empty otherwise is a warning.
local E = require("muon.errors")
local sandbox = require("muon.sandbox")
local shape_string = require("muon.tensor").shape_string

local Rt = {}

------------------------------------------------------------ patterns

-- Regex escapes and their Lua pattern classes.
local ESCAPES = { d = "%d", D = "%D", s = "%s", S = "%S", w = "[%w_]", W = "[^%w_]" }
local MAGIC = "^$()%.[]*+-?" -- Lua's magic characters (a literal one takes a %)

-- The regex-only syntax in a Lua pattern p (ignoring what a % escapes):
-- a list of the constructs found ("\d", "|", "+?", "{2}", "(?", ")+"), empty
-- when there is none.
local function regex_syntax(p)
  local found, seen = {}, {}
  local function add(s)
    if not seen[s] then seen[s] = true; found[#found + 1] = s end
  end
  local i, n, in_set = 1, #p, false
  while i <= n do
    local c = p:sub(i, i)
    if c == "%" then
      i = i + 2
    else
      if c == "\\" then add("\\" .. p:sub(i + 1, i + 1))
      elseif in_set then
        if c == "]" then in_set = false end
      elseif c == "[" then
        in_set = true
        if p:sub(i + 1, i + 1) == "^" then i = i + 1 end
        if p:sub(i + 1, i + 1) == "]" then i = i + 1 end -- (a leading ] is literal)
      elseif c == "|" then add("|")
      elseif c == "?" and i > 1 and p:sub(i - 1, i - 1):find("[%*%+%?]") and p:sub(i - 2, i - 2) ~= "%" then
        add(p:sub(i - 1, i))
      elseif c == "(" and p:sub(i + 1, i + 1) == "?" then add("(?")
      elseif c == ")" and p:sub(i + 1, i + 1):find("[%*%+%?{]") then add(")" .. p:sub(i + 1, i + 1))
      elseif c == "{" and p:sub(i):find("^{%d+,?%d*}") then add(p:sub(i):match("^({%d+,?%d*})"))
      end
      i = i + 1
    end
  end
  return found
end

-- The Lua patterns a regex means, or nil when it uses what they cannot
-- say (a quantified group, a back reference, lookaround). Alternatives
-- become one pattern each (at most 32).
function Rt.lua_spelling(re)
  local pos, n = 1, #re
  -- a sequence of items up to ')' or the end: a list of alternatives, each
  -- a list of strings (the Lua pattern pieces of its choices)
  local parse_alts
  local function seq()
    local out = { "" } -- the patterns of this sequence so far (a cross product)
    local last -- the Lua text of the last single item, for quantifiers
    local function append(s)
      for i = 1, #out do out[i] = out[i] .. s end
    end
    while pos <= n do
      local c = re:sub(pos, pos)
      if c == "|" or c == ")" then break end
      if c == "(" then
        pos = pos + (re:sub(pos + 1, pos + 2) == "?:" and 3 or 1)
        if re:sub(pos, pos) == "?" then return nil end -- lookaround, named groups
        local alts = parse_alts()
        if not alts or re:sub(pos, pos) ~= ")" then return nil end
        pos = pos + 1
        if re:sub(pos, pos):find("[%*%+%?{]") then return nil end -- a quantified group
        local grown = {}
        for _, o in ipairs(out) do
          for _, a in ipairs(alts) do grown[#grown + 1] = o .. a end
        end
        if #grown > 32 then return nil end
        out, last = grown, nil
      else
        local piece
        if c == "\\" then
          local d = re:sub(pos + 1, pos + 1)
          if ESCAPES[d] then piece = ESCAPES[d]
          elseif d:find("%p") then piece = "%" .. d
          else return nil end -- \b, \1, \A ...: no Lua spelling
          pos = pos + 2
        elseif c == "[" then
          local j, body = pos + 1, "["
          if re:sub(j, j) == "^" then body, j = body .. "^", j + 1 end
          if re:sub(j, j) == "]" then body, j = body .. "%]", j + 1 end
          while j <= n and re:sub(j, j) ~= "]" do
            local x = re:sub(j, j)
            if x == "\\" then
              local d = re:sub(j + 1, j + 1)
              local cls = ESCAPES[d]
              if cls and cls:sub(1, 1) == "[" then cls = cls:sub(2, -2) end
              body = body .. (cls or ("%" .. d))
              j = j + 2
            else
              body = body .. (x == "%" and "%%" or x)
              j = j + 1
            end
          end
          if j > n then return nil end
          piece, pos = body .. "]", j + 1
        elseif c == "." or c == "^" or c == "$" then
          piece, pos = c, pos + 1
        elseif c == "*" or c == "+" or c == "?" then
          if not last then return nil end
          local lazy = re:sub(pos + 1, pos + 1) == "?"
          local q = c
          if lazy and c == "*" then q = "-"
          elseif lazy and c == "+" then q = last .. "-" end
          append(q)
          pos = pos + (lazy and 2 or 1)
          last = nil
        elseif c == "{" then
          local a, b, len = re:sub(pos):match("^{(%d+)(,?%d*)}()")
          if not a or not last then return nil end
          local lo = tonumber(a)
          local hi = b == "" and lo or (b == "," and math.huge or tonumber(b:sub(2)))
          if lo == 0 or hi < lo then return nil end
          -- (the item is there once already)
          local s = string.rep(last, lo - 1) .. (hi == math.huge and (last .. "*") or string.rep(last .. "?", hi - lo))
          append(s)
          pos = pos + len - 1
          last = nil
        else
          piece, pos = (MAGIC:find(c, 1, true) and ("%" .. c) or c), pos + 1
        end
        if piece then
          append(piece)
          last = piece
        end
      end
    end
    return out
  end
  parse_alts = function()
    local all = {}
    while true do
      local s = seq()
      if not s then return nil end
      for _, x in ipairs(s) do all[#all + 1] = x end
      if re:sub(pos, pos) ~= "|" then break end
      pos = pos + 1
    end
    return all
  end
  local result = parse_alts()
  if not result or pos <= n or #result > 32 then return nil end
  return result
end

local function lua_list(list)
  local q = {}
  for i, p in ipairs(list) do q[i] = ("%q"):format(p) end
  return #q == 1 and q[1] or ("{ " .. table.concat(q, ", ") .. " }")
end

-- Why p (a group's match or exclude pattern) cannot mean what it says, or
-- nil: regex syntax Lua patterns lack (with the Lua spelling when there is
-- one), or a malformed pattern (Lua's reason).
function Rt.pattern_problem(p)
  local found = regex_syntax(p)
  if #found > 0 then
    -- (no spelling for a pattern that mixes Lua's % escapes in)
    local spelled = not p:find("%", 1, true) and Rt.lua_spelling(p)
    return ("uses regex syntax (%s) that Lua patterns do not have: as a Lua pattern it matches other names. "
      .. "%s (Lua patterns: %%d a digit, %%. a dot, %%| a literal |; no alternation: a list of patterns)")
      :format(table.concat(found, " "), spelled and ("Write it as " .. lua_list(spelled))
        or "Write it with Lua patterns, or as a match function (name, shape) -> boolean")
  end
  local ok, err = pcall(string.find, "", p)
  if not ok then return ("is not a valid Lua pattern (%s)"):format(tostring(err)) end
  return nil
end

------------------------------------------------------------- routing

local function matches_any(list, name, shape)
  for _, m in ipairs(list) do
    if type(m) == "function" then
      -- (a copy of the shape: nothing the engine keeps is the function's)
      if E.call_hook_on("parameter '" .. name .. "'", "match function", m, name, { unpack(shape) }) then return true end
    elseif sandbox.bounded_find(name, m, "match") then -- (a backtracking pattern is refused, not run)
      return true
    end
  end
  return false
end
Rt.matches_any = matches_any

local function dims_ok(g, shape)
  local nd = #shape
  return (g.min_dim == nil or nd >= g.min_dim) and (g.max_dim == nil or nd <= g.max_dim)
end

-- Whether group g (config.resolve's) takes a parameter of this name and
-- shape when it is the only group.
local function takes(g, name, shape)
  return dims_ok(g, shape) and (g.match == nil or matches_any(g.match, name, shape))
    and not matches_any(g.exclude, name, shape)
end

function Rt.route(groups, name, shape)
  for _, g in ipairs(groups) do
    if takes(g, name, shape) then return g end
  end
  return nil
end

-- A group as messages name it, with its rules: "group 1 ('hidden', muon:
-- match = \"blocks\", min_dim = 2)".
local function describe(g)
  local rules = {}
  local function pats(list)
    local q = {}
    for i, m in ipairs(list) do q[i] = type(m) == "function" and "<function>" or ("%q"):format(m) end
    return #q == 1 and q[1] or ("{ " .. table.concat(q, ", ") .. " }")
  end
  if g.match then rules[#rules + 1] = "match = " .. pats(g.match) end
  if #g.exclude > 0 then rules[#rules + 1] = "exclude = " .. pats(g.exclude) end
  if g.min_dim then rules[#rules + 1] = "min_dim = " .. g.min_dim end
  if g.max_dim then rules[#rules + 1] = "max_dim = " .. g.max_dim end
  return ("%s (%s%s)"):format(g.label, g.kind.name, #rules > 0 and (": " .. table.concat(rules, ", ")) or "")
end

-- "'a' [2, 3], 'b' [4] and 7 more" for a list of params.
local function some(list, k)
  k = k or 3
  local out = {}
  for i = 1, math.min(k, #list) do out[i] = ("'%s' %s"):format(list[i].name, shape_string(list[i].shape)) end
  local s = table.concat(out, ", ")
  if #list > k then s = s .. (" and %d more"):format(#list - k) end
  return s
end

-- The problems of a routing: params is the list of registered parameters
-- { name, shape, group = the index of the group that took it }. Returns
-- errors and warnings (lists of messages), per group left empty:
--  * error: a Newton-Schulz group whose match selects no parameter name
--    while groups of other kinds take matrices (>= 2 dims): those train
--    without Newton-Schulz;
--  * warning: a group whose match selects no parameter; one whose match
--    selects some but its exclude / min_dim / max_dim keep none; one whose
--    parameters all go to earlier groups first (unless its match selects
--    every name: a catch-all with nothing left to take).
function Rt.report(groups, params)
  local errors, warnings = {}, {}
  if #params == 0 then return errors, warnings end
  local taken = {}
  for _, p in ipairs(params) do taken[p.group] = true end
  for _, g in ipairs(groups) do
    if not taken[g.index] then
      local named, kept = {}, {}
      for _, p in ipairs(params) do
        if g.match == nil or matches_any(g.match, p.name, p.shape) then
          named[#named + 1] = p
          if dims_ok(g, p.shape) and not matches_any(g.exclude, p.name, p.shape) then kept[#kept + 1] = p end
        end
      end
      if #named == 0 then
        -- (the matrices that train without Newton-Schulz: those other kinds took)
        local matrices, where = {}, {}
        for _, p in ipairs(params) do
          local owner = groups[p.group]
          if #p.shape >= 2 and not owner.kind.ns then
            matrices[#matrices + 1] = p
            where[owner.label .. " (" .. owner.kind.name .. ")"] = true
          end
        end
        local names = {}
        for k in pairs(where) do names[#names + 1] = k end
        table.sort(names)
        local msg = ("%s selects none of the %d parameters (they are named like %s)"):format(describe(g), #params,
          some(params))
        if g.kind.ns and #matrices > 0 then
          local one = #matrices == 1
          errors[#errors + 1] = msg .. ("; the model's %s (%s) go%s to %s instead and train%s without "
            .. "Newton-Schulz. Fix the match pattern (Lua patterns: %%. for a dot, %%d for a digit)")
            :format(one and "matrix" or (#matrices .. " matrices"), some(matrices), one and "es" or "",
              table.concat(names, ", "), one and "s" or "")
        else
          warnings[#warnings + 1] = msg
        end
      elseif #kept == 0 then
        warnings[#warnings + 1] = ("%s takes no parameter: its match selects %s, but its exclude, min_dim or max_dim "
          .. "rules leave none"):format(describe(g), some(named))
      elseif #named < #params then
        local first = {}
        for _, p in ipairs(kept) do first[groups[p.group].label] = true end
        local by = {}
        for k in pairs(first) do by[#by + 1] = k end
        table.sort(by)
        warnings[#warnings + 1] = ("%s takes no parameter: it would take %s, but %s take%s them first (the first "
          .. "group that matches takes a parameter)"):format(describe(g), some(kept), table.concat(by, ", "),
          #by == 1 and "s" or "")
      end
    end
  end
  return errors, warnings
end

return Rt
