-- The core maths of muon.tensor (lua/muon/tensor.lua installs them):
-- elementwise ops on C's one strided map, reductions, matrix products and
-- the operators. Each op is one C loop (mu_tensor_map / mu_tensor_reduce /
-- mu_tensor_matmul in src/tensor_math.c). Here: argument checks with
-- torch-like messages, broadcast shapes, and the result tensors
-- (out-of-place forms allocate a new contiguous tensor; in-place forms,
-- name_, write self). The maths for ports from torch build on these:
-- lua/muon/tensor_math.lua.
--[[ reference muon.tensor
## Maths
    Each op is one C loop (mu_tensor_map, mu_tensor_reduce,
    mu_tensor_matmul). Operands: tensors of one dtype (float32 or float64;
    a mismatch names both) or Lua numbers (rounded to the dtype first),
    strided views allowed, shapes broadcast as NumPy and torch do. x:op(...)
    returns a new contiguous tensor of the broadcast shape; x:op_(...)
    writes x and returns it (the broadcast shape must be x's own; an operand
    overlapping x in another layout is an error). T.op(x, ...) is x:op(...).
    Float32 ops round every step, with a fused multiply-add only where
    torch's CPU kernels use one (add, sub with alpha, addcmul, lerp).
Tensor:add(y, alpha)
Tensor:add_(y, alpha)
Tensor:sub(y, alpha)
Tensor:sub_(y, alpha)
muon.tensor.add(x, y, alpha)
muon.tensor.add_(x, y, alpha)
muon.tensor.sub(x, y, alpha)
muon.tensor.sub_(x, y, alpha)
    x + alpha*y, x - alpha*y as one fused multiply-add; alpha default 1.
    Operators: x + y, x - y, n - x (a tensor or a number on either side).
Tensor:mul(y)
Tensor:mul_(y)
Tensor:div(y)
Tensor:div_(y)
muon.tensor.mul(x, y)
muon.tensor.mul_(x, y)
muon.tensor.div(x, y)
muon.tensor.div_(x, y)
    x * y, x / y elementwise (y a tensor or a number); also x * y, x / y,
    n / x (one true division).
Tensor:addcmul(t1, t2, value)
Tensor:addcmul_(t1, t2, value)
Tensor:addcdiv(t1, t2, value)
Tensor:addcdiv_(t1, t2, value)
muon.tensor.addcmul(x, t1, t2, value)
muon.tensor.addcmul_(x, t1, t2, value)
muon.tensor.addcdiv(x, t1, t2, value)
muon.tensor.addcdiv_(x, t1, t2, value)
    x + value*t1*t2 (as fma(value*t1, t2, x)), x + (value*t1)/t2; value
    default 1.
Tensor:lerp(y, weight)
Tensor:lerp_(y, weight)
muon.tensor.lerp(x, y, weight)
muon.tensor.lerp_(x, y, weight)
    x + weight*(y - x), weight a number or a tensor (torch's two-sided fma
    form).
Tensor:neg()
Tensor:neg_()
Tensor:abs()
Tensor:abs_()
Tensor:sqrt()
Tensor:sqrt_()
Tensor:rsqrt()
Tensor:rsqrt_()
Tensor:sign()
Tensor:sign_()
muon.tensor.neg(x)
muon.tensor.neg_(x)
muon.tensor.abs(x)
muon.tensor.abs_(x)
muon.tensor.sqrt(x)
muon.tensor.sqrt_(x)
muon.tensor.rsqrt(x)
muon.tensor.rsqrt_(x)
muon.tensor.sign(x)
muon.tensor.sign_(x)
    Elementwise; -x is x:neg(). sign(NaN) and sign(-0) are 0.
Tensor:clamp(min, max)
Tensor:clamp_(min, max)
muon.tensor.clamp(x, min, max)
muon.tensor.clamp_(x, min, max)
    Clamp to [min, max]; either bound may be nil (not both, not NaN); NaN
    stays NaN.
Tensor:gt(y)
Tensor:gt_(y)
Tensor:lt(y)
Tensor:lt_(y)
Tensor:ge(y)
Tensor:ge_(y)
Tensor:le(y)
Tensor:le_(y)
Tensor:eq(y)
Tensor:eq_(y)
Tensor:ne(y)
Tensor:ne_(y)
muon.tensor.gt(x, y)
muon.tensor.gt_(x, y)
muon.tensor.lt(x, y)
muon.tensor.lt_(x, y)
muon.tensor.ge(x, y)
muon.tensor.ge_(x, y)
muon.tensor.le(x, y)
muon.tensor.le_(x, y)
muon.tensor.eq(x, y)
muon.tensor.eq_(x, y)
muon.tensor.ne(x, y)
muon.tensor.ne_(x, y)
    Comparisons: 1 where true, 0 where false, in x's dtype (methods, not
    operators). NaN compares false except for ne.
muon.tensor.where(c, a, b)
Tensor:where(c, y)
    c ~= 0 ? a : b per element (a, b tensors or numbers; NaN in c counts as
    true); x:where(c, y) is T.where(c, x, y), as torch's Tensor.where.
Tensor:masked_fill(mask, v)
Tensor:masked_fill_(mask, v)
muon.tensor.masked_fill(x, mask, v)
muon.tensor.masked_fill_(x, mask, v)
    v (a number) where mask ~= 0, x elsewhere.
Tensor:sum(dim, keepdim)
Tensor:mean(dim, keepdim)
Tensor:amax(dim, keepdim)
muon.tensor.sum(x, dim, keepdim)
muon.tensor.mean(x, dim, keepdim)
muon.tensor.amax(x, dim, keepdim)
    Along dim (1-based, negative from the end), accumulated in double,
    rounded once. dim nil: over every element, a Lua number (the double
    itself), or with keepdim = true a tensor of size-1 dims. The sum of
    nothing is 0, the mean NaN; amax of nothing is an error (ESHAPE) and
    propagates NaN.
Tensor:norm(p, dim, keepdim)
muon.tensor.norm(x, p, dim, keepdim)
    The 2-norm (p nil, 2 or "fro"; any other p is an error), along dim or
    over everything (x:norm(): a Lua number), accumulated in double.
Tensor:mm(y)
muon.tensor.mm(x, y)
    (n x k) @ (k x m) through OpenBLAS sgemm/dgemm; a k mismatch is ESHAPE.
Tensor:bmm(y)
muon.tensor.bmm(x, y)
    (b x n x k) @ (b x k x m), the same b.
Tensor:matmul(y)
muon.tensor.matmul(x, y)
    torch.matmul for 1-D to 3-D operands: a 1-D left operand is a row, a
    1-D right one a column (dropped from the result); a 2-D operand against
    a 3-D one is used for every batch.
]]
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")

local C, check = core.C, core.check
local blame = E.blame

local M = {}

-- Define the maths on T (muon.tensor: its methods, adopt, DTYPE_NAMES,
-- is_tensor) and give tensors their metatable.
function M.install(T)
  local methods, adopt, DTYPE_NAMES = T.methods, T.adopt, T.DTYPE_NAMES
  local i64_arr, out_box = ffi.typeof("int64_t[?]"), ffi.typeof("mu_tensor *[1]")

  --
  -- Each op is one C loop (mu_tensor_map / mu_tensor_reduce / mu_tensor_matmul
  -- in src/tensor_math.c). Here: argument checks with torch-like messages,
  -- broadcast shapes, and the result tensors (out-of-place forms allocate a
  -- new contiguous tensor; in-place forms, name_, write self).

  local is_tensor = T.is_tensor
  local map_args = ffi.new("mu_map_args") -- reused: one call at a time

  local shape_str = T.shape_string

  local function list_str(names, parts)
    local s = {}
    for i = 1, #parts do s[i] = names[i] .. " " .. parts[i] end
    if #s <= 2 then return table.concat(s, " and ") end
    return table.concat(s, ", ", 1, #s - 1) .. " and " .. s[#s]
  end

  -- New contiguous tensor of dtype code `code` and shape `dims` (a Lua array
  -- of at most MU_MAX_DIMS sizes taken from existing tensors).
  local new_shape, new_box = i64_arr(C.MU_MAX_DIMS), out_box()
  local function new_tensor(code, dims, what)
    local n = #dims
    for i = 1, n do new_shape[i - 1] = dims[i] end
    local rc = C.mu_tensor_new(code, n, new_shape, new_box)
    if rc ~= 0 then check(rc, what) end
    return adopt(new_box)
  end

  -- Elementwise op specs: the C op, the operand names (for messages), which
  -- operands may be numbers, and which one is "self" (written in place).
  local function spec(name, op, names, numbers, self_index)
    return { name = name, op = op, names = names, numbers = numbers, arity = #names, self_index = self_index or 1 }
  end

  local function ref_name_of(sp, ops, ref)
    for i = 1, sp.arity do
      if ops[i] == ref then return sp.names[i] end
    end
  end

  local function broadcast_error(sp, ops)
    local shown, shapes = {}, {}
    for i = 1, sp.arity do
      if is_tensor(ops[i]) then
        shown[#shown + 1], shapes[#shapes + 1] = sp.names[i], shape_str(ops[i])
      end
    end
    blame(E.ESHAPE, ("%s: shapes %s are not broadcastable"):format(sp.name, list_str(shown, shapes)))
  end

  -- out = op(a, b, c) (out nil: a new tensor of the broadcast shape). p holds
  -- the op's scalar parameters (alpha, value, lo, hi). Messages are built only
  -- on failure: this runs per op of every hook call.
  local function run_map(sp, out, a, b, c, p)
    local name, names, arity = sp.name, sp.names, sp.arity
    local ops = { a, b, c }
    local ref = ops[sp.self_index]
    if not is_tensor(ref) then
      ref = nil
      for i = 1, arity do
        if is_tensor(ops[i]) then ref = ops[i] break end
      end
    end
    local nd = 0
    for i = 1, arity do
      local v = ops[i]
      if is_tensor(v) then
        -- a handle with bad fields fails here, before a result is allocated
        local rc = C.mu_tensor_check(v)
        if rc ~= 0 then check(rc, name .. ": " .. names[i]) end
        if v.scalar ~= ref.scalar then
          blame(E.EDTYPE, ("%s: dtype mismatch: %s is %s but %s is %s"):format(name, names[i], DTYPE_NAMES[v.scalar],
            ref_name_of(sp, ops, ref), DTYPE_NAMES[ref.scalar]))
        end
        if v.ndim > nd then nd = v.ndim end
      elseif type(v) ~= "number" or not sp.numbers[i] then
        blame(E.EINVAL, ("%s: %s must be a tensor%s, got %s"):format(name, names[i], sp.numbers[i] and " or a number" or "",
          type(v)))
      end
    end
    if ref == nil then blame(E.EINVAL, name .. ": no tensor among the arguments") end
    -- broadcast shape (NumPy rules)
    local dims = {}
    for i = 1, nd do dims[i] = 1 end
    for i = 1, arity do
      local t = ops[i]
      if is_tensor(t) then
        local lead = nd - t.ndim
        for j = 0, t.ndim - 1 do
          local d, k = tonumber(t.dims[j]), lead + j + 1
          if d ~= dims[k] and d ~= 1 then
            if dims[k] ~= 1 then broadcast_error(sp, ops) end
            dims[k] = d
          end
        end
      end
    end
    if out then
      local same = out.ndim == nd
      for i = 1, nd do same = same and tonumber(out.dims[i - 1]) == dims[i] end
      if not same then
        blame(E.ESHAPE, ("%s: self's shape %s does not match the broadcast shape [%s] (in-place ops cannot grow self)")
          :format(name, shape_str(out), table.concat(dims, ", ")))
      end
    else
      out = new_tensor(ref.scalar, dims, name)
    end
    local m = map_args
    m.op = sp.op
    for i = 1, 3 do
      local v = ops[i]
      if i <= arity and is_tensor(v) then
        m.x[i - 1], m.s[i - 1] = v, 0
      else
        m.x[i - 1], m.s[i - 1] = nil, i <= arity and v or 0
      end
    end
    m.alpha, m.value = p and p.alpha or 1, p and p.value or 1
    m.lo, m.hi = p and p.lo or -math.huge, p and p.hi or math.huge
    -- C's messages name the C op and its operand roles (add: other ...);
    -- ops built on another C op (masked_fill on where) add their own name.
    local rc = C.mu_tensor_map(m, out)
    if rc ~= 0 then check(rc, sp.prefix) end
    return out
  end

  local function number_arg(v, default, name, what)
    if v == nil then return default end
    if type(v) ~= "number" then blame(E.EINVAL, ("%s: %s must be a number, got %s"):format(name, what, type(v))) end
    return v
  end

  -- Out-of-place and in-place (name_) forms of each op, as methods (self
  -- first) and module functions (T.add(a, b)). T.math_names lists them (the
  -- sandbox offers exactly these).
  T.math_names = {}
  local function define(name, fn)
    methods[name] = fn
    T[name] = fn
    T.math_names[#T.math_names + 1] = name
  end

  local SELF_OTHER, NUM2 = { "self", "other" }, { true, true }

  -- add/sub: self +- alpha * other (torch: one fused multiply-add).
  for _, name in ipairs({ "add", "sub" }) do
    local op = name == "add" and C.MU_MAP_ADD or C.MU_MAP_SUB
    local s, s_ = spec(name, op, SELF_OTHER, NUM2), spec(name .. "_", op, SELF_OTHER, NUM2)
    define(name, function(self, other, alpha)
      return run_map(s, nil, self, other, nil, { alpha = number_arg(alpha, 1, name, "alpha") })
    end)
    define(name .. "_", function(self, other, alpha)
      if not is_tensor(self) then blame(E.EINVAL, name .. "_: self must be a tensor, got " .. type(self)) end
      return run_map(s_, self, self, other, nil, { alpha = number_arg(alpha, 1, name .. "_", "alpha") })
    end)
  end

  -- mul, div and the comparisons (1 where true, 0 where false, in self's dtype).
  for _, d in ipairs({ { "mul", C.MU_MAP_MUL }, { "div", C.MU_MAP_DIV }, { "gt", C.MU_MAP_GT }, { "lt", C.MU_MAP_LT },
    { "ge", C.MU_MAP_GE }, { "le", C.MU_MAP_LE }, { "eq", C.MU_MAP_EQ }, { "ne", C.MU_MAP_NE } }) do
    local name, op = d[1], d[2]
    local s, s_ = spec(name, op, SELF_OTHER, NUM2), spec(name .. "_", op, SELF_OTHER, NUM2)
    define(name, function(self, other) return run_map(s, nil, self, other, nil, nil) end)
    define(name .. "_", function(self, other)
      if not is_tensor(self) then blame(E.EINVAL, name .. "_: self must be a tensor, got " .. type(self)) end
      return run_map(s_, self, self, other, nil, nil)
    end)
  end

  -- addcmul/addcdiv: self + value * tensor1 (* or /) tensor2.
  for _, d in ipairs({ { "addcmul", C.MU_MAP_ADDCMUL }, { "addcdiv", C.MU_MAP_ADDCDIV } }) do
    local name, op = d[1], d[2]
    local names, nums = { "self", "tensor1", "tensor2" }, { false, true, true }
    local s, s_ = spec(name, op, names, nums), spec(name .. "_", op, names, nums)
    define(name, function(self, t1, t2, value)
      return run_map(s, nil, self, t1, t2, { value = number_arg(value, 1, name, "value") })
    end)
    define(name .. "_", function(self, t1, t2, value)
      return run_map(s_, is_tensor(self) and self or nil, self, t1, t2,
        { value = number_arg(value, 1, name .. "_", "value") })
    end)
  end

  -- lerp: self + weight * (end - self), weight a number or a tensor.
  do
    local names, nums = { "self", "end", "weight" }, { false, false, true }
    local s, s_ = spec("lerp", C.MU_MAP_LERP, names, nums), spec("lerp_", C.MU_MAP_LERP, names, nums)
    define("lerp", function(self, e, weight) return run_map(s, nil, self, e, weight, nil) end)
    define("lerp_", function(self, e, weight)
      return run_map(s_, is_tensor(self) and self or nil, self, e, weight, nil)
    end)
  end

  -- Unary ops.
  for _, d in ipairs({ { "neg", C.MU_MAP_NEG }, { "abs", C.MU_MAP_ABS }, { "sqrt", C.MU_MAP_SQRT },
    { "rsqrt", C.MU_MAP_RSQRT }, { "sign", C.MU_MAP_SIGN }, { "exp", C.MU_MAP_EXP }, { "log", C.MU_MAP_LOG },
    { "tanh", C.MU_MAP_TANH }, { "sigmoid", C.MU_MAP_SIGMOID } }) do
    local name, op = d[1], d[2]
    local s, s_ = spec(name, op, { "self" }, { false }), spec(name .. "_", op, { "self" }, { false })
    define(name, function(self) return run_map(s, nil, self, nil, nil, nil) end)
    define(name .. "_", function(self) return run_map(s_, is_tensor(self) and self or nil, self, nil, nil, nil) end)
  end

  -- clamp(min, max): either bound may be nil (not both).
  do
    local s, s_ = spec("clamp", C.MU_MAP_CLAMP, { "self" }, { false }), spec("clamp_", C.MU_MAP_CLAMP, { "self" }, { false })
    local function bounds(name, lo, hi)
      if lo == nil and hi == nil then blame(E.EINVAL, name .. ": at least one of min and max must be given") end
      lo, hi = number_arg(lo, -math.huge, name, "min"), number_arg(hi, math.huge, name, "max")
      if lo ~= lo or hi ~= hi then blame(E.EINVAL, name .. ": min and max must not be NaN") end
      return { lo = lo, hi = hi }
    end
    define("clamp", function(self, lo, hi) return run_map(s, nil, self, nil, nil, bounds("clamp", lo, hi)) end)
    define("clamp_", function(self, lo, hi)
      return run_map(s_, is_tensor(self) and self or nil, self, nil, nil, bounds("clamp_", lo, hi))
    end)
  end

  -- where(condition, input, other): input where condition != 0, else other
  -- (condition a 0/1 comparison result or any tensor; NaN counts as true).
  do
    local s = spec("where", C.MU_MAP_WHERE, { "condition", "input", "other" }, { false, true, true }, 2)
    function T.where(cond, a, b) return run_map(s, nil, cond, a, b, nil) end
    -- torch's Tensor.where(condition, other)
    function methods:where(cond, other) return run_map(s, nil, cond, self, other, nil) end
    T.math_names[#T.math_names + 1] = "where"
    local names, nums = { "mask", "value", "self" }, { false, true, false }
    local m, m_ = spec("masked_fill", C.MU_MAP_WHERE, names, nums, 3), spec("masked_fill_", C.MU_MAP_WHERE, names, nums, 3)
    m.prefix, m_.prefix = "masked_fill", "masked_fill_"
    local function value_arg(name, v)
      if type(v) ~= "number" then blame(E.EINVAL, ("%s: value must be a number, got %s"):format(name, type(v))) end
      return v
    end
    define("masked_fill", function(self, mask, value)
      return run_map(m, nil, mask, value_arg("masked_fill", value), self, nil)
    end)
    define("masked_fill_", function(self, mask, value)
      return run_map(m_, is_tensor(self) and self or nil, mask, value_arg("masked_fill_", value), self, nil)
    end)
  end

  -- Reductions. dim: 1-based, negative counts from the end; nil reduces every
  -- element and returns a Lua number (the double accumulator, not rounded to
  -- float32), or with keepdim = true a tensor of size-1 dims (rounded).
  local function reduce_dim(t, d, name)
    local nd = t.ndim
    if nd == 0 then blame(E.EINVAL, ("%s: a 0-D tensor has no dim %s (reduce it with dim = nil)"):format(name, tostring(d))) end
    if type(d) ~= "number" or d ~= math.floor(d) or d == 0 or d > nd or d < -nd then
      blame(E.EINVAL, ("%s: dim %s out of range for a %d-D tensor (1..%d or -%d..-1)"):format(name, tostring(d), nd, nd, nd))
    end
    return d < 0 and nd + d + 1 or d
  end

  local function reduce(name, op, t, dim, keepdim)
    if not is_tensor(t) then blame(E.EINVAL, name .. ": self must be a tensor, got " .. type(t)) end
    if keepdim ~= nil and type(keepdim) ~= "boolean" then
      blame(E.EINVAL, name .. ": keepdim must be a boolean, got " .. type(keepdim))
    end
    check(C.mu_tensor_check(t), name)
    if dim == nil then
      local v = ffi.new("double[1]")
      if op == C.MU_REDUCE_AMAX and t:numel() == 0 then blame(E.ESHAPE, "amax: the tensor is empty (no identity)") end
      check(C.mu_tensor_reduce_all(t, op, v))
      if not keepdim then return v[0] end
      local dims = {}
      for i = 1, t.ndim do dims[i] = 1 end
      return new_tensor(t.scalar, dims, name):fill(v[0])
    end
    local d = reduce_dim(t, dim, name)
    local dims = {}
    for i = 1, t.ndim do
      if i ~= d then dims[#dims + 1] = tonumber(t.dims[i - 1]) elseif keepdim then dims[#dims + 1] = 1 end
    end
    if op == C.MU_REDUCE_AMAX and t.dims[d - 1] == 0 then
      local n = 1
      for _, s in ipairs(dims) do n = n * s end
      if n > 0 then blame(E.ESHAPE, ("amax: dim %d has size 0 (no identity)"):format(d)) end
    end
    local out = new_tensor(t.scalar, dims, name)
    check(C.mu_tensor_reduce(t, op, d - 1, out))
    return out
  end

  define("sum", function(self, dim, keepdim) return reduce("sum", C.MU_REDUCE_SUM, self, dim, keepdim) end)
  define("mean", function(self, dim, keepdim) return reduce("mean", C.MU_REDUCE_MEAN, self, dim, keepdim) end)
  define("amax", function(self, dim, keepdim) return reduce("amax", C.MU_REDUCE_AMAX, self, dim, keepdim) end)
  -- norm(p, dim, keepdim): the 2-norm (p nil, 2 or "fro"), accumulated in double.
  define("norm", function(self, p, dim, keepdim)
    if p ~= nil and p ~= 2 and p ~= "fro" then
      blame(E.EINVAL, "norm: only p = 2 (\"fro\") is supported, got " .. tostring(p))
    end
    return reduce("norm", C.MU_REDUCE_NORM, self, dim, keepdim)
  end)

  -- Matrix products through OpenBLAS (float32 sgemm / float64 dgemm).
  local function product(name, a, b)
    if not is_tensor(a) then blame(E.EINVAL, name .. ": self must be a tensor, got " .. type(a)) end
    if not is_tensor(b) then blame(E.EINVAL, name .. ": other must be a tensor, got " .. type(b)) end
    check(C.mu_tensor_check(a), name .. ": self")
    check(C.mu_tensor_check(b), name .. ": other")
    if a.scalar ~= b.scalar then
      blame(E.EDTYPE, ("%s: dtype mismatch: self is %s but other is %s"):format(name, DTYPE_NAMES[a.scalar], DTYPE_NAMES[b.scalar]))
    end
    local nd = a.ndim
    local k, kb = tonumber(a.dims[nd - 1]), tonumber(b.dims[b.ndim - 2])
    if k ~= kb then
      blame(E.ESHAPE, ("%s: shapes %s and %s cannot be multiplied (%d != %d)"):format(name, shape_str(a), shape_str(b), k, kb))
    end
    local dims = {}
    if nd == 3 or b.ndim == 3 then
      local ba, bb = nd == 3 and tonumber(a.dims[0]) or 1, b.ndim == 3 and tonumber(b.dims[0]) or 1
      if ba ~= bb and ba ~= 1 and bb ~= 1 then
        blame(E.ESHAPE, ("%s: batch sizes of %s and %s differ"):format(name, shape_str(a), shape_str(b)))
      end
      dims[1] = math.max(ba, bb)
    end
    dims[#dims + 1] = tonumber(a.dims[nd - 2])
    dims[#dims + 1] = tonumber(b.dims[b.ndim - 1])
    local out = new_tensor(a.scalar, dims, name)
    check(C.mu_tensor_matmul(a, b, out))
    return out
  end

  local function need_dims(name, a, b, nd)
    for _, x in ipairs({ { "self", a }, { "other", b } }) do
      if not is_tensor(x[2]) then blame(E.EINVAL, ("%s: %s must be a tensor, got %s"):format(name, x[1], type(x[2]))) end
    end
    if a.ndim ~= nd or b.ndim ~= nd then
      blame(E.ESHAPE, ("%s: expected %d-D tensors, got %s and %s"):format(name, nd, shape_str(a), shape_str(b)))
    end
  end

  -- mm: (n x k) @ (k x m).
  define("mm", function(self, other)
    need_dims("mm", self, other, 2)
    return product("mm", self, other)
  end)

  -- bmm: (b x n x k) @ (b x k x m), the same b.
  define("bmm", function(self, other)
    need_dims("bmm", self, other, 3)
    if self.dims[0] ~= other.dims[0] then
      blame(E.ESHAPE, ("bmm: batch sizes differ: %s and %s"):format(shape_str(self), shape_str(other)))
    end
    return product("bmm", self, other)
  end)

  -- matmul as torch.matmul for up to 3 dims: 1-D operands are a row (left)
  -- or a column (right) vector, dropped from the result; a 2-D operand
  -- against a 3-D one is used for every batch.
  define("matmul", function(self, other)
    for _, x in ipairs({ { "self", self }, { "other", other } }) do
      if not is_tensor(x[2]) then blame(E.EINVAL, ("matmul: %s must be a tensor, got %s"):format(x[1], type(x[2]))) end
      if x[2].ndim < 1 or x[2].ndim > 3 then
        blame(E.ESHAPE, ("matmul: %s has shape %s; 1-D, 2-D and 3-D tensors are supported"):format(x[1], shape_str(x[2])))
      end
    end
    local a, b = self, other
    if a.ndim == 1 then a = a:unsqueeze(1) end
    if b.ndim == 1 then b = b:unsqueeze(2) end
    if a.ndim == 3 and b.ndim == 2 then b = b:unsqueeze(1) end
    if a.ndim == 2 and b.ndim == 3 then a = a:unsqueeze(1) end
    local out = product("matmul", a, b)
    if other.ndim == 1 then out = out:squeeze(out.ndim) end -- the column
    if self.ndim == 1 then out = out:squeeze(other.ndim == 1 and out.ndim or out.ndim - 1) end -- the row
    return out
  end)

  -- pow, softmax, argmax, gather, cat, stack, the other constructors, torch's
  -- in-place names and the repr: lua/muon/tensor_math.lua.
  local tensor_math = require("muon.tensor_math")
  tensor_math.install(T, { define = define, spec = spec, run_map = run_map, reduce = reduce, reduce_dim = reduce_dim,
    new_tensor = new_tensor, shape_str = shape_str, dtype_names = DTYPE_NAMES })

  -- Operators: tensor or number on either side (number - tensor and
  -- number / tensor are one operation each, a true division: torch computes
  -- n / x as x:reciprocal() * n). Comparisons are the methods gt, lt, ...
  -- Errors blame the line with the operator (the metamethod's caller).
  local function arith(name, op)
    local s = spec(name, op, SELF_OTHER, NUM2)
    local commutative = name == "add" or name == "mul"
    return function(a, b)
      if not is_tensor(a) and type(a) ~= "number" then
        blame(E.EINVAL, ("%s: cannot combine a %s with a tensor"):format(name, type(a)))
      end
      if commutative and not is_tensor(a) then a, b = b, a end -- bitwise the same
      return run_map(s, nil, a, b, nil, nil)
    end
  end

  local mt = {
    __index = methods,
    __tostring = tensor_math.format,
    __add = arith("add", C.MU_MAP_ADD),
    __sub = arith("sub", C.MU_MAP_SUB),
    __mul = arith("mul", C.MU_MAP_MUL),
    __div = arith("div", C.MU_MAP_DIV),
    __pow = arith("pow", C.MU_MAP_POW),
    __unm = function(a) return a:neg() end,
  }
  ffi.metatype("mu_tensor", mt)
end

return M
