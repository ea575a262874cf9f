-- Tensor view fuzzer: random chains of views and ops on small tensors (the
-- views, copy, add, the reductions, matmul, and the maths of
-- lua/muon/tensor_math.lua: exp .. sigmoid, pow, softmax, argmax, gather,
-- cat, stack, the constructors and tostring), with
-- random and extreme arguments (0, +-1, 2^31, 2^32, 2^53, 2^63, NaN, inf,
-- fractions). Every accepted result must address only elements inside its
-- storage (checked here from its fields, independently of C's own check),
-- and every rejection must be a muon error object with an MU_E* code and a
-- message. A crash or an out-of-bounds access is caught by the sanitizers
-- (make test SAN=1, make fuzz).
--
--   local F = require("tensor_fuzz")
--   local stats = F.run({ seed = 1, iterations = 2000 })   -- or seconds = 60
local ffi = require("ffi")
local T = require("muon.tensor")
local E = require("muon.errors")
local C = require("muon.core").C

local F = {}

local EXTREMES = { 0, 1, -1, 2, -2, 3, 2 ^ 31 - 1, 2 ^ 31, 2 ^ 32, 2 ^ 32 + 1, 2 ^ 53, 2 ^ 53 + 2, 2 ^ 62, 2 ^ 63,
  -2 ^ 63, 2 ^ 64, 0 / 0, 1 / 0, -1 / 0, 0.5, 1.5, -0.5, 1e308, -0.0 }
local CODES = { [E.EINVAL] = true, [E.ESHAPE] = true, [E.ESTATE] = true, [E.EDTYPE] = true }

-- Huge sizes only occur in empty tensors (every other shape is small);
-- ops that allocate a result are skipped on them, whose result (a sum over
-- the empty dim of a (2^32, 3, 0) tensor has 3 * 2^32 elements) could be
-- an allocation of gigabytes: legal, and not what this fuzzer looks for.
local function has_huge_dim(...)
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    for d = 0, t.ndim - 1 do
      if t.dims[d] > 4096 then return true end
    end
  end
  return false
end

-- Park-Miller generator: exact in doubles, the same stream everywhere.
local function rng(seed)
  local s = (seed % 2147483646) + 1
  local r = {}
  function r.next()
    s = s * 16807 % 2147483647
    return s
  end
  function r.int(lo, hi) return lo + r.next() % (hi - lo + 1) end
  function r.pick(list) return list[r.int(1, #list)] end
  function r.chance(p) return r.next() / 2147483647 < p end
  return r
end

-- An argument: mostly small and plausible, sometimes extreme.
local function arg(r, hi)
  if r.chance(0.25) then return r.pick(EXTREMES) end
  return r.int(-1, (hi or 4) + 1)
end

local function describe(x)
  if type(x) == "table" then
    local parts = {}
    for i = 1, #x do parts[i] = describe(x[i]) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return tostring(x)
end

-- Storages of the roots: data base address and size in bytes, found by
-- shares_storage (views keep their root's storage).
local function storage_of(roots, t)
  for _, root in ipairs(roots) do
    if t:shares_storage(root.t) then return root end
  end
  return nil
end

local function add_root(roots, t)
  local es = t:dtype() == "float64" and 8 or 4
  local root = { t = t, base = ffi.cast("char *", t.data), nbytes = t:numel() * es }
  roots[#roots + 1] = root
  return root
end

-- The invariant of an accepted view, from its fields (int64 arithmetic in
-- doubles is exact here: anything above 2^53 is already a failure).
function F.check_view(roots, t, what)
  if not T.is_tensor(t) then return end
  local root = storage_of(roots, t) or add_root(roots, t)
  local es = t:dtype() == "float64" and 8 or 4
  local nd = t.ndim
  assert(nd >= 0 and nd <= 8, what .. ": ndim " .. nd)
  local off = tonumber(t.offset)
  assert(off >= 0 and off <= 2 ^ 53, what .. ": offset " .. off)
  assert(ffi.cast("char *", t.data) == root.base + off * es, what .. ": data pointer and offset disagree")
  local hi, empty = off, false
  for i = 0, nd - 1 do
    local d = tonumber(t.dims[i])
    assert(d >= 0 and d <= 2 ^ 53, what .. ": size " .. d)
    if d == 0 then empty = true end
  end
  -- (an empty view addresses nothing: its strides are never followed)
  for i = 0, nd - 1 do
    local d, s = tonumber(t.dims[i]), tonumber(t.strides[i])
    if d > 1 and not empty then
      assert(s >= 0, what .. ": negative stride " .. s)
      hi = hi + (d - 1) * s
      assert(hi <= 2 ^ 53, what .. ": extent beyond 2^53")
    end
  end
  if not empty then
    assert((hi + 1) * es <= root.nbytes,
      ("%s: addresses elements %d..%d of a %d-byte storage"):format(what, off, hi, root.nbytes))
  end
  assert(C.mu_tensor_check(t) == 0, what .. ": mu_tensor_check refuses it")
  -- get reads exactly the element the fields say (spot check: last one)
  if not empty and nd > 0 then
    local idx = {}
    for i = 1, nd do idx[i] = tonumber(t.dims[i - 1]) end
    local p = ffi.cast(es == 8 and "double *" or "float *", root.base)
    assert(t:get(unpack(idx)) == p[hi] or p[hi] ~= p[hi], what .. ": get reads another element")
  end
end

local function check_error(ok, err, what)
  if ok then return end
  assert(E.is(err), what .. ": rejected with a plain " .. type(err) .. ": " .. tostring(err))
  assert(CODES[err.code], what .. ": unexpected code " .. tostring(E.name(err.code)) .. ": " .. err.msg)
  assert(type(err.msg) == "string" and #err.msg > 0, what .. ": empty message")
end

local function random_shape(r, maxdims, extreme)
  local n, shape = r.int(0, maxdims), {}
  for i = 1, n do shape[i] = extreme and arg(r, 4) or r.int(0, 4) end
  return shape
end

-- One random operation on a tensor from the pool. Returns a description
-- and the result (a tensor, a number, or nil) of a pcall.
local function step(r, pool)
  local t = r.pick(pool)
  local nd = t.ndim
  local k = r.int(1, 24)
  local o = r.pick(pool)
  if (k == 8 or (k >= 11 and k <= 15) or (k >= 17 and k ~= 23)) and has_huge_dim(t, o) then k = 3 end
  if k == 1 then
    local shape = random_shape(r, 4, true)
    if r.chance(0.3) then shape[#shape + 1] = -1 end
    return "view" .. describe(shape), pcall(t.view, t, shape)
  elseif k == 2 then
    local shape = random_shape(r, 4, true)
    return "reshape" .. describe(shape), pcall(t.reshape, t, shape)
  elseif k == 3 then
    local a, b = arg(r, nd), arg(r, nd)
    return ("transpose(%s, %s)"):format(a, b), pcall(t.transpose, t, a, b)
  elseif k == 4 then
    local d, s, l = arg(r, nd), arg(r, 4), arg(r, 4)
    return ("narrow(%s, %s, %s)"):format(d, s, l), pcall(t.narrow, t, d, s, l)
  elseif k == 5 then
    local d, i = arg(r, nd), arg(r, 4)
    return ("select(%s, %s)"):format(d, i), pcall(t.select, t, d, i)
  elseif k == 6 then
    local d = arg(r, nd)
    return ("squeeze(%s)"):format(d), pcall(t.squeeze, t, d)
  elseif k == 7 then
    local d = arg(r, nd + 1)
    return ("unsqueeze(%s)"):format(d), pcall(t.unsqueeze, t, d)
  elseif k == 8 then
    return "contiguous()", pcall(t.contiguous, t)
  elseif k == 9 then
    local idx = {}
    for i = 1, nd + (r.chance(0.1) and 1 or 0) do idx[i] = arg(r, 4) end
    return "get" .. describe(idx), pcall(t.get, t, unpack(idx, 1, #idx))
  elseif k == 10 then
    local idx = {}
    for i = 1, nd do idx[i] = arg(r, 4) end
    local v = r.pick({ 1, -2.5, 0 / 0, 1 / 0 })
    return "set" .. describe(idx), pcall(t.set, t, v, unpack(idx, 1, #idx))
  elseif k == 11 then
    return "clone()", pcall(t.clone, t, r.chance(0.5) and "float64" or nil)
  elseif k == 12 then
    return "add(other)", pcall(T.add, t, o, r.chance(0.5) and 2 or nil)
  elseif k == 13 then
    return "copy(other)", pcall(t.copy, t, o)
  elseif k == 14 then
    local d = r.chance(0.3) and nil or arg(r, nd)
    local op = r.pick({ "sum", "mean", "norm", "amax" })
    if op == "norm" then return op .. "(dim " .. tostring(d) .. ")", pcall(t.norm, t, nil, d) end
    return op .. "(dim " .. tostring(d) .. ")", pcall(t[op], t, d, r.chance(0.5))
  elseif k == 15 then
    return "matmul(other)", pcall(T.matmul, t, o)
  elseif k == 17 then
    local op = r.pick({ "exp", "log", "tanh", "sigmoid" }) .. (r.chance(0.5) and "_" or "")
    return op .. "()", pcall(t[op], t)
  elseif k == 18 then
    local e = r.chance(0.5) and o or r.pick({ 2, 3, -2, 0.5, -0.5, -1, 0, 1.5, 0 / 0 })
    if r.chance(0.2) then return "pow(number, other)", pcall(T.pow, 2, o) end
    local op = r.chance(0.5) and "pow_" or "pow"
    return op .. "(" .. (T.is_tensor(e) and "other" or tostring(e)) .. ")", pcall(t[op], t, e)
  elseif k == 19 then
    local d = arg(r, nd)
    local op = r.pick({ "softmax", "log_softmax" })
    return ("%s(%s)"):format(op, d), pcall(t[op], t, d)
  elseif k == 20 then
    local d = r.chance(0.3) and nil or arg(r, nd)
    return ("argmax(%s)"):format(tostring(d)), pcall(t.argmax, t, d, r.chance(0.5))
  elseif k == 21 then
    -- an index of t's rank, mostly within t's sizes and range, sometimes not
    local d = arg(r, nd)
    local shape, n = {}, 1
    for i = 1, nd + (r.chance(0.1) and 1 or 0) do
      shape[i] = r.int(0, (i <= nd and tonumber(t.dims[i - 1]) or 1) + (r.chance(0.1) and 1 or 0))
      n = n * shape[i]
    end
    local vals = {}
    for i = 1, n do vals[i] = r.chance(0.9) and r.int(1, 4) or r.pick({ 0, -1, 1.5, 0 / 0, 2 ^ 53, 1 / 0 }) end
    local index = r.chance(0.2) and o or T.from(vals, shape, r.chance(0.5) and "float64" or nil)
    return ("gather(%s, index%s)"):format(d, describe(index:size())), pcall(t.gather, t, d, index)
  elseif k == 22 then
    local d = arg(r, nd + 1)
    local list = r.chance(0.7) and { t, o } or { t, t, r.chance(0.5) and t or T.zeros({ 0 }) }
    local op = r.chance(0.5) and "cat" or "stack"
    return ("%s({...}, %s)"):format(op, d), pcall(T[op], list, d)
  elseif k == 23 then
    return "tostring()", pcall(tostring, t)
  elseif k == 24 then
    local op = r.pick({ "zeros_like", "ones_like", "rand_like", "randn_like", "full_like" })
    if op == "full_like" then return op .. "()", pcall(T.full_like, t, 0.5) end
    return op .. "()", pcall(T[op], t, op:find("^rand") and r.int(1, 100) or nil)
  else
    local shape = random_shape(r, 3, true)
    -- only shapes that allocate nothing big: an empty one, or one that
    -- overflows (must be refused)
    local n, has0 = 1, false
    for i = 1, #shape do
      if shape[i] == 0 then has0 = true end
      n = n * math.abs(shape[i] == shape[i] and shape[i] or 1)
    end
    if not has0 and n <= 4096 and n == n then
      return "zeros" .. describe(shape), pcall(T.zeros, shape)
    end
    if has0 or n > 2 ^ 64 or n ~= n then
      return "zeros" .. describe(shape), pcall(T.zeros, shape)
    end
    return "zeros{}", pcall(T.zeros, {})
  end
end

-- opts: seed, and iterations or seconds. Returns { ops, accepted, rejected }.
function F.run(opts)
  local r = rng(opts.seed or 1)
  local deadline = opts.seconds and os.clock() + opts.seconds
  local iterations = opts.iterations or math.huge
  local pool, roots = {}, {}
  local stats = { ops = 0, accepted = 0, rejected = 0 }
  local function fresh()
    local shape = random_shape(r, 4, false)
    local t = T.randn(shape, r.int(1, 1000), r.chance(0.5) and "float64" or nil)
    add_root(roots, t)
    return t
  end
  for i = 1, 8 do pool[i] = fresh() end
  local chain = {}
  while stats.ops < iterations and (not deadline or os.clock() < deadline) do
    stats.ops = stats.ops + 1
    if stats.ops % 64 == 0 then -- new roots now and then; forget old ones
      pool = { fresh(), fresh(), pool[1], pool[2], pool[3], pool[4] }
      local keep = {}
      for _, root in ipairs(roots) do
        for _, t in ipairs(pool) do
          if t:shares_storage(root.t) then keep[#keep + 1] = root break end
        end
      end
      roots = keep
      chain = {}
    end
    local what, ok, res = step(r, pool)
    chain[#chain + 1] = what
    if #chain > 12 then table.remove(chain, 1) end
    local where = ("seed %d, op %d: %s"):format(opts.seed or 1, stats.ops, table.concat(chain, " -> "))
    check_error(ok, res, where)
    if ok then
      stats.accepted = stats.accepted + 1
      if T.is_tensor(res) then
        F.check_view(roots, res, where)
        if #pool < 24 then pool[#pool + 1] = res else pool[r.int(1, #pool)] = res end
      end
    else
      stats.rejected = stats.rejected + 1
    end
  end
  return stats
end

return F
