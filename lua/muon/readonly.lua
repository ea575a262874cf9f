-- Read-only views: what a hook gets to read the engine's values (its ctx,
-- post_update_fn's parameter, a schedule's group), so that nothing the
-- engine keeps can be reached through it.
--
-- A view reads like a table (view.key); setting a field raises, naming it.
-- Its nested tables (ctx.logical_shape, ctx.box.start, ...) are copies made
-- for the view, plain tables as before (#, ipairs, table.concat work on
-- them; Lua cannot trap a write to a table's existing keys without breaking
-- those), compared with what they were copied from once the hook returned:
-- a hook that changed one fails, naming it (RO.verify). pairs(view) sees no
-- field: read them by name.
--
--   local RO = require("muon.readonly")
--   local ctx = RO.view(fields, "ctx", why, shallow)
--     -- fields: a plain table; why: the end of a refused write's message;
--     -- shallow: names of nested tables copied one level only (their own
--     -- tables are handed as they are: the caller checks them, as the step
--     -- checks its signals)
--   RO.verify(ctx, hook)    -- raises (ELUA, "<hook>: ...") naming the first nested value the hook changed
--   RO.unchanged(now, was, path, who, why) -- the same check of a table the caller handed out as it is
--   RO.is_view(x)
--   RO.import(view, f)      -- the view with f applied to each field, sharing its checks (the sandbox's membrane)
--   RO.copy(v)              -- a deep copy of plain tables (functions, tensors, objects as they are)
local E = require("muon.errors")

local RO = {}

local sformat = string.format -- (as functions: a sandbox's string methods may be on while a view is written)
local VIEW = setmetatable({}, { __mode = "k" }) -- view -> { label, why, checks = { { path, copy, orig } }, backing }

-- A key as a path step: .name or [1] or ["a b"].
local function step_of(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return "." .. k end
  if type(k) == "string" then return sformat("[%q]", k) end
  return "[" .. tostring(k) .. "]"
end

local function plain(v) return type(v) == "table" and getmetatable(v) == nil end

local function deep_copy(v, seen)
  if not plain(v) then return v end
  if seen[v] then return seen[v] end
  local c = {}
  seen[v] = c
  for k, x in pairs(v) do c[k] = deep_copy(x, seen) end
  return c
end

function RO.copy(v) return deep_copy(v, {}) end

local function shallow_copy(v)
  local c = {}
  for k, x in pairs(v) do c[k] = x end
  return c
end

-- The first place (a path from path) where a differs from b, with both
-- values, or nil. Plain data is compared by value (NaN equal to NaN);
-- functions, tensors and objects only by kind (a sandbox sees wrappers and
-- proxies of the host's).
local function first_diff(a, b, path, seen)
  if rawequal(a, b) then return nil end
  if plain(a) and plain(b) then
    if seen[a] == b then return nil end
    seen[a] = b
    for k, x in pairs(a) do
      local p, va, vb = first_diff(x, rawget(b, k), path .. step_of(k), seen)
      if p then return p, va, vb end
    end
    for k, x in pairs(b) do
      if rawget(a, k) == nil then return path .. step_of(k), nil, x end
    end
    return nil
  end
  local ta, tb = type(a), type(b)
  if ta == "number" and tb == "number" and a ~= a and b ~= b then return nil end
  if ta == tb and not plain(a) and (ta == "table" or ta == "function" or ta == "cdata" or ta == "userdata") then
    return nil
  end
  return path, a, b
end

local function shown(v)
  if type(v) == "string" then return sformat("%q", v) end
  if type(v) == "table" then return "a table" end
  return tostring(v)
end

local function refuse(view, k)
  local st = VIEW[view]
  E.raise(E.EINVAL, "cannot set %s%s: %s", st.label, step_of(k), st.why)
end

-- A view over backing (its fields); st: { label, why, checks } (a view
-- and its imports share checks).
local function new_view(backing, st)
  local view = setmetatable({}, { __index = backing, __newindex = refuse, __metatable = "muon read-only view",
    __tostring = function() return "read-only " .. st.label end })
  VIEW[view] = { label = st.label, why = st.why, checks = st.checks, backing = backing }
  return view
end

-- (The contract: the block at the top.)
function RO.view(fields, label, why, shallow)
  local backing, checks = {}, {}
  for k, v in pairs(fields) do
    if plain(v) then
      local c = shallow and shallow[k] and shallow_copy(v) or deep_copy(v, {})
      backing[k] = c
      checks[#checks + 1] = { label .. step_of(k), c, v }
    else
      backing[k] = v
    end
  end
  return new_view(backing, { label = label, why = why or "it is read-only", checks = checks })
end

function RO.is_view(x) return VIEW[x] ~= nil end

-- (The contract: the block at the top.)
function RO.import(view, f)
  local st = VIEW[view]
  local backing = {}
  for k, v in pairs(st.backing) do
    local x = f(v)
    backing[k] = x
    if plain(v) then st.checks[#st.checks + 1] = { st.label .. step_of(k), x, v } end
  end
  return new_view(backing, st)
end

-- (The contract: the block at the top.)
function RO.unchanged(now, was, path, who, why)
  local at, a, b = first_diff(now, was, path, {})
  if at then E.raise(E.ELUA, "%s: changed %s (%s -> %s): %s; nothing was changed", who, at, shown(b), shown(a), why) end
end

-- (The contract: the block at the top.)
function RO.verify(view, hook)
  local st = VIEW[view]
  for _, c in ipairs(st.checks) do RO.unchanged(c[2], c[3], c[1], hook, st.why) end
end

return RO
