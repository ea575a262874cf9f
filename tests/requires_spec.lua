-- No require circle under lua/: every `require("...")` / `require "..."`
-- with a literal module name (read from the code, comments and long
-- strings left out) is an edge between the modules whose files are under
-- lua/; the graph must have no cycle, and a cycle is named in full. (A
-- require of a computed name, such as muon.optim.kinds' loop over the
-- kinds' list, is not an edge here.)
local read = require("helpers").read_file

-- The code of a text: comments and long strings blanked (newlines kept),
-- each short string replaced by "@<n>@" (strings[n]: its contents).
local function code_of(text)
  local out, strings, i, n = {}, {}, 1, #text
  local function blank(a, b) out[#out + 1] = text:sub(a, b):gsub("[^\n]", " ") end
  while i <= n do
    local c = text:sub(i, i)
    if text:sub(i, i + 1) == "--" then
      local eq = text:match("^%[(=*)%[", i + 2)
      local j
      if eq then
        local _, e = text:find("]" .. eq .. "]", i, true)
        j = e or n
      else
        j = (text:find("\n", i, true) or n + 1) - 1
      end
      blank(i, j)
      i = j + 1
    elseif c == "[" and text:match("^%[=*%[", i) then
      local eq = text:match("^%[(=*)%[", i)
      local _, e = text:find("]" .. eq .. "]", i, true)
      blank(i, e or n)
      i = (e or n) + 1
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= n and text:sub(j, j) ~= c do
        j = j + (text:sub(j, j) == "\\" and 2 or 1)
      end
      strings[#strings + 1] = text:sub(i + 1, j - 1)
      out[#out + 1] = "@" .. #strings .. "@"
      i = j + 1
    else
      out[#out + 1] = c
      i = i + 1
    end
  end
  return table.concat(out), strings
end

-- The literal module names a file's code requires (calls of the global
-- require: not a field or method named require).
local function requires_of(text)
  local list = {}
  local code, strings = code_of(text)
  for at, k in code:gmatch("()require%s*%(?%s*@(%d+)@") do
    local before = at > 1 and code:sub(at - 1, at - 1) or ""
    if not before:match("[%w_%.:]") then list[#list + 1] = strings[tonumber(k)] end
  end
  return list
end

local function file_of(name)
  local base = "lua/" .. name:gsub("%.", "/")
  for _, p in ipairs({ base .. ".lua", base .. "/init.lua" }) do
    local f = io.open(p, "rb")
    if f then f:close() return p end
  end
  return nil
end

-- Every module file under lua/ (by module name) and its edges.
local function graph()
  local g = {}
  local p = io.popen("find lua -name '*.lua' | sort")
  for path in p:lines() do
    local name = path:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
    local edges = {}
    for _, r in ipairs(requires_of(read(path))) do
      if file_of(r) then edges[#edges + 1] = r end
    end
    g[name] = edges
  end
  p:close()
  return g
end

-- The first cycle of g (name -> list of names) as a list ending where it
-- starts, or nil.
local function find_circle(g)
  local names = {}
  for k in pairs(g) do names[#names + 1] = k end
  table.sort(names)
  local state, stack = {}, {}
  local function visit(v)
    state[v] = "open"
    stack[#stack + 1] = v
    for _, w in ipairs(g[v] or {}) do
      if state[w] == "open" then
        local circle = {}
        for i = #stack, 1, -1 do
          table.insert(circle, 1, stack[i])
          if stack[i] == w then break end
        end
        circle[#circle + 1] = w
        return circle
      elseif state[w] == nil then
        local c = visit(w)
        if c then return c end
      end
    end
    stack[#stack] = nil
    state[v] = "done"
    return nil
  end
  for _, v in ipairs(names) do
    if state[v] == nil then
      local c = visit(v)
      if c then return c end
    end
  end
  return nil
end

describe("the requires under lua/", function()
  it("form no circle", function()
    local c = find_circle(graph())
    assert(c == nil, "require circle: " .. table.concat(c or {}, " -> "))
  end)

  it("are read from the code: real edges found, comments and strings left out", function()
    local g = graph()
    local function has(from, to)
      for _, x in ipairs(g[from] or {}) do if x == to then return true end end
      return false
    end
    assert.is_true(has("muon.step", "muon.scratch"))
    assert.is_true(has("muon.optim.muon", "muon.optim.kind"))
    assert.is_true(has("muon.optim", "muon.optim.kinds")) -- (init.lua)
    assert.is_false(has("muon.grads", "muon.grads")) -- (its header shows `require("muon.grads")` in a comment)
    assert.same({ "a", "b.c", "d" }, requires_of([===[
local x = require("a") -- require("no")
local y = require "b.c"
--[==[ require("no") ]==]
local z = [[ require("no") ]] .. require('d')
local s = "require('no')" .. env.require("no") .. obj:require("no")
]===]))
  end)

  it("a circle is found and named in full", function()
    assert.same({ "b", "c", "d", "b" }, find_circle({ a = { "b" }, b = { "c" }, c = { "d" }, d = { "b" } }))
    assert.same({ "x", "x" }, find_circle({ x = { "x" } }))
    assert.is_nil(find_circle({ a = { "b", "c" }, b = { "c" }, c = {} }))
  end)
end)
