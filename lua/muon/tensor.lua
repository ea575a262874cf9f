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
    maths: elementwise ops, reductions and products in
    lua/muon/tensor_ops.lua; exp, pow, softmax, gather, cat and the torch
    constructors in lua/muon/tensor_math.lua.
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
muon.tensor.shape_string(x)
    A shape as every message writes it (C's too): "[64, 160]", "[]" for a
    0-dim one; x a tensor or a list of sizes.
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
    Write a NumPy .npy file (C order), atomically as muon.safetensors.save
    writes (the same paths refused); returns x.
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

-- The one notation of shapes in messages (C's mu__shape_str writes it too).
function T.shape_string(x)
  local s = T.is_tensor(x) and x:size() or x
  local parts = {}
  for i = 1, #s do parts[i] = ("%.0f"):format(s[i]) end
  return "[" .. table.concat(parts, ", ") .. "]"
end

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
    blame(E.ESHAPE, ("values has %d elements but shape %s needs %d"):format(#flat, T.shape_string(shape), n))
  end
  local p = ffi.cast(CTYPES[t.scalar], t.data)
  for i = 1, n do
    local v = flat[i]
    if type(v) ~= "number" then blame(E.EINVAL, "values[" .. i .. "] is not a number") end
    p[i - 1] = v
  end
  return t
end

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

-- Random tensors (their contract: the reference block), splitmix64 bits.
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

-- The maths (elementwise ops, reductions, products, operators):
-- lua/muon/tensor_ops.lua, which continues in lua/muon/tensor_math.lua.
require("muon.tensor_ops").install(T)

return T
