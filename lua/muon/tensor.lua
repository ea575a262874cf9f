-- Tensors: FFI objects with methods, freed by the GC. Dims and indices are
-- 1-based, like Torch7.
--
-- A tensor is a cdata *reference* to the C struct (ctype "mu_tensor &"),
-- not a "mu_tensor *": LuaJIT gives pointers built-in arithmetic that wins
-- over metamethods (t + 1 would be the address of the next struct, t - u a
-- pointer difference), while arithmetic on a struct reference goes to the
-- metatype's __add, __sub, ... A reference converts to "mu_tensor *" in
-- every C call and pointer-array store, as a pointer would.
local ffi = require("ffi")
local core = require("muon.core")

local C, check = core.C, core.check

local T = {}
local methods = {}
T.methods = methods

local DTYPES = { float32 = C.MU_F32, float64 = C.MU_F64 }
local DTYPE_NAMES = { [tonumber(C.MU_F32)] = "float32", [tonumber(C.MU_F64)] = "float64" }
local CTYPES = { [tonumber(C.MU_F32)] = ffi.typeof("float *"), [tonumber(C.MU_F64)] = ffi.typeof("double *") }

local out_box = ffi.typeof("mu_tensor *[1]")
local i64_arr = ffi.typeof("int64_t[?]")
local tensor_struct = ffi.typeof("mu_tensor")
local tensor_pointer = ffi.typeof("mu_tensor *")

local function dtype_code(dtype, level)
  if dtype == nil then return C.MU_F32 end
  local code = DTYPES[dtype]
  if not code then
    error("dtype must be 'float32' or 'float64', got " .. tostring(dtype), level + 1)
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

local function shape_array(shape, level)
  if type(shape) ~= "table" then
    error("shape must be a table of sizes, got " .. type(shape), level + 1)
  end
  local n = #shape
  if n > 8 then error("shape has " .. n .. " dims; at most 8 are supported", level + 1) end
  local arr = i64_arr(math.max(n, 1))
  for i = 1, n do
    local s = shape[i]
    if type(s) ~= "number" or s ~= math.floor(s) or (s < 0 and s ~= -1) then
      error("bad shape: size " .. tostring(s) .. " in dim " .. i, level + 1)
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
  local arr, n = shape_array(shape, 2)
  for i = 1, n do
    if shape[i] < 0 then error("bad shape: negative size in dim " .. i, 2) end
  end
  local box = out_box()
  check(C.mu_tensor_new(dtype_code(dtype, 2), n, arr, box), "zeros", 2)
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
    error("ragged nested table at dim " .. dim, 4)
  end
  for i = 1, #tbl do flatten(tbl[i], shape, dim + 1, out) end
end

-- T.from({1,2,3,4,5,6}, {2,3}) or T.from({{1,2,3},{4,5,6}}); dtype optional.
function T.from(values, shape, dtype)
  if type(values) ~= "table" then error("values must be a table", 2) end
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
    error(("values has %d elements but shape %s needs %d"):format(#flat, table.concat(shape, "x"), n), 2)
  end
  local p = ffi.cast(CTYPES[t.scalar], t.data)
  for i = 1, n do
    local v = flat[i]
    if type(v) ~= "number" then error("values[" .. i .. "] is not a number", 2) end
    p[i - 1] = v
  end
  return t
end

-- Wrap memory the caller keeps alive (a cdata pointer) as a tensor.
function T.wrap(ptr, shape, dtype)
  local arr, n = shape_array(shape, 2)
  local box = out_box()
  check(C.mu_tensor_wrap(dtype_code(dtype, 2), n, arr, nil, ptr, box), "wrap", 2)
  return adopt(box)
end

function T.load(path)
  if type(path) ~= "string" then error("path must be a string", 2) end
  local box = out_box()
  check(C.mu_npy_load(path, box), "load", 2)
  return adopt(box)
end

-- Deterministic standard-normal tensor (splitmix64 + Box-Muller), for
-- tests, benchmarks and examples.
function T.randn(shape, seed, dtype)
  local t = T.zeros(shape, dtype)
  local n = t:numel()
  local p = ffi.cast(CTYPES[t.scalar], t.data)
  local state = ffi.new("uint64_t[1]", (seed or 1) * 2654435761ULL + 0x9E3779B97F4A7C15ULL)
  local function next_u()
    state[0] = state[0] + 0x9E3779B97F4A7C15ULL
    local z = state[0]
    z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
    z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
    z = bit.bxor(z, bit.rshift(z, 31))
    return (tonumber(bit.rshift(z, 11)) + 0.5) / 9007199254740992
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

local function check_dim(t, d, what, level)
  if type(d) ~= "number" or d ~= math.floor(d) or d < 1 or d > t.ndim then
    error(("%s: dim %s out of range 1..%d"):format(what, tostring(d), t.ndim), level + 1)
  end
  return d - 1
end

function methods:size(d)
  if d ~= nil then return tonumber(self.dims[check_dim(self, d, "size", 2)]) end
  local s = {}
  for i = 0, self.ndim - 1 do s[i + 1] = tonumber(self.dims[i]) end
  return s
end

function methods:stride(d)
  if d ~= nil then return tonumber(self.strides[check_dim(self, d, "stride", 2)]) end
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
    error("view: tensor is not contiguous (call :contiguous() first)", 2)
  end
  local arr, n = shape_array(shape, 2)
  local box = out_box()
  check(C.mu_tensor_view(self, n, arr, box), "view", 2)
  return adopt(box)
end

-- Like view, but copies first when the tensor is not contiguous.
function methods:reshape(shape)
  if self:is_contiguous() then return self:view(shape) end
  return self:contiguous():view(shape)
end

function methods:transpose(d1, d2)
  local box = out_box()
  check(C.mu_tensor_transpose(self, check_dim(self, d1, "transpose", 2),
    check_dim(self, d2, "transpose", 2), box), "transpose", 2)
  return adopt(box)
end

-- narrow(dim, start, length): start is 1-based.
function methods:narrow(d, start, length)
  local dim = check_dim(self, d, "narrow", 2)
  if type(start) ~= "number" or type(length) ~= "number" then
    error("narrow: start and length must be numbers", 2)
  end
  local size = tonumber(self.dims[dim])
  if start < 1 or length < 0 or start - 1 + length > size then
    error(("narrow: [%d, %d] out of range 1..%d in dim %d"):format(start, start + length - 1, size, d), 2)
  end
  local box = out_box()
  check(C.mu_tensor_narrow(self, dim, start - 1, length, box), "narrow", 2)
  return adopt(box)
end

-- select(dim, index): narrow to one index and drop that dim (a view).
function methods:select(d, index)
  local n = self:narrow(d, index, 1)
  local box = out_box()
  check(C.mu_tensor_squeeze(n, d - 1, box), "select", 2)
  return adopt(box)
end

function methods:squeeze(d)
  local box = out_box()
  check(C.mu_tensor_squeeze(self, check_dim(self, d, "squeeze", 2), box), "squeeze", 2)
  return adopt(box)
end

function methods:unsqueeze(d)
  if type(d) ~= "number" or d < 1 or d > self.ndim + 1 then
    error(("unsqueeze: dim %s out of range 1..%d"):format(tostring(d), self.ndim + 1), 2)
  end
  local box = out_box()
  check(C.mu_tensor_unsqueeze(self, d - 1, box), "unsqueeze", 2)
  return adopt(box)
end

function methods:contiguous()
  local box = out_box()
  check(C.mu_tensor_contiguous(self, box), "contiguous", 2)
  return adopt(box)
end

function methods:clone(dtype)
  local box = out_box()
  check(C.mu_tensor_clone(self, dtype and dtype_code(dtype, 2) or -1, box), "clone", 2)
  return adopt(box)
end

function methods:to(dtype)
  if self:dtype() == dtype then return self end
  return self:clone(dtype)
end

function methods:copy(src)
  if not T.is_tensor(src) then error("copy: source is not a tensor", 2) end
  check(C.mu_tensor_copy(self, src), "copy", 2)
  return self
end

function methods:fill(v)
  if type(v) ~= "number" then error("fill: value must be a number", 2) end
  check(C.mu_tensor_fill(self, v), "fill", 2)
  return self
end

function methods:zero() return self:fill(0) end

function methods:norm()
  local out = ffi.new("double[1]")
  check(C.mu_tensor_norm(self, out), "norm", 2)
  return out[0]
end

function methods:all_finite()
  return C.mu_tensor_all_finite(self, nil) ~= 0
end

local function index_array(self, idx, first, level)
  local n = self.ndim
  if #idx ~= n then
    error(("expected %d indices, got %d"):format(n, #idx), level + 1)
  end
  local arr = i64_arr(math.max(n, 1))
  for i = 1, n do
    local v = idx[first + i - 1]
    local size = tonumber(self.dims[i - 1])
    if type(v) ~= "number" or v < 1 or v > size or v ~= math.floor(v) then
      error(("index %s out of range 1..%d in dim %d"):format(tostring(v), size, i), level + 1)
    end
    arr[i - 1] = v - 1
  end
  return arr
end

function methods:get(...)
  local idx = { ... }
  local out = ffi.new("double[1]")
  check(C.mu_tensor_get(self, index_array(self, idx, 1, 2), out), "get", 2)
  return out[0]
end

function methods:set(v, ...)
  if type(v) ~= "number" then error("set: value must be a number", 2) end
  local idx = { ... }
  check(C.mu_tensor_set(self, index_array(self, idx, 1, 2), v), "set", 2)
  return self
end

-- Nested Lua tables (a number for a 0-dim tensor).
function methods:totable()
  local c = self:contiguous()
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
  local c = self:contiguous()
  local p = ffi.cast(CTYPES[c.scalar], c.data)
  local t = {}
  for i = 1, c:numel() do t[i] = p[i - 1] end
  return t
end

function methods:save(path)
  if type(path) ~= "string" then error("save: path must be a string", 2) end
  check(C.mu_npy_save(self, path), "save", 2)
  return self
end

local mt = {
  __index = methods,
  __tostring = function(self)
    return ("tensor(%s, %s)"):format(table.concat(self:size(), "x"), self:dtype())
  end,
}
ffi.metatype("mu_tensor", mt)

return T
