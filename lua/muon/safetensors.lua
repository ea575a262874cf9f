-- safetensors files: the format of Hugging Face's `safetensors` package
-- (u64 little-endian header length N, N bytes of JSON, raw little-endian
-- data). Tensors are saved as F32, F64 or BF16 (their dtype); load() reads
-- those as they are and, on request, F16, integer and BOOL tensors (and the
-- others) converted: st.load(path, { dtype = "float32" }).
--
--   local st = require("muon.safetensors")
--   st.save(path, { {name = "w", tensor = w}, ... } or { w = w, ... }, { key = "value" })
--   local f = st.load(path [, { dtype =, checksum = }])
--                              --> { tensors = {name -> tensor}, order = {names in file order},
--                              --    metadata = {string -> string} }
--   local h = st.inspect(path) --> { entries = { {name, dtype, shape, offsets = {b, e}}, ... },
--                              --    order, metadata, data_size }   (no data read)
--
-- The JSON header is parsed with lua-cjson and produced here in the exact
-- layout of the reference (Rust) writer: compact, "__metadata__" first,
-- then each tensor as {"dtype","shape","data_offsets"}, padded with spaces to
-- a multiple of 8 bytes. Tensors are stored in the given order, contiguous,
-- without gaps. save() adds "muon.format" = "1" and "muon.checksum" =
-- "xxh64:<16 hex digits>" (XXH64 of the data section) to the metadata; load()
-- verifies the checksum when present. Writes are atomic (src/safetensors.c).
--
-- Files are untrusted input: every structure, dtype, shape and offset is
-- validated before anything is allocated; offsets must tile the data section
-- exactly (no overlap, no gap, no trailing bytes), as the reference reader
-- requires. Errors name the path and the tensor, and are error objects
-- (lua/muon/errors.lua): EIO when the file cannot be opened or read (or
-- written), EFORMAT for bad contents, EINVAL for bad arguments.
--[[ reference muon.safetensors
    safetensors files (Hugging Face's format). Files are untrusted input:
    every structure, dtype, shape and offset is validated before anything
    is allocated. Errors name the path and the tensor: EIO (cannot open,
    read or write), EFORMAT (bad contents, checksum mismatch), EINVAL (bad
    arguments).
muon.safetensors.save(path, entries, metadata)
    Write tensors atomically (F32, F64 or BF16, their dtype; a temporary
    file renamed over path: a directory, a FIFO or a device at path, or a
    symbolic link to one, is EIO; through a link to a file that file is
    replaced and the link stays). entries: an
    ordered list of { name =, tensor = } or a name -> tensor table (stored
    sorted by name); metadata: string -> string. Adds "muon.format" = "1"
    and "muon.checksum" = "xxh64:<16 hex digits>" (of the data section).
    The header is laid out as the reference (Rust) writer does. Returns
    the data section's bytes and its checksum.
muon.safetensors.load(path, opts)
    { tensors = { name -> tensor }, order = { names in file order },
    metadata = { string -> string } }, new contiguous tensors.
    opts.checksum = true: false does not verify "muon.checksum" (a file
    written or edited by another program).
    opts.dtype = nil: "float32" | "float64" | "bfloat16" converts every
    tensor (F16, integer and BOOL tensors load only so).
muon.safetensors.open(path)
    A file opened for reading some of its tensors, its header validated:
    { entries, by_name, metadata, data_size, read(name, dst) (dst
    contiguous, of the entry's dtype and numel), checksum() ("xxh64:..."
    of the data section), close() }.
muon.safetensors.load_options(opts)
    The options of a load, checked: whether to verify checksums, and the
    dtype (nil: as stored).
muon.safetensors.inspect(path)
    The validated header without reading the data: { entries = { {name,
    dtype, shape, offsets = {b, e}}, ... }, order, metadata, data_size }.
muon.safetensors.json_string(s)
    A JSON string literal of s, as the header writer escapes it.
muon.safetensors.valid_utf8(s)
    true if s is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF),
    else false and the byte position of the first bad sequence.
muon.safetensors.FORMAT_VERSION
muon.safetensors.MAX_DIMS
    "1" (the "muon.format" written); the most dims a tensor may have (8).
]]
local ffi = require("ffi")
local bit = require("bit")
local core = require("muon.core")
local E = require("muon.errors")
local T = require("muon.tensor")

local C, check = core.C, core.check

local cjson = require("cjson").new()
cjson.decode_invalid_numbers(false) -- no NaN, Infinity, hex
cjson.decode_max_depth(8)           -- a valid header nests 3 deep

local M = {}

M.FORMAT_VERSION = "1"
M.MAX_DIMS = 8
local MAX_INT = 2 ^ 53 -- integers in the header must be exact doubles

-- safetensors name <-> muon dtype, from C's one table (MU_DTYPES); the
-- element size of every name muon reads, from C (mu_st_dtype_size).
local DTYPE_OF, ST_DTYPE = {}, {}
for code = 0, C.MU_DTYPE_COUNT - 1 do
  local f, n = ffi.string(C.mu_dtype_file_name(code)), ffi.string(C.mu_dtype_name(code))
  DTYPE_OF[f], ST_DTYPE[n] = n, f
end
local function elsize(st_dtype)
  local n = tonumber(C.mu_st_dtype_size(st_dtype))
  return n > 0 and n or nil
end
local RESERVED_META = { ["muon.checksum"] = true, ["muon.format"] = true }

local reader_box = ffi.typeof("mu_st_reader *[1]")
local size_box = ffi.typeof("size_t[1]")
local u64_box = ffi.typeof("uint64_t[1]")
local tensor_arr = ffi.typeof("mu_tensor *[?]")

-- ------------------------------------------------------------- helpers

-- Is s valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF)?
local function valid_utf8(s)
  local i, n = 1, #s
  local byte, find = string.byte, string.find
  while true do
    i = find(s, "[\128-\255]", i)
    if not i then return true end
    local c = byte(s, i)
    local len, lo, hi
    lo, hi = 0x80, 0xBF
    if c >= 0xC2 and c <= 0xDF then len = 1
    elseif c == 0xE0 then len, lo = 2, 0xA0
    elseif c == 0xED then len, hi = 2, 0x9F
    elseif c >= 0xE1 and c <= 0xEF then len = 2
    elseif c == 0xF0 then len, lo = 3, 0x90
    elseif c >= 0xF1 and c <= 0xF3 then len = 3
    elseif c == 0xF4 then len, hi = 3, 0x8F
    else return false, i end
    if i + len > n then return false, i end
    local c1 = byte(s, i + 1)
    if c1 < lo or c1 > hi then return false, i end
    for k = 2, len do
      local ck = byte(s, i + k)
      if ck < 0x80 or ck > 0xBF then return false, i end
    end
    i = i + len + 1
  end
end
M.valid_utf8 = valid_utf8

-- JSON string literal as serde_json writes it (the reference writer): only
-- '"', '\' and control characters are escaped; '/' and non-ASCII are not.
local SHORT_ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
                    ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function json_string(s)
  return '"' .. s:gsub('[%z\1-\31"\\]', function(ch)
    return SHORT_ESC[ch] or ("\\u%04x"):format(ch:byte())
  end) .. '"'
end
M.json_string = json_string

local function json_int(x)
  return ("%.0f"):format(x)
end

-- Scan JSON text that cjson has accepted (so well formed) for what cjson
-- lets through but the reference reader (serde_json) refuses: a key twice
-- in one object (cjson keeps the last; serde refuses duplicate fields), and
-- anything after the top-level object but space padding. Returns nil, or
-- a message: where = nil (top level), "__metadata__" or a tensor's name.
local function json_strictness(s, decode)
  local find, byte, sub = string.find, string.byte, string.sub
  local stack, i, close_at = {}, 1, nil
  local top_key -- the last key read at depth 1 (names the inner object)
  while true do
    local j = find(s, '[{}%[%]",]', i)
    if not j then break end
    local c = byte(s, j)
    local top = stack[#stack]
    if c == 34 then -- '"': skip the string, escapes included
      local k = j + 1
      while true do
        local q = find(s, '["\\]', k)
        if not q then return "unterminated string" end
        if byte(s, q) == 92 then k = q + 2 else k = q break end
      end
      if top and top.obj and top.expect_key then
        local raw = sub(s, j, k)
        local ok, key = pcall(decode, raw)
        key = ok and key or raw
        if top.keys[key] then
          if #stack == 1 then return ("tensor '%s' appears more than once in the header"):format(key) end
          if top_key == "__metadata__" then return ("__metadata__: duplicate key '%s'"):format(key) end
          return ("tensor '%s': duplicate field '%s'"):format(tostring(top_key), key)
        end
        top.keys[key] = true
        top.expect_key = false
        if #stack == 1 then top_key = key end
      end
      i = k + 1
    else
      if c == 123 or c == 91 then -- { [
        stack[#stack + 1] = { obj = (c == 123), expect_key = (c == 123), keys = {} }
      elseif c == 125 or c == 93 then -- } ]
        stack[#stack] = nil
        if #stack == 0 then close_at = j break end
      elseif c == 44 and top and top.obj then -- ,
        top.expect_key = true
      end
      i = j + 1
    end
  end
  if close_at and find(s, "[^ ]", close_at + 1) then
    return ("bytes after the JSON object other than space padding (0x20) at byte %d"):format(
      find(s, "[^ ]", close_at + 1))
  end
  return nil
end

local function is_int(x)
  return type(x) == "number" and x == math.floor(x) and x >= 0 and x < MAX_INT
end

local shape_str = T.shape_string

-- A Lua array decoded by cjson: keys exactly 1..n.
local function is_array(t)
  if type(t) ~= "table" then return false end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n == #t
end

-- What a file that is not safetensors looks like, from its first bytes
-- ("" when it is not recognized).
local function looks_like(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local head = f:read(8) or ""
  f:close()
  if head:sub(1, 6) == "\147NUMPY" then return " (it is a NumPy .npy file)" end
  if head:sub(1, 4) == "PK\3\4" then return " (it is a zip archive, as torch.save writes)" end
  if head:sub(1, 2) == "\128\2" or head:sub(1, 2) == "\128\4" then return " (it is a Python pickle)" end
  if head == "" then return " (it is empty)" end
  return ""
end

-- ---------------------------------------------------------- header parse

-- Validate the header text of `path` whose data section has data_size bytes.
-- Returns entries sorted by offset and the metadata table.
local function parse_header(path, text, data_size)
  local function bad(fmt, ...)
    E.raise(E.EFORMAT, "safetensors '%s': " .. fmt, path, ...)
  end
  local ok_utf8, at = valid_utf8(text)
  if not ok_utf8 then bad("header is not valid UTF-8 (byte %d)", at) end
  if text:sub(1, 1) ~= "{" then
    E.raise(E.EFORMAT, "'%s' is not a safetensors file%s: its header does not start with '{'", path, looks_like(path))
  end
  -- JSON allows control characters only as whitespace between tokens (a raw
  -- NUL, in a string or as padding, is refused by the reference reader)
  local ctl = text:find("[%z\1-\8\11\12\14-\31]")
  if ctl then bad("header has a control character (byte 0x%02x) at byte %d", text:byte(ctl), ctl) end
  local ok, hdr = pcall(cjson.decode, text)
  if not ok then bad("header is not valid JSON: %s", tostring(hdr)) end
  if type(hdr) ~= "table" then bad("header is not a JSON object") end
  -- duplicate keys at any depth (cjson keeps only the last), trailing bytes
  local strict = json_strictness(text, cjson.decode)
  if strict then bad("%s", strict) end

  local metadata = {}
  local meta = hdr.__metadata__
  if meta ~= nil and meta ~= cjson.null then
    if type(meta) ~= "table" then bad("__metadata__ is not an object") end
    for k, v in pairs(meta) do
      if type(k) ~= "string" then bad("__metadata__ is not an object") end
      if type(v) ~= "string" then
        bad("__metadata__ value of '%s' is a %s, not a string", k, v == cjson.null and "null" or type(v))
      end
      metadata[k] = v
    end
  end

  local entries = {}
  for name, info in pairs(hdr) do
    if name ~= "__metadata__" then
      if type(name) ~= "string" then bad("header is not a JSON object") end
      local function badt(fmt, ...)
        bad("tensor '%s': " .. fmt, name, ...)
      end
      if type(info) ~= "table" then badt("entry is not an object") end
      for k in pairs(info) do
        if k ~= "dtype" and k ~= "shape" and k ~= "data_offsets" then
          badt("unexpected key '%s' (expected dtype, shape, data_offsets)", tostring(k))
        end
      end
      local dtype = info.dtype
      if type(dtype) ~= "string" then badt("dtype is missing or not a string") end
      local es = elsize(dtype)
      if not es then badt("dtype '%s' is not supported (F32, F64, BF16, F16, I8-I64, U8-U64, BOOL are)", dtype) end
      local shape = info.shape
      if not is_array(shape) then badt("shape is missing or not a list") end
      if #shape > M.MAX_DIMS then badt("shape has %d dims; at most %d are supported", #shape, M.MAX_DIMS) end
      for d = 1, #shape do
        if not is_int(shape[d]) then
          badt("shape entry %d (%s) is not a non-negative integer", d, tostring(shape[d]))
        end
      end
      local offs = info.data_offsets
      if not is_array(offs) or #offs ~= 2 then badt("data_offsets is not a list of two integers") end
      local b, e = offs[1], offs[2]
      if not is_int(b) or not is_int(e) then badt("data_offsets are not non-negative integers") end
      if b > e then badt("data_offsets [%s, %s] begin after they end", json_int(b), json_int(e)) end
      if e > data_size then
        badt("data_offsets [%s, %s] run past the end of the data section (%s bytes); truncated file?",
             json_int(b), json_int(e), json_int(data_size))
      end
      -- element count without overflow: stop as soon as it exceeds the span
      local span = e - b
      local limit = span / es
      local numel = 1
      for d = 1, #shape do
        if shape[d] == 0 then numel = 0 break end
      end
      if numel ~= 0 then
        for d = 1, #shape do
          numel = numel * shape[d]
          if numel > limit then
            badt("shape %s needs more than the %s bytes of its data_offsets [%s, %s]",
                 shape_str(shape), json_int(span), json_int(b), json_int(e))
          end
        end
      end
      if numel * es ~= span then
        badt("shape %s of %s needs %s bytes but data_offsets [%s, %s] hold %s",
             shape_str(shape), dtype, json_int(numel * es), json_int(b), json_int(e), json_int(span))
      end
      local sh = {}
      for d = 1, #shape do sh[d] = shape[d] end
      entries[#entries + 1] = { name = name, dtype = DTYPE_OF[dtype], st_dtype = dtype, shape = sh,
                                offsets = { b, e }, numel = numel }
    end
  end

  table.sort(entries, function(x, y)
    if x.offsets[1] ~= y.offsets[1] then return x.offsets[1] < y.offsets[1] end
    if x.offsets[2] ~= y.offsets[2] then return x.offsets[2] < y.offsets[2] end
    return x.name < y.name
  end)
  local pos, prev = 0, nil
  for _, en in ipairs(entries) do
    local b = en.offsets[1]
    if b < pos then
      bad("tensor '%s' (data_offsets [%s, %s]) overlaps tensor '%s' (which ends at %s)",
          en.name, json_int(b), json_int(en.offsets[2]), prev.name, json_int(pos))
    elseif b > pos then
      bad("tensor '%s' starts at %s, leaving a gap of %s bytes after %s", en.name, json_int(b),
          json_int(b - pos), prev and ("tensor '" .. prev.name .. "'") or "the header")
    end
    pos, prev = en.offsets[2], en
  end
  if pos ~= data_size then
    bad("data section has %s bytes but the tensors cover %s (trailing bytes or missing tensors)",
        json_int(data_size), json_int(pos))
  end
  return entries, metadata
end

local function open_reader(path)
  if type(path) ~= "string" then E.raise(E.EINVAL, "path must be a string, got " .. type(path)) end
  local box = reader_box()
  local rc = C.mu_st_reader_open(path, box) -- EIO (cannot open or read) or EFORMAT (bad length)
  if rc == C.MU_EFORMAT then
    E.raise(E.EFORMAT, "'%s' is not a safetensors file%s: %s", path, looks_like(path),
      (ffi.string(C.mu_last_error()):gsub("^safetensors '.-': ", "")))
  end
  check(rc)
  local r = ffi.gc(box[0], C.mu_st_reader_close)
  local len = size_box()
  local ptr = C.mu_st_reader_header(r, len)
  local text = ffi.string(ptr, len[0])
  local data_size = tonumber(C.mu_st_reader_data_size(r))
  return r, text, data_size
end

local function close_reader(r)
  ffi.gc(r, nil)
  C.mu_st_reader_close(r)
end

local function checksum_hex(n, arr)
  local out = u64_box()
  check(C.mu_st_checksum(n, arr, out), "checksum")
  return "xxh64:" .. bit.tohex(out[0], 16)
end

--- Header of a safetensors file, validated, without reading the data.
function M.inspect(path)
  local r, text, data_size = open_reader(path)
  local ok, entries, metadata = pcall(parse_header, path, text, data_size)
  close_reader(r)
  if not ok then error(entries, 0) end
  local order = {}
  for i, en in ipairs(entries) do order[i] = en.name end
  return { entries = entries, order = order, metadata = metadata, data_size = data_size }
end

--- An open file, validated, to read some of its tensors: { entries,
--- by_name, metadata, data_size, read(name, dst), checksum(), close() }.
--- read fills dst (contiguous, the entry's dtype and numel); checksum is
--- "xxh64:<hex>" of the whole data section (read through).
function M.open(path)
  local r, text, data_size = open_reader(path)
  local ok, entries, metadata = pcall(parse_header, path, text, data_size)
  if not ok then
    close_reader(r)
    error(entries, 0)
  end
  local f = { entries = entries, by_name = {}, metadata = metadata, data_size = data_size }
  for _, en in ipairs(entries) do f.by_name[en.name] = en end
  function f.read(name, dst)
    local en = f.by_name[name]
    local rc = C.mu_st_reader_read(r, en.offsets[1], en.offsets[2], dst)
    if rc ~= 0 then E.raise(tonumber(rc), "tensor '%s': %s", name, ffi.string(C.mu_last_error())) end
  end
  function f.checksum()
    local out = u64_box()
    check(C.mu_st_reader_checksum(r, out), "checksum")
    return "xxh64:" .. bit.tohex(out[0], 16)
  end
  function f.close()
    if r then close_reader(r) end
    r = nil
  end
  return f
end

-- The options of a load: { checksum = false } accepts a file without
-- checksums or with stale ones (written or edited in Python); { dtype =
-- "float32" | "float64" | "bfloat16" } converts every tensor to it. Returns
-- whether to verify the checksums, and the dtype (nil: as stored).
function M.load_options(opts)
  if opts == nil then return true end
  if type(opts) ~= "table" then E.raise(E.EINVAL, "load: options must be a table { checksum = false }, got %s", type(opts)) end
  for k in pairs(opts) do
    if k ~= "checksum" and k ~= "dtype" then
      E.raise(E.EINVAL, "load: %s", E.unknown("option", tostring(k), { "checksum", "dtype" }))
    end
  end
  if opts.checksum ~= nil and type(opts.checksum) ~= "boolean" then
    E.raise(E.EINVAL, "load: checksum must be a boolean, got %s", type(opts.checksum))
  end
  if opts.dtype ~= nil and not ST_DTYPE[opts.dtype] then
    E.raise(E.EINVAL, "load: dtype must be 'float32', 'float64' or 'bfloat16', got %s", tostring(opts.dtype))
  end
  return opts.checksum ~= false, opts.dtype
end

--- Load every tensor (new contiguous tensors) of a safetensors file.
--- opts.checksum = false: do not verify "muon.checksum" (a file written or
--- edited by another program); everything else is validated as always.
function M.load(path, opts)
  local verify, dtype = M.load_options(opts)
  local r, text, data_size = open_reader(path)
  local ok, res = pcall(function()
    local entries, metadata = parse_header(path, text, data_size)
    local tensors, order = {}, {}
    local arr = tensor_arr(math.max(#entries, 1))
    local converted = false
    for i, en in ipairs(entries) do
      local want = dtype or en.dtype
      if not want then
        E.raise(E.EDTYPE, "safetensors '%s': tensor '%s' is %s, which muon does not store: "
                .. "load(path, { dtype = \"float32\" }) converts it", path, en.name, en.st_dtype)
      end
      local t = T.zeros(en.shape, want)
      local rc
      if want == en.dtype then
        rc = C.mu_st_reader_read(r, en.offsets[1], en.offsets[2], t)
      else
        rc, converted = C.mu_st_reader_read_as(r, en.offsets[1], en.offsets[2], en.st_dtype, t), true
      end
      if rc ~= 0 then E.raise(tonumber(rc), "tensor '%s': %s", en.name, ffi.string(C.mu_last_error())) end
      tensors[en.name] = t
      order[i] = en.name
      arr[i - 1] = t
    end
    local want = metadata["muon.checksum"]
    if want ~= nil and verify then
      local algo = want:match("^(%w+):")
      if algo ~= "xxh64" or not want:match("^xxh64:%x+$") or #want ~= 22 then
        E.raise(E.EFORMAT, "safetensors '%s': unsupported checksum '%s' in __metadata__ (expected xxh64:<16 hex>)",
                path, want)
      end
      local got
      if converted then -- the file's bytes, not the converted tensors'
        local out = u64_box()
        check(C.mu_st_reader_checksum(r, out), "checksum")
        got = "xxh64:" .. bit.tohex(out[0], 16)
      else
        got = checksum_hex(#entries, arr)
      end
      if got ~= want:lower() then
        E.raise(E.EFORMAT, "safetensors '%s': checksum mismatch (header says %s, data gives %s): the file is corrupted "
                .. "(or edited by another program: load(path, { checksum = false }) skips the checksums)",
                path, want, got)
      end
    end
    return { tensors = tensors, order = order, metadata = metadata }
  end)
  close_reader(r)
  if not ok then error(res, 0) end
  return res
end

-- ------------------------------------------------------------------ save

-- Ordered list of {name, tensor} from a list of {name=, tensor=} or a map.
local function normalize_entries(entries)
  local function bad(fmt, ...) E.raise(E.EINVAL, fmt, ...) end
  if type(entries) ~= "table" then
    bad("entries must be a list of {name = ..., tensor = ...} or a name -> tensor table, got %s", type(entries))
  end
  local list = {}
  if entries[1] ~= nil then
    local n = #entries
    for k in pairs(entries) do
      if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
        bad("entries mixes a list with key '%s'", tostring(k))
      end
    end
    for i = 1, n do
      local e = entries[i]
      if type(e) ~= "table" or type(e.name) ~= "string" or not T.is_tensor(e.tensor) then
        bad("entries[%d] must be {name = string, tensor = tensor}", i)
      end
      for k in pairs(e) do
        if k ~= "name" and k ~= "tensor" then bad("entries[%d]: unknown key '%s'", i, tostring(k)) end
      end
      list[i] = { name = e.name, tensor = e.tensor }
    end
  else
    for k, v in pairs(entries) do
      if type(k) ~= "string" then bad("entries: key %s is not a name", tostring(k)) end
      if not T.is_tensor(v) then bad("entries['%s'] is not a tensor", k) end
      list[#list + 1] = { name = k, tensor = v }
    end
    table.sort(list, function(a, b) return a.name < b.name end)
  end
  local seen = {}
  for _, e in ipairs(list) do
    if seen[e.name] then bad("tensor name '%s' is used twice", e.name) end
    seen[e.name] = true
    if e.name == "__metadata__" then bad("'__metadata__' cannot be a tensor name") end
    if not valid_utf8(e.name) then bad("tensor name '%s' is not valid UTF-8", e.name) end
  end
  return list
end

--- Save tensors atomically. entries: ordered list of {name=, tensor=} or a
--- name -> tensor table (stored sorted by name); metadata: string -> string.
function M.save(path, entries, metadata)
  if type(path) ~= "string" or path == "" then
    E.raise(E.EINVAL, "path must be a non-empty string, got %s", tostring(path))
  end
  local list = normalize_entries(entries)
  if metadata ~= nil and type(metadata) ~= "table" then
    E.raise(E.EINVAL, "metadata must be a table of string -> string, got %s", type(metadata))
  end
  local meta = {}
  for k, v in pairs(metadata or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      E.raise(E.EINVAL, "metadata must map strings to strings (key %s holds a %s)", tostring(k), type(v))
    end
    if RESERVED_META[k] then E.raise(E.EINVAL, "metadata key '%s' is reserved (written by save)", k) end
    if not valid_utf8(k) or not valid_utf8(v) then
      E.raise(E.EINVAL, "metadata key '%s' or its value is not valid UTF-8", k)
    end
    meta[k] = v
  end

  local n = #list
  local arr = tensor_arr(math.max(n, 1))
  for i, e in ipairs(list) do arr[i - 1] = e.tensor end
  meta["muon.format"] = M.FORMAT_VERSION
  meta["muon.checksum"] = checksum_hex(n, arr)

  local keys = {}
  for k in pairs(meta) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = json_string(k) .. ":" .. json_string(meta[k]) end
  local out = { '{"__metadata__":{' .. table.concat(parts, ",") .. "}" }
  local pos = 0
  for _, e in ipairs(list) do
    local t = e.tensor
    local dt = ST_DTYPE[t:dtype()]
    local dims = {}
    for d = 0, t.ndim - 1 do dims[d + 1] = json_int(tonumber(t.dims[d])) end
    local nbytes = t:numel() * elsize(dt)
    out[#out + 1] = ("%s:{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%s,%s]}")
      :format(json_string(e.name), dt, table.concat(dims, ","), json_int(pos), json_int(pos + nbytes))
    pos = pos + nbytes
  end
  local header = table.concat(out, ",") .. "}"
  check(C.mu_st_write(path, header, #header, n, arr)) -- EIO when the file cannot be written
  return pos, meta["muon.checksum"]
end

return M
