-- Option checks for the kinds' schemas (muon.optim.kind), and the param
-- groups of the one-process optimizers (muon.optim.Muon / AdamW / Lion).
--
-- A check is a function(value, name, group) that raises an EINVAL error
-- object (no position) whose message names the option and the value, and
-- returns nothing; group is the whole option table, for checks that depend
-- on another option. The constructors below make the usual ones:
--
--   O.number(0)("lr", -1)      --> error "lr must be >= 0, got -1"
--   O.oneof({ "a", "b" })      --> "... must be 'a' or 'b', got 'c'"
local P = require("muon.param")
local E = require("muon.errors")

local O = {}

-- Sorted list of the keys of t missing from allowed.
function O.unknown_keys(t, allowed)
  local bad = {}
  for k in pairs(t) do
    if allowed[k] == nil then bad[#bad + 1] = tostring(k) end
  end
  table.sort(bad)
  return bad
end

-- Copy defaults, then overrides (already checked for unknown keys).
function O.merge(defaults, overrides)
  local r = {}
  for k, v in pairs(defaults) do r[k] = v end
  for k, v in pairs(overrides or {}) do r[k] = v end
  return r
end

local function is_finite(x)
  return type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge
end
O.is_finite = is_finite

local function fail(fmt, ...) E.raise(E.EINVAL, fmt, ...) end

-- A finite number, >= min when min is given.
function O.number(min)
  return function(v, name)
    if not is_finite(v) then fail("%s must be a finite number, got %s", name, E.value(v)) end
    if min and v < min then fail("%s must be >= %s, got %s", name, tostring(min), tostring(v)) end
  end
end

function O.boolean()
  return function(v, name)
    if type(v) ~= "boolean" then fail("%s must be a boolean, got %s", name, E.value(v)) end
  end
end

function O.integer(min)
  return function(v, name)
    if type(v) ~= "number" or v ~= math.floor(v) or v < min then
      fail("%s must be an integer >= %d, got %s", name, min, E.value(v))
    end
  end
end

-- A function, a callable table, or nil.
function O.fn()
  return function(v, name)
    if v ~= nil and type(v) ~= "function" and not (type(v) == "table" and getmetatable(v) and getmetatable(v).__call) then
      fail("%s must be a function or nil, got %s", name, type(v))
    end
  end
end

-- One of the strings in choices (a list).
function O.oneof(choices)
  local quoted = {}
  for i, c in ipairs(choices) do quoted[i] = "'" .. c .. "'" end
  local want = table.concat(quoted, " or ")
  return function(v, name)
    for _, c in ipairs(choices) do
      if v == c then return end
    end
    fail("%s must be %s, got %s", name, want, type(v) == "string" and ("'" .. v .. "'") or tostring(v))
  end
end

-- A pair {beta1, beta2} of numbers in [0, 1) (AdamW's and Lion's betas).
function O.betas()
  local num = O.number(0)
  return function(b, name)
    if type(b) ~= "table" or #b ~= 2 then fail("%s must be a pair {beta1, beta2}, got %s", name, E.value(b)) end
    for i = 1, 2 do
      local n = name .. "[" .. i .. "]"
      num(b[i], n)
      if b[i] >= 1 then fail("%s must be in [0, 1), got %s", n, tostring(b[i])) end
    end
  end
end

-- Raise a misuse error of a public function: blamed on the user's line
-- that called muon (E.blame) when blame is set, else without a position.
local function misuse(blame, fmt, ...)
  if blame then E.blame(E.EINVAL, fmt, ...) end
  E.raise(E.EINVAL, fmt, ...)
end

-- Run f(...); an error it raises is raised again as a misuse (see misuse).
local function checked(blame, f, ...)
  local ok, err = pcall(f, ...)
  if not ok then
    if blame then E.blame(E.code(err) or E.EINVAL, "%s", E.message(err)) end
    error(err, 0)
  end
end

-- Keys a param group may hold besides the optimizer's options.
local GROUP_KEYS = { params = true, name = true, step = true }

-- Validate the constructor arguments of an optimizer and build its groups,
-- following torch: params is a list of muon.param, or a list of groups
-- { params = {...}, <option overrides> }. spec = { what = "Muon", defaults,
-- allowed, resolve = function(group), check_param = function(p) (may be
-- nil), first = the number of the first group in messages (1), blame =
-- whether misuse is blamed on the caller's line (E.blame: a constructor) }.
-- Returns the resolved defaults and the list of groups.
function O.build_groups(spec, params, opts)
  local blame = spec.blame
  opts = opts or {}
  if type(opts) ~= "table" then misuse(blame, "%s: options must be a table", spec.what) end
  local unknown = O.unknown_keys(opts, spec.allowed)
  if #unknown > 0 then
    misuse(blame, "%s", E.unexpected(spec.what, unknown, spec.allowed))
  end
  if type(params) ~= "table" then misuse(blame, "%s: params must be a table", spec.what) end
  local defaults = O.merge(spec.defaults, opts)
  checked(blame, spec.resolve, defaults)
  local list = params
  if #params == 0 or P.is_param(params[1]) then list = { { params = params } } end
  local groups, seen = {}, {}
  for gi, g in ipairs(list) do
    local where = ("%s param group %d"):format(spec.what, gi + (spec.first or 1) - 1)
    if type(g) ~= "table" or type(g.params) ~= "table" then
      misuse(blame, "%s must be a table with a params list", where)
    end
    local bad, valid = {}, {}
    for k in pairs(g) do
      if not GROUP_KEYS[k] and not spec.allowed[k] then bad[#bad + 1] = tostring(k) end
    end
    table.sort(bad)
    if #bad > 0 then
      for k in pairs(GROUP_KEYS) do valid[k] = true end
      for k in pairs(spec.allowed) do valid[k] = true end
      misuse(blame, "%s: %s", where, E.unknown("key", bad, valid))
    end
    for i, p in ipairs(g.params) do
      if not P.is_param(p) then
        misuse(blame, "%s: params[%d] is not a muon.param (use muon.param(name, value, grad))", where, i)
      end
      local ok, err = pcall(P.check, p.name, p.value, p.grad)
      if not ok then error(E.wrap(err, where .. ": ", E.EINVAL), 0) end
      if seen[p.name] then
        E.raise(E.EINVAL, "%s: parameter '%s' appears twice (%s)", where, p.name,
          seen[p.name] == p and "the same muon.param" or "two parameters with one name")
      end
      seen[p.name] = p
      if spec.check_param then checked(blame, spec.check_param, p) end
    end
    local group = O.merge(defaults, g)
    checked(blame, spec.resolve, group)
    group.step = g.step or 0
    groups[gi] = group
  end
  return defaults, groups
end

return O
