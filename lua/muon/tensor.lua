-- Tensors: FFI objects with methods, freed by the GC. Dims and indices are
-- 1-based, like Torch7.
--
-- A tensor is a cdata *reference* to the C struct (ctype "mu_tensor &"),
-- not a "mu_tensor *": LuaJIT gives pointers built-in arithmetic that wins
-- over metamethods (t + 1 would be the address of the next struct, t - u a
-- pointer difference), while arithmetic on a struct reference goes to the
-- metatype's __add, __sub, ... A reference converts to "mu_tensor *" in
-- every C call and pointer-array store, as a pointer would.
--[[ reference muon.tensor
    Tensors are FFI objects (a reference to the C struct mu_tensor), freed
    by the GC. Dims and indices are 1-based; a negative dim counts from the
    end where a maths op says so. dtype is "float32" (the default),
    "float64" or "bfloat16" (storage only: made, viewed, copied and
    converted with torch's rounding, saved and loaded; the maths refuse it).
    Misuse raises an error naming the function and the bad argument. The
    maths (exp, pow, softmax, gather, cat, the torch constructors) continue
    in lua/muon/tensor_math.lua.
## Constructors
muon.tensor.zeros(shape, dtype)
    A new zero-filled contiguous tensor. shape is a list of sizes (up to 8
    dims, each an integer >= 0; {} is a 0-dim tensor).
muon.tensor.from(values, shape, dtype)
    A new tensor from a flat list of numbers and a shape, or from nested
    lists (T.from({{1, 2}, {3, 4}})); T.from(values, dtype) for nested lists
    of another dtype. The element count must match the shape (ESHAPE).
muon.tensor.wrap(ptr, shape, dtype, strides)
    A tensor over memory the caller keeps alive (a cdata pointer), without
    copying or owning it. strides (in elements) default to C order.
muon.tensor.load(path, opts)
    Read a NumPy .npy file (<f4 or <f8, C order;
    v1/v2/v3 headers). opts.dtype = nil: with a dtype, <f2, integer and
    boolean data are converted to it (refused otherwise). A truncated or
    malformed file is EFORMAT, a missing one EIO.
muon.tensor.randn(shape, seed, dtype)
    Standard normal values (splitmix64 + Box-Muller). seed: a number (the
    same tensor every time; |seed| < 2^53), a generator, or nil (the default
    generator: successive calls differ, reproducible per run).
muon.tensor.rand(shape, seed, dtype)
    Uniform on [0, 1): the top 53 bits / 2^53 (float64), 24 bits / 2^24
    (float32); seeds as for randn.
muon.tensor.generator(seed)
    A generator of its own (seed default 0): g:randn(shape, dtype),
    g:rand(shape, dtype), or pass g in place of a seed.
muon.tensor.manual_seed(seed)
    Restart the default generator at seed (as torch.manual_seed); returns it.
muon.tensor.default_generator
    The default generator, seed 0 when the module loads.
muon.tensor.is_generator(x)
    Whether x is a generator.
Generator:randn(shape, dtype)
Generator:rand(shape, dtype)
    Draw from this generator (normal; uniform on [0, 1)).
Generator:manual_seed(seed)
    Restart this generator at seed; returns it.
## Low level
muon.tensor.is_tensor(x)
    Whether x is a tensor (a mu_tensor reference, not a raw pointer).
muon.tensor.adopt(box)
    Take ownership of the tensor a C call put in a mu_tensor *[1] out-box
    (freed by the GC); returns it.
muon.tensor.dtype_code(dtype)
    The C code (MU_F32, MU_F64, MU_BF16) of a dtype name; nil gives MU_F32;
    anything else raises.
muon.tensor.DTYPE_NAMES
muon.tensor.DTYPE_SIZES
    From C's dtype table: code -> name; name -> bytes per element.
muon.tensor.methods
    The method table of every tensor (an unknown name raises, naming the
    closest one: "tensor has no method or field 'expp' (did you mean
    'exp'?)").
muon.tensor.math_names
    The maths that exist both as methods and as module functions
    (T.add(a, b) is a:add(b)); sandboxed configs get exactly these and
    T.function_names.
## Shape and memory
Tensor:size(d)
    The sizes as a list, or the size of dim d.
Tensor:stride(d)
    The strides in elements, as a list, or of dim d.
Tensor:numel()
    The number of elements.
Tensor:dim()
    The number of dims.
Tensor:dtype()
    "float32", "float64" or "bfloat16".
Tensor:is_contiguous()
    Whether the tensor is C-contiguous.
Tensor:shares_storage(y)
    Whether x and y view the same storage.
Tensor:ptr()
    A float * (double *, uint16_t * for bfloat16) at element (1, 1, ...):
    indexed from 0 with the strides, valid while x lives, not bounds checked.
Tensor:view(shape)
    The same elements in another shape, sharing storage; one size may be -1.
    Contiguous tensors only (ESTATE: "call :contiguous() first").
Tensor:reshape(shape)
    As view, copying first when x is not contiguous.
Tensor:transpose(d1, d2)
    A view with dims d1 and d2 swapped.
Tensor:narrow(d, start, length)
    A view of length elements of dim d from start (1-based).
Tensor:select(d, i)
    A view of index i of dim d, that dim dropped.
Tensor:squeeze(d)
Tensor:unsqueeze(d)
    A view without the size-1 dim d; with a size-1 dim inserted at d
    (1..dim()+1).
Tensor:contiguous()
    x itself (a new handle on the same storage) if contiguous, else a
    contiguous copy.
Tensor:clone(dtype)
    Always a new contiguous copy, converted to dtype if given.
Tensor:to(dtype)
    x itself if it has that dtype, else a converted copy.
Tensor:copy(src)
    Copy src (same shape, any dtype: converted) into x; returns x.
Tensor:fill(v)
Tensor:zero()
    Set every element to v (a number) or 0; returns x.
Tensor:get(i, j, ...)
    One element as a Lua number (one 1-based index per dim).
Tensor:set(v, i, j, ...)
    Set one element; returns x.
Tensor:totable()
    Nested Lua lists (a number for a 0-dim tensor); bfloat16 read as
    float32.
Tensor:flat()
    One flat Lua list of the elements in row-major order.
Tensor:all_finite()
    true if no element is NaN or Inf, else false.
Tensor:save(path)
    Write a NumPy .npy file (C order); returns x.
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

-- Misuse of a tensor function (a bad argument, shape, dtype) is blamed on
-- the user's line that called into muon (E.blame, lua/muon/errors.lua);
-- what C reports through check, and a few argument checks, name what
-- failed without a position (E.raise).
local blame = E.blame

local C, check = core.C, core.check

local T = {}
local methods = {}
T.methods = methods

-- The dtypes from C's one table (MU_DTYPES): name -> code, code -> name,
-- bytes per element; ptr() types (a bfloat16 element is its raw uint16_t).
local DTYPES, DTYPE_NAMES, DTYPE_SIZES = {}, {}, {}
for code = 0, C.MU_DTYPE_COUNT - 1 do
  local name = ffi.string(C.mu_dtype_name(code))
  DTYPES[name], DTYPE_NAMES[code], DTYPE_SIZES[name] = code, name, tonumber(C.mu_dtype_size(code))
end
T.DTYPE_SIZES, T.DTYPE_NAMES = DTYPE_SIZES, DTYPE_NAMES
local CTYPES = { [tonumber(C.MU_F32)] = ffi.typeof("float *"), [tonumber(C.MU_F64)] = ffi.typeof("double *"),
                 [tonumber(C.MU_BF16)] = ffi.typeof("uint16_t *") }

local out_box = ffi.typeof("mu_tensor *[1]")
local i64_arr = ffi.typeof("int64_t[?]")
local tensor_struct = ffi.typeof("mu_tensor")
local tensor_pointer = ffi.typeof("mu_tensor *")

local function dtype_code(dtype)
  if dtype == nil then return C.MU_F32 end
  local code = DTYPES[dtype]
  if not code then
    blame(E.EINVAL, "dtype must be 'float32', 'float64' or 'bfloat16', got " .. tostring(dtype))
  end
  return code
end
T.dtype_code = dtype_code

-- Wrap a freshly returned mu_tensor* (box[0]) so the GC frees it; the
-- tensor is the reference box[0][0] (see the top of this file).
local function adopt(box)
  return ffi.gc(box[0][0], C.mu_tensor_free)
end
T.adopt = adopt

local MAX_SIZE = 2 ^ 53

local function shape_array(shape)
  if type(shape) ~= "table" then
    E.raise(E.EINVAL, "shape must be a table of sizes, got %s", type(shape))
  end
  local n = #shape
  if n > 8 then E.raise(E.EINVAL, "shape has %d dims; at most 8 are supported", n) end
  local arr = i64_arr(math.max(n, 1))
  for i = 1, n do
    local s = shape[i]
    if type(s) ~= "number" or s ~= math.floor(s) or (s < 0 and s ~= -1) then
      E.raise(E.EINVAL, "bad shape: size %s in dim %d", tostring(s), i)
    end
    if s > MAX_SIZE then -- beyond exact integers (and int64): never a real size
      E.raise(E.EINVAL, "bad shape: size %s in dim %d is too large", tostring(s), i)
    end
    arr[i - 1] = s
  end
  return arr, n
end

-- A tensor reference (raw "mu_tensor *" pointers are not tensors here).
function T.is_tensor(x)
  return type(x) == "cdata" and ffi.istype(tensor_struct, x) and not ffi.istype(tensor_pointer, x)
end

function T.zeros(shape, dtype)
  local arr, n = shape_array(shape)
  for i = 1, n do
    if shape[i] < 0 then E.raise(E.EINVAL, "bad shape: negative size in dim %d", i) end
  end
  local box = out_box()
  check(C.mu_tensor_new(dtype_code(dtype), n, arr, box), "zeros")
  return adopt(box)
end

-- Shape of a nested Lua table of numbers.
local function nested_shape(tbl)
  local shape, node = {}, tbl
  while type(node) == "table" do
    shape[#shape + 1] = #node
    node = node[1]
  end
  return shape
end

local function flatten(tbl, shape, dim, out)
  if dim > #shape then
    out[#out + 1] = tbl
    return
  end
  if type(tbl) ~= "table" or #tbl ~= shape[dim] then
    blame(E.EINVAL, "ragged nested table at dim " .. dim)
  end
  for i = 1, #tbl do flatten(tbl[i], shape, dim + 1, out) end
end

-- T.from({1,2,3,4,5,6}, {2,3}) or T.from({{1,2,3},{4,5,6}}); dtype optional.
function T.from(values, shape, dtype)
  if type(values) ~= "table" then blame(E.EINVAL, "values must be a table") end
  if type(shape) == "string" then shape, dtype = nil, shape end
  local flat = values
  if shape == nil then
    shape = nested_shape(values)
    flat = {}
    flatten(values, shape, 1, flat)
  end
  local t = T.zeros(shape, dtype)
  local n = t:numel()
  if #flat ~= n then
    blame(E.ESHAPE, ("values has %d elements but shape %s needs %d"):format(#flat, table.concat(shape, "x"), n))
  end
  local p = ffi.cast(CTYPES[t.scalar], t.data)
  for i = 1, n do
    local v = flat[i]
    if type(v) ~= "number" then blame(E.EINVAL, "values[" .. i .. "] is not a number") end
    p[i - 1] = v
  end
  return t
end

-- Wrap memory the caller keeps alive (a cdata pointer) as a tensor;
-- strides (in elements, optional) default to C-contiguous.
function T.wrap(ptr, shape, dtype, strides)
  local arr, n = shape_array(shape)
  local sarr = nil
  if strides ~= nil then
    if type(strides) ~= "table" or #strides ~= n then E.raise(E.EINVAL, "wrap: strides must list one stride per dim") end
    sarr = i64_arr(math.max(n, 1))
    for i = 1, n do
      local v = strides[i]
      if type(v) ~= "number" or v ~= math.floor(v) or v < 0 or v > MAX_SIZE then
        E.raise(E.EINVAL, "wrap: stride %s of dim %d must be an integer >= 0", tostring(v), i)
      end
      sarr[i - 1] = v
    end
  end
  local box = out_box()
  check(C.mu_tensor_wrap(dtype_code(dtype), n, arr, sarr, ptr, box), "wrap")
  return adopt(box)
end

-- T.load(path [, { dtype = "float32" | "float64" | "bfloat16" }]): a .npy
-- file; with a dtype, float16, integer and boolean data convert to it.
function T.load(path, opts)
  if type(path) ~= "string" then blame(E.EINVAL, "path must be a string") end
  if opts ~= nil and type(opts) ~= "table" then blame(E.EINVAL, "load: options must be a table { dtype = ... }") end
  for k in pairs(opts or {}) do
    if k ~= "dtype" then blame(E.EINVAL, "load: " .. E.unknown("option", tostring(k), { "dtype" })) end
  end
  local box = out_box()
  check(C.mu_npy_load_as(path, opts and opts.dtype and dtype_code(opts.dtype) or -1, box), "load")
  return adopt(box)
end

-- Random tensors (splitmix64; normal by Box-Muller), for tests,
-- benchmarks, examples and initializations:
--   T.randn(shape, seed, dtype)  -- a number seed: the same tensor every time
--   T.randn(shape)               -- no seed: drawn from the default generator
--                                -- (successive calls differ; reproducible per run)
--   T.rand(shape, seed, dtype)   -- uniform on [0, 1), the same seeds and generators
--   T.manual_seed(s)             -- restart the default generator (as torch.manual_seed)
--   local g = T.generator(s)     -- a generator of its own: g:randn(shape, dtype),
--   T.randn(shape, g, dtype)     -- g:rand(shape, dtype), or passed in place of the seed
local function seed_state(seed, what)
  if type(seed) ~= "number" or seed ~= math.floor(seed) or math.abs(seed) >= 2 ^ 53 then
    blame(E.EINVAL, "%s: seed must be an integer (|seed| < 2^53) or a generator, got %s", what, tostring(seed))
  end
  return ffi.new("uint64_t[1]", seed * 2654435761ULL + 0x9E3779B97F4A7C15ULL)
end

-- The generator state a seed argument names: nil the default generator's,
-- a generator its own, a number a fresh one.
local function state_of(seed, what)
  if seed == nil then return T.default_generator.state end
  if T.is_generator(seed) then return seed.state end
  return seed_state(seed, what)
end

-- The next 64 bits of a state (splitmix64).
local function next_bits(state)
  state[0] = state[0] + 0x9E3779B97F4A7C15ULL
  local z = state[0]
  z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
  z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
  return bit.bxor(z, bit.rshift(z, 31))
end

local function fill_normal(t, state)
  local n = t:numel()
  local p = ffi.cast(CTYPES[t.scalar], t.data)
  local function next_u() -- in (0, 1): log(u1) is finite
    return (tonumber(bit.rshift(next_bits(state), 11)) + 0.5) / 9007199254740992
  end
  local i = 0
  while i < n do
    local u1, u2 = next_u(), next_u()
    local r = math.sqrt(-2 * math.log(u1))
    p[i] = r * math.cos(2 * math.pi * u2)
    if i + 1 < n then p[i + 1] = r * math.sin(2 * math.pi * u2) end
    i = i + 2
  end
  return t
end

-- Uniform on [0, 1): the top 53 bits / 2^53 for float64, the top 24 / 2^24
-- for float32 (exact in the dtype, so never rounded up to 1), as torch
-- draws them.
local function fill_uniform(t, state)
  local n = t:numel()
  local p = ffi.cast(CTYPES[t.scalar], t.data)
  local bits = t.scalar == C.MU_F64 and 53 or t.scalar == C.MU_F32 and 24 or 8 -- (8: narrower dtypes)
  local scale = 2 ^ -bits
  for i = 0, n - 1 do p[i] = tonumber(bit.rshift(next_bits(state), 64 - bits)) * scale end
  return t
end

local Generator = {}
Generator.__index = Generator

function T.generator(seed)
  return setmetatable({ state = seed_state(seed == nil and 0 or seed, "generator") }, Generator)
end

function T.is_generator(g) return getmetatable(g) == Generator end

-- Restart at seed (an integer, |seed| < 2^53).
function Generator:manual_seed(seed)
  self.state = seed_state(seed, "manual_seed")
  return self
end

function Generator:randn(shape, dtype)
  return fill_normal(T.zeros(shape, dtype), self.state)
end

function Generator:rand(shape, dtype)
  return fill_uniform(T.zeros(shape, dtype), self.state)
end

T.default_generator = T.generator(0)

function T.manual_seed(seed)
  T.default_generator:manual_seed(seed)
  return T.default_generator
end

function T.randn(shape, seed, dtype)
  return fill_normal(T.zeros(shape, dtype), state_of(seed, "randn"))
end

function T.rand(shape, seed, dtype)
  return fill_uniform(T.zeros(shape, dtype), state_of(seed, "rand"))
end

-- Argument checks raise EINVAL error objects naming the argument. An
-- index or size must be an integer: NaN, +-inf and fractions are refused
-- here, before LuaJIT's number -> int64 conversion could truncate them.
local function is_integer(v) return type(v) == "number" and v == math.floor(v) and v - v == 0 end

local function check_dim(t, d, what)
  if not is_integer(d) or d < 1 or d > t.ndim then
    E.raise(E.EINVAL, "%s: dim %s out of range 1..%d", what, tostring(d), t.ndim)
  end
  return d - 1
end

function methods:size(d)
  if d ~= nil then return tonumber(self.dims[check_dim(self, d, "size")]) end
  local s = {}
  for i = 0, self.ndim - 1 do s[i + 1] = tonumber(self.dims[i]) end
  return s
end

function methods:stride(d)
  if d ~= nil then return tonumber(self.strides[check_dim(self, d, "stride")]) end
  local s = {}
  for i = 0, self.ndim - 1 do s[i + 1] = tonumber(self.strides[i]) end
  return s
end

function methods:numel() return tonumber(C.mu_tensor_numel(self)) end
function methods:dim() return self.ndim end
function methods:dtype() return DTYPE_NAMES[self.scalar] end
function methods:is_contiguous() return C.mu_tensor_is_contiguous(self) ~= 0 end
function methods:shares_storage(other) return C.mu_tensor_same_storage(self, other) ~= 0 end
function methods:ptr() return ffi.cast(CTYPES[self.scalar], self.data) end

function methods:view(shape)
  if not self:is_contiguous() then
    E.raise(E.ESTATE, "view: tensor is not contiguous (call :contiguous() first)")
  end
  local arr, n = shape_array(shape)
  local box = out_box()
  check(C.mu_tensor_view(self, n, arr, box), "view")
  return adopt(box)
end

-- Like view, but copies first when the tensor is not contiguous.
function methods:reshape(shape)
  if self:is_contiguous() then return self:view(shape) end
  return self:contiguous():view(shape)
end

function methods:transpose(d1, d2)
  local box = out_box()
  check(C.mu_tensor_transpose(self, check_dim(self, d1, "transpose"),
    check_dim(self, d2, "transpose"), box), "transpose")
  return adopt(box)
end

-- narrow(dim, start, length): start is 1-based.
function methods:narrow(d, start, length)
  local dim = check_dim(self, d, "narrow")
  if not is_integer(start) then E.raise(E.EINVAL, "narrow: start must be an integer, got %s", tostring(start)) end
  if not is_integer(length) then E.raise(E.EINVAL, "narrow: length must be an integer, got %s", tostring(length)) end
  local size = tonumber(self.dims[dim])
  if start < 1 or length < 0 or start - 1 + length > size then
    E.raise(E.EINVAL, "narrow: [%.0f, %.0f] out of range 1..%d in dim %d", start, start + length - 1, size, d)
  end
  local box = out_box()
  check(C.mu_tensor_narrow(self, dim, start - 1, length, box), "narrow")
  return adopt(box)
end

-- select(dim, index): narrow to one index and drop that dim (a view).
function methods:select(d, index)
  local n = self:narrow(d, index, 1)
  local box = out_box()
  check(C.mu_tensor_squeeze(n, d - 1, box), "select")
  return adopt(box)
end

function methods:squeeze(d)
  local box = out_box()
  check(C.mu_tensor_squeeze(self, check_dim(self, d, "squeeze"), box), "squeeze")
  return adopt(box)
end

function methods:unsqueeze(d)
  if not is_integer(d) or d < 1 or d > self.ndim + 1 then
    E.raise(E.EINVAL, "unsqueeze: dim %s out of range 1..%d", tostring(d), self.ndim + 1)
  end
  local box = out_box()
  check(C.mu_tensor_unsqueeze(self, d - 1, box), "unsqueeze")
  return adopt(box)
end

function methods:contiguous()
  local box = out_box()
  check(C.mu_tensor_contiguous(self, box), "contiguous")
  return adopt(box)
end

function methods:clone(dtype)
  local box = out_box()
  check(C.mu_tensor_clone(self, dtype and dtype_code(dtype) or -1, box), "clone")
  return adopt(box)
end

function methods:to(dtype)
  if self:dtype() == dtype then return self end
  return self:clone(dtype)
end

function methods:copy(src)
  if not T.is_tensor(src) then blame(E.EINVAL, "copy: source is not a tensor") end
  check(C.mu_tensor_copy(self, src)) -- C names copy in its messages
  return self
end

function methods:fill(v)
  if type(v) ~= "number" then E.raise(E.EINVAL, "fill: value must be a number, got %s", type(v)) end
  check(C.mu_tensor_fill(self, v))
  return self
end

function methods:zero() return self:fill(0) end

function methods:all_finite()
  local rc = C.mu_tensor_all_finite(self, nil)
  if rc < 0 then check(rc) end
  return rc ~= 0
end

local function index_array(self, idx, first, nidx)
  local n = self.ndim
  if nidx ~= n then
    E.raise(E.EINVAL, "expected %d indices, got %d", n, nidx)
  end
  local arr = i64_arr(math.max(n, 1))
  for i = 1, n do
    local v = idx[first + i - 1]
    local size = tonumber(self.dims[i - 1])
    if not is_integer(v) or v < 1 or v > size then
      E.raise(E.EINVAL, "index %s out of range 1..%d in dim %d", tostring(v), size, i)
    end
    arr[i - 1] = v - 1
  end
  return arr
end

function methods:get(...)
  local idx = { ... }
  local out = ffi.new("double[1]")
  check(C.mu_tensor_get(self, index_array(self, idx, 1, select("#", ...)), out), "get")
  return out[0]
end

function methods:set(v, ...)
  if type(v) ~= "number" then E.raise(E.EINVAL, "set: value must be a number, got %s", type(v)) end
  local idx = { ... }
  check(C.mu_tensor_set(self, index_array(self, idx, 1, select("#", ...)), v), "set")
  return self
end

-- self, contiguous, in a dtype Lua reads: bfloat16 as float32, its NaNs made
-- the canonical one (a LuaJIT number cannot hold every NaN bit pattern).
local function readable(t)
  if t.scalar ~= C.MU_BF16 then return t:contiguous() end
  local c = t:clone("float32")
  local p = ffi.cast("uint32_t *", c.data)
  for i = 0, c:numel() - 1 do
    if p[i] % 0x80000000 > 0x7f800000 then p[i] = 0x7fc00000 end
  end
  return c
end

-- Nested Lua tables (a number for a 0-dim tensor).
function methods:totable()
  local c = readable(self)
  local p = ffi.cast(CTYPES[c.scalar], c.data)
  local shape = c:size()
  if #shape == 0 then return p[0] end
  local pos = 0
  local function build(d)
    local t = {}
    for i = 1, shape[d] do
      if d == #shape then
        t[i] = p[pos]
        pos = pos + 1
      else
        t[i] = build(d + 1)
      end
    end
    return t
  end
  return build(1)
end

-- Flat Lua array of the elements in row-major order.
function methods:flat()
  local c = readable(self)
  local p = ffi.cast(CTYPES[c.scalar], c.data)
  local t = {}
  for i = 1, c:numel() do t[i] = p[i - 1] end
  return t
end

function methods:save(path)
  if type(path) ~= "string" then blame(E.EINVAL, "save: path must be a string") end
  check(C.mu_npy_save(self, path), "save")
  return self
end

-- ------------------------------------------------------------------ maths
--
-- Each op is one C loop (mu_tensor_map / mu_tensor_reduce / mu_tensor_matmul
-- in src/tensor_math.c). Here: argument checks with torch-like messages,
-- broadcast shapes, and the result tensors (out-of-place forms allocate a
-- new contiguous tensor; in-place forms, name_, write self).

local is_tensor = T.is_tensor
local map_args = ffi.new("mu_map_args") -- reused: one call at a time

local function shape_str(t)
  local s = {}
  for i = 0, t.ndim - 1 do s[i + 1] = tostring(tonumber(t.dims[i])) end
  return "[" .. table.concat(s, ", ") .. "]"
end

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

return T
