-- Tensor maths for ports from PyTorch, beyond the elementwise core of
-- lua/muon/tensor_ops.lua: torch's names, 1-based dims and indices (negative
-- dims count from the end), new contiguous results unless the name ends in
-- "_" (in place: writes self and returns it). Installed into muon.tensor
-- (T) by tensor_ops.lua; use them as methods (x:exp()) or module functions
-- (T.exp(x)) like the rest of the maths. Each error names the function and
-- the bad argument.
--
-- C: MU_MAP_EXP, MU_MAP_LOG, MU_MAP_TANH, MU_MAP_SIGMOID, MU_MAP_POW
-- (mu_tensor_map), MU_REDUCE_ARGMAX (mu_tensor_reduce, 0-based indices),
-- mu_tensor_softmax, mu_tensor_gather (src/tensor_math.c, documented in
-- src/muon_ffi.h).
--[=[ reference muon.tensor
## Maths for ports from torch (lua/muon/tensor_math.lua)
Tensor:exp()
Tensor:exp_()
Tensor:log()
Tensor:log_()
Tensor:tanh()
Tensor:tanh_()
Tensor:sigmoid()
Tensor:sigmoid_()
muon.tensor.exp(x)
muon.tensor.exp_(x)
muon.tensor.log(x)
muon.tensor.log_(x)
muon.tensor.tanh(x)
muon.tensor.tanh_(x)
muon.tensor.sigmoid(x)
muon.tensor.sigmoid_(x)
    Elementwise: the C library's exp, log, tanh; sigmoid is
    1 / (1 + exp(-x)), torch's formula.
Tensor:pow(e)
Tensor:pow_(e)
muon.tensor.pow(a, e)
muon.tensor.pow_(a, e)
    x^e (also the operator ^): e a tensor (broadcast) or a number; a number
    base too (T.pow(2, x), 2 ^ x). A number exponent 2, 3, -2, 0.5, -0.5,
    -1 is computed as torch does (x*x, x*x*x, 1/(x*x), sqrt, 1/sqrt, 1/x).
Tensor:softmax(dim)
Tensor:log_softmax(dim)
muon.tensor.softmax(x, dim)
muon.tensor.log_softmax(x, dim)
    Along dim (required), in double: exp(x - max) / sum, (x - max) -
    log(sum); within 1 ulp (float32) of the double result. NaN in a slice,
    or a slice of only -inf, gives NaN.
Tensor:argmax(dim, keepdim)
muon.tensor.argmax(x, dim, keepdim)
    The 1-based index of the first largest element (a NaN counts as
    largest), torch's rule: without dim the flat row-major index (a Lua
    number), with dim a tensor of indices in x's dtype (float32: dims up to
    2^24 long); dim nil with keepdim true: a tensor of size-1 dims, as
    x:sum().
Tensor:gather(dim, index)
muon.tensor.gather(x, dim, index)
    torch.gather with 1-based indices: out[i][j] = x[index[i][j]][j] for
    dim 1. index is a float32/float64 tensor of integers with x's number of
    dims, no larger than x except along dim; checked before anything is
    written.
muon.tensor.cat(list, dim)
    Concatenate along dim (default 1); sizes must match in the other dims,
    dtypes agree; 1-D empty tensors are skipped, as torch does.
muon.tensor.stack(list, dim)
    Stack same-shape tensors along a new dim (default 1, up to ndim + 1).
muon.tensor.ones(shape, dtype)
muon.tensor.full(shape, v, dtype)
    Filled with 1 or v.
muon.tensor.zeros_like(x, dtype)
muon.tensor.ones_like(x, dtype)
muon.tensor.full_like(x, v, dtype)
muon.tensor.rand_like(x, seed, dtype)
muon.tensor.randn_like(x, seed, dtype)
    x's shape, x's dtype unless given; seed as for T.randn (T.rand: uniform
    on [0, 1)).
Tensor:fill_(v)
Tensor:zero_()
Tensor:copy_(src)
    torch's names of fill, zero and copy (the same functions).
muon.tensor.function_names
    The module functions without a method form (the constructors, cat,
    stack); T.math_names lists the maths that are both.
    tostring(x), print(x): torch's repr: the values (4 decimals, or
    scientific, or "1." for integers; over 1000 elements the first and last
    3 per dim around "..."), then size and dtype:
    tensor([[1.5000, -2.0000]], size=[1, 2], dtype=float32).
]=]
local ffi = require("ffi")
local core = require("muon.core")
local E = require("muon.errors")

local C, check = core.C, core.check

local M = {}

-- ------------------------------------------------------------- formatting

local EDGE, THRESHOLD, LINEWIDTH = 3, 1000, 80

-- The indices shown along a dim of that size: all, or the first and last
-- EDGE around false (the "...").
local function shown(size, summarize)
  local l = {}
  if summarize and size > 2 * EDGE then
    for i = 1, EDGE do l[#l + 1] = i end
    l[#l + 1] = false
    for i = size - EDGE + 1, size do l[#l + 1] = i end
  else
    for i = 1, size do l[i] = i end
  end
  return l
end

-- The C library's printf, which rounds ties to even as Python's format
-- does (LuaJIT's string.format rounds 0.03125 to "0.0313" at 4 decimals).
pcall(ffi.cdef, "int snprintf(char *str, size_t size, const char *format, ...);")
local numbuf = ffi.new("char[64]")
local function printf(fmt, v)
  local n = ffi.C.snprintf(numbuf, 64, fmt, ffi.cast("double", v))
  return ffi.string(numbuf, n)
end

local function number_str(v, mode)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  if mode == "sci" then return printf("%.4e", v) end
  if mode == "int" then return printf("%.0f.", v) end
  return printf("%.4f", v)
end

-- torch's _Formatter (torch 1.13, _tensor_str.py): integers as "3.", else
-- 4 decimals, or scientific when the nonzero finite magnitudes span more
-- than 1000x, exceed 1e8, or (not integers) go below 1e-4. Values are
-- right-aligned to the widest nonzero finite one (zeros, NaN and inf are
-- not measured, as in torch).
local function formatter(values)
  local int, lo, hi, finite = true, math.huge, 0, {}
  for _, v in ipairs(values) do
    if v == v and v ~= 0 and v - v == 0 then
      local a = math.abs(v)
      if a < lo then lo = a end
      if a > hi then hi = a end
      if v ~= math.ceil(v) then int = false end
      finite[#finite + 1] = v
    end
  end
  local mode = int and "int" or "fixed"
  if hi > 0 and (hi / lo > 1000 or hi > 1e8 or (not int and lo < 1e-4)) then mode = "sci" end
  local width = 1
  for _, v in ipairs(finite) do width = math.max(width, #number_str(v, mode)) end
  return function(v)
    local s = number_str(v, mode)
    return (" "):rep(width - #s) .. s
  end, width
end

-- The repr: "tensor(" values ", size=[...], dtype=...)" (the shape as
-- muon.tensor.shape_string writes it, given by install).
local shape_string
function M.format(t)
  local dims, nd = t:size(), t.ndim
  local n = t:numel()
  local summarize = n > THRESHOLD
  local suffix = (", size=%s, dtype=%s)"):format(shape_string(dims), t:dtype())
  if n == 0 then return "tensor([]" .. suffix end
  -- the shown values, in order (for the formatter)
  local idx, values = {}, {}
  local function collect(d)
    if d > nd then
      values[#values + 1] = t:get(unpack(idx, 1, nd))
      return
    end
    for _, i in ipairs(shown(dims[d], summarize)) do
      if i then
        idx[d] = i
        collect(d + 1)
      end
    end
  end
  collect(1)
  local fmt, width = formatter(values)
  if nd == 0 then return "tensor(" .. fmt(values[1]) .. suffix end
  local pos = 0
  local function next_value()
    pos = pos + 1
    return fmt(values[pos])
  end
  local function build(d, indent)
    local list = shown(dims[d], summarize)
    if d == nd then
      local per_line = math.max(1, math.floor((LINEWIDTH - indent) / (width + 2)))
      local items = {}
      for _, i in ipairs(list) do items[#items + 1] = i and next_value() or " ..." end
      local lines = {}
      for k = 1, #items, per_line do lines[#lines + 1] = table.concat(items, ", ", k, math.min(k + per_line - 1, #items)) end
      return "[" .. table.concat(lines, ",\n" .. (" "):rep(indent + 1)) .. "]"
    end
    local slices = {}
    for _, i in ipairs(list) do slices[#slices + 1] = i and build(d + 1, indent + 1) or "..." end
    return "[" .. table.concat(slices, "," .. ("\n"):rep(nd - d) .. (" "):rep(indent + 1)) .. "]"
  end
  return "tensor(" .. build(1, #"tensor(") .. suffix
end

-- ------------------------------------------------------------------ install

-- Add the functions to T. P: tensor_ops.lua's private helpers (define, spec,
-- run_map, reduce, reduce_dim, new_tensor, shape_str, dtype_names).
function M.install(T, P)
  shape_string = T.shape_string
  local methods, define, is_tensor = T.methods, P.define, T.is_tensor
  local DTYPE_NAMES = P.dtype_names

  local function need_tensor(name, what, v)
    if not is_tensor(v) then E.blame(E.EINVAL, "%s: %s must be a tensor, got %s", name, what, type(v)) end
    check(C.mu_tensor_check(v), name .. ": " .. what)
  end

  -- pow(self, exponent): either may be a number (not both).
  do
    local names, nums = { "self", "exponent" }, { true, true }
    local s, s_ = P.spec("pow", C.MU_MAP_POW, names, nums), P.spec("pow_", C.MU_MAP_POW, names, nums)
    define("pow", function(self, exponent) return P.run_map(s, nil, self, exponent, nil, nil) end)
    define("pow_", function(self, exponent)
      if not is_tensor(self) then E.blame(E.EINVAL, "pow_: self must be a tensor, got %s", type(self)) end
      return P.run_map(s_, self, self, exponent, nil, nil)
    end)
  end

  -- A dim argument of a 0-D tensor: 1 or -1 (its one element), as torch's
  -- 0 or -1.
  local function dim_of(name, t, dim)
    if t.ndim == 0 then
      if dim == 1 or dim == -1 then return 1 end
      E.blame(E.EINVAL, "%s: dim %s out of range for a 0-D tensor (1 or -1)", name, tostring(dim))
    end
    return P.reduce_dim(t, dim, name)
  end

  for _, name in ipairs({ "softmax", "log_softmax" }) do
    local log = name == "log_softmax" and 1 or 0
    define(name, function(self, dim)
      need_tensor(name, "self", self)
      if dim == nil then E.blame(E.EINVAL, "%s: dim is required (the dim whose slices sum to 1)", name) end
      local d = dim_of(name, self, dim)
      local out = P.new_tensor(self.scalar, self:size(), name)
      check(C.mu_tensor_softmax(self, d - 1, log, out))
      return out
    end)
  end

  define("argmax", function(self, dim, keepdim)
    need_tensor("argmax", "self", self)
    if dim ~= nil and self.ndim > 0 then
      local d = P.reduce_dim(self, dim, "argmax")
      if self.dims[d - 1] == 0 then
        local others = 1
        for i = 1, self.ndim do if i ~= d then others = others * tonumber(self.dims[i - 1]) end end
        if others > 0 then E.blame(E.ESHAPE, "argmax: dim %d has size 0 (no largest element)", d) end
      end
    end
    local r = P.reduce("argmax", C.MU_REDUCE_ARGMAX, self, dim, keepdim)
    if type(r) == "number" then return r + 1 end
    return r:add_(1)
  end)

  define("gather", function(self, dim, index)
    need_tensor("gather", "self", self)
    need_tensor("gather", "index", index)
    local d = dim_of("gather", self, dim)
    local out = P.new_tensor(self.scalar, index:size(), "gather")
    check(C.mu_tensor_gather(self, d - 1, index, 1, out))
    return out
  end)

  -- torch's in-place names of fill, zero and copy.
  methods.fill_, methods.zero_, methods.copy_ = methods.fill, methods.zero, methods.copy

  -- ------------------------------------------------ module functions
  T.function_names = { "zeros", "from", "randn", "rand" }
  local function fn(name, f)
    T[name] = f
    T.function_names[#T.function_names + 1] = name
  end

  local function value_arg(name, v)
    if type(v) ~= "number" then E.blame(E.EINVAL, "%s: value must be a number, got %s", name, type(v)) end
    return v
  end
  fn("ones", function(shape, dtype) return T.zeros(shape, dtype):fill(1) end)
  fn("full", function(shape, value, dtype)
    value_arg("full", value)
    return T.zeros(shape, dtype):fill(value)
  end)

  local function like(name, t, dtype)
    if not is_tensor(t) then E.blame(E.EINVAL, "%s: input must be a tensor, got %s", name, type(t)) end
    return t:size(), dtype or t:dtype()
  end
  fn("zeros_like", function(t, dtype) return T.zeros(like("zeros_like", t, dtype)) end)
  fn("ones_like", function(t, dtype) return T.ones(like("ones_like", t, dtype)) end)
  fn("full_like", function(t, value, dtype)
    local shape, dt = like("full_like", t, dtype)
    return T.full(shape, value_arg("full_like", value), dt)
  end)
  fn("rand_like", function(t, seed, dtype)
    local shape, dt = like("rand_like", t, dtype)
    return T.rand(shape, seed, dt)
  end)
  fn("randn_like", function(t, seed, dtype)
    local shape, dt = like("randn_like", t, dtype)
    return T.randn(shape, seed, dt)
  end)

  -- A list of tensors (checked: a table without holes, every entry a
  -- valid tensor).
  local function tensor_list(name, list)
    if type(list) ~= "table" or is_tensor(list) then
      E.blame(E.EINVAL, "%s: tensors must be a list of tensors, got %s", name, type(list))
    end
    local n = #list
    if n == 0 then E.blame(E.EINVAL, "%s: tensors must be a non-empty list", name) end
    for k in pairs(list) do
      if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
        E.blame(E.EINVAL, "%s: tensors must be a list (1..%d), found key %s", name, n, tostring(k))
      end
    end
    for i = 1, n do need_tensor(name, ("tensors[%d]"):format(i), list[i]) end
    return n
  end

  local function same_dtype(name, list, i, j)
    if list[i].scalar ~= list[j].scalar then
      E.blame(E.EDTYPE, "%s: dtype mismatch: tensors[%d] is %s but tensors[%d] is %s", name, i,
        DTYPE_NAMES[list[i].scalar], j, DTYPE_NAMES[list[j].scalar])
    end
  end

  fn("cat", function(tensors, dim)
    local n = tensor_list("cat", tensors)
    local parts = {} -- torch skips 1-D empty tensors (its legacy placeholder)
    for i = 1, n do
      local t = tensors[i]
      if not (t.ndim == 1 and t.dims[0] == 0) then parts[#parts + 1] = i end
    end
    if #parts == 0 then return T.zeros({ 0 }, tensors[1]:dtype()) end
    local r = parts[1]
    local ref = tensors[r]
    if ref.ndim == 0 then E.blame(E.ESHAPE, "cat: tensors[%d] is 0-D and cannot be concatenated", r) end
    local d = P.reduce_dim(ref, dim == nil and 1 or dim, "cat")
    local dims, total = ref:size(), 0
    for _, i in ipairs(parts) do
      local t = tensors[i]
      same_dtype("cat", tensors, i, r)
      local ok = t.ndim == ref.ndim
      for k = 1, ref.ndim do ok = ok and (k == d or t.dims[k - 1] == ref.dims[k - 1]) end
      if not ok then
        E.blame(E.ESHAPE, "cat: sizes must match except in dim %d: tensors[%d] is %s but tensors[%d] is %s", d, r,
          P.shape_str(ref), i, P.shape_str(t))
      end
      total = total + tonumber(t.dims[d - 1])
    end
    dims[d] = total
    local out = P.new_tensor(ref.scalar, dims, "cat")
    local at = 1
    for _, i in ipairs(parts) do
      local t = tensors[i]
      local len = tonumber(t.dims[d - 1])
      if len > 0 then out:narrow(d, at, len):copy(t) end
      at = at + len
    end
    return out
  end)

  fn("stack", function(tensors, dim)
    local n = tensor_list("stack", tensors)
    local ref = tensors[1]
    local nd = ref.ndim
    dim = dim == nil and 1 or dim
    if type(dim) ~= "number" or dim ~= math.floor(dim) or dim == 0 or dim > nd + 1 or dim < -(nd + 1) then
      E.blame(E.EINVAL, "stack: dim %s out of range for %d-D tensors (1..%d or -%d..-1)", tostring(dim), nd, nd + 1,
        nd + 1)
    end
    local d = dim < 0 and nd + 2 + dim or dim
    for i = 2, n do
      local t = tensors[i]
      same_dtype("stack", tensors, i, 1)
      local ok = t.ndim == nd
      for k = 0, nd - 1 do ok = ok and t.dims[k] == ref.dims[k] end
      if not ok then
        E.blame(E.ESHAPE, "stack: tensors must have one shape: tensors[1] is %s but tensors[%d] is %s",
          P.shape_str(ref), i, P.shape_str(t))
      end
    end
    local dims = ref:size()
    table.insert(dims, d, n)
    local out = P.new_tensor(ref.scalar, dims, "stack")
    for i = 1, n do out:select(d, i):copy(tensors[i]) end
    return out
  end)

  -- An unknown member raises, naming the closest method or field.
  local FIELDS = { "data", "storage", "offset", "scalar", "ndim", "dims", "strides" }
  setmetatable(methods, {
    __index = function(_, k)
      local names = {}
      for name in pairs(methods) do names[#names + 1] = name end
      for _, f in ipairs(FIELDS) do names[#names + 1] = f end
      table.sort(names) -- the first of equally close names: exp before exp_
      local near = E.closest(k, names)
      E.blame(E.EINVAL, "tensor has no method or field '%s'%s", tostring(k),
        near and (" (did you mean '%s'?)"):format(near) or "")
    end,
  })
end

return M
