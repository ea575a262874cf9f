-- safetensors: format (byte-exact against the reference writer's layout),
-- bit-exact round trips, hostile input, checksum, atomic saves.
local ffi = require("ffi")
local H = require("helpers")
local T = H.T
local st = require("muon.safetensors")
local C = require("muon.core").C
local E = require("muon.errors")


-- ----------------------------------------------------------------- utils

local function u64le(n)
  local b = {}
  for i = 1, 8 do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(b)
end

local function f32le(x) local a = ffi.new("float[1]", x) return ffi.string(a, 4) end
local function f64le(x) local a = ffi.new("double[1]", x) return ffi.string(a, 8) end

-- A file as the reference writer lays it out: length, header padded with
-- spaces to a multiple of 8, data.
local function st_bytes(header, data, pad)
  if pad ~= false then header = header .. string.rep(" ", (8 - #header % 8) % 8) end
  return u64le(#header) .. header .. (data or "")
end

local tmpdir, rmrf, listdir = H.tmpdir, H.rmrf, H.listdir

local function bytes_of(t)
  local c = t:contiguous()
  return ffi.string(c.data, c:numel() * (c:dtype() == "float64" and 8 or 4))
end

local function hex_checksum(s)
  local out = ffi.new("uint64_t[1]")
  assert(C.mu_st_checksum_bytes(s, #s, out) == 0)
  return bit.tohex(out[0], 16)
end

local function load_err(bytes)
  local path = H.tmpname(".safetensors")
  H.write_file(path, bytes)
  local ok, err = pcall(st.load, path)
  os.remove(path)
  assert(not ok, "load should have failed")
  return tostring(err), path
end

local function seq_bytes(n)
  local t = {}
  for i = 0, n - 1 do t[#t + 1] = string.char((i * 31 + 7) % 256) end
  return table.concat(t)
end

-- ------------------------------------------------------------------ specs

describe("safetensors checksum (XXH64)", function()
  it("matches reference XXH64 values (from xxhsum -H64)", function()
    assert.equal("ef46db3751d8e999", hex_checksum(""))
    assert.equal("44bc2cf5ad770999", hex_checksum("abc"))
    assert.equal("4a74f3a1a39ad4a1", hex_checksum(seq_bytes(31)))
    assert.equal("8d57d6a4671cc43d", hex_checksum(seq_bytes(32)))
    assert.equal("aa6aeb7198c8c81c", hex_checksum(seq_bytes(45)))
    assert.equal("99594f4828043d35", hex_checksum(seq_bytes(1000)))
  end)

  it("streams over tensors exactly like one buffer (any split, strided too)", function()
    local s = seq_bytes(1000)
    -- 250 float32 from the byte sequence, split at awkward element counts
    local whole = T.zeros({ 250 })
    ffi.copy(whole.data, s, 1000)
    for _, cut in ipairs({ { 1, 249 }, { 7, 3, 240 }, { 8, 8, 234 }, { 0, 250 }, { 249, 1 } }) do
      local parts, start = {}, 1
      for _, len in ipairs(cut) do
        parts[#parts + 1] = whole:narrow(1, start, len):clone()
        start = start + len
      end
      local arr = ffi.new("mu_tensor *[?]", #parts)
      for i, p in ipairs(parts) do arr[i - 1] = p end
      local out = ffi.new("uint64_t[1]")
      assert.equal(0, C.mu_st_checksum(#parts, arr, out))
      assert.equal("99594f4828043d35", bit.tohex(out[0], 16))
    end
    -- a transposed (non-contiguous) view hashes its logical row-major bytes
    local m = T.from({ 1, 2, 3, 4, 5, 6 }, { 2, 3 })
    local tr = m:transpose(1, 2)
    local arr = ffi.new("mu_tensor *[1]", { tr })
    local out = ffi.new("uint64_t[1]")
    assert.equal(0, C.mu_st_checksum(1, arr, out))
    assert.equal(hex_checksum(f32le(1) .. f32le(4) .. f32le(2) .. f32le(5) .. f32le(3) .. f32le(6)),
                 bit.tohex(out[0], 16))
  end)
end)

describe("safetensors format", function()
  it("writes exactly the bytes of the reference layout (hand-built)", function()
    local w = T.from({ 1, -2, 0.5, 3 }, { 2, 2 })
    local b = T.from({ 0.25, -1 }, { 2 }, "float64")
    local path = H.tmpname(".safetensors")
    local nbytes = st.save(path, { { name = "weight", tensor = w }, { name = "bias", tensor = b } },
                           { format = "pt" })
    assert.equal(32, nbytes)
    local data = f32le(1) .. f32le(-2) .. f32le(0.5) .. f32le(3) .. f64le(0.25) .. f64le(-1)
    assert.equal("acf982ee9c059b37", hex_checksum(data)) -- xxhsum -H64 of these 32 bytes
    local header = '{"__metadata__":{"format":"pt","muon.checksum":"xxh64:acf982ee9c059b37",'
      .. '"muon.format":"1"},"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},'
      .. '"bias":{"dtype":"F64","shape":[2],"data_offsets":[16,32]}}'
    local expected = st_bytes(header, data)
    local got = H.read_file(path)
    os.remove(path)
    assert.equal(0, (#got - 32) % 8)
    assert.equal(expected, got)
  end)

  it("loads a file laid out by the Python writer (F64 first, no muon metadata)", function()
    -- safetensors.torch.save_file({"a": f32 [3], "b": f64 [1, 2]}, metadata={"format": "pt"})
    -- sorts by dtype (F64 first) then name.
    local header = '{"__metadata__":{"format":"pt"},"b":{"dtype":"F64","shape":[1,2],"data_offsets":[0,16]},'
      .. '"a":{"dtype":"F32","shape":[3],"data_offsets":[16,28]}}'
    local data = f64le(1 / 3) .. f64le(-2.5) .. f32le(7) .. f32le(-0.125) .. f32le(1e-3)
    local path = H.tmpname(".safetensors")
    H.write_file(path, st_bytes(header, data))
    local f = st.load(path)
    os.remove(path)
    assert.same({ "b", "a" }, f.order)
    assert.same({ format = "pt" }, f.metadata)
    assert.equal("float64", f.tensors.b:dtype())
    assert.same({ 1, 2 }, f.tensors.b:size())
    assert.equal(1 / 3, f.tensors.b:get(1, 1))
    assert.equal(-2.5, f.tensors.b:get(1, 2))
    assert.equal("float32", f.tensors.a:dtype())
    assert.equal(f32le(7) .. f32le(-0.125) .. f32le(1e-3), bytes_of(f.tensors.a))
  end)

  it("reads the fixture files (also the seed corpus for fuzzing)", function()
    local f = st.load(H.fixtures .. "/safetensors/muon_small.safetensors")
    assert.same({ "layers.0.w", "layers.0.b", "empty" }, f.order)
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, f.tensors["layers.0.w"]:totable())
    assert.same({ 0.5, -0.25 }, f.tensors["layers.0.b"]:totable())
    assert.same({ 0, 3 }, f.tensors.empty:size())
    assert.equal("10", f.metadata.step)
    -- saving the same content again reproduces the fixture byte for byte
    local path = H.tmpname(".safetensors")
    st.save(path, { { name = "layers.0.w", tensor = f.tensors["layers.0.w"] },
                    { name = "layers.0.b", tensor = f.tensors["layers.0.b"] },
                    { name = "empty", tensor = f.tensors.empty } }, { step = "10" })
    assert.equal(H.read_file(H.fixtures .. "/safetensors/muon_small.safetensors"), H.read_file(path))
    os.remove(path)
    local p = st.load(H.fixtures .. "/safetensors/python_layout.safetensors")
    assert.same({ "b", "a" }, p.order)
    assert.equal(-2.5, p.tensors.b:get(1, 2))
  end)

  it("escapes names like serde_json and reads them back", function()
    local names = { "layers/0.w", 'q"uote', "back\\slash", "tab\tnl\n", "\1ctl", "ünï€😀", "" }
    assert.equal('"layers/0.w"', st.json_string("layers/0.w"))
    assert.equal('"\\u0001ctl"', st.json_string("\1ctl"))
    assert.equal('"tab\\tnl\\n"', st.json_string("tab\tnl\n"))
    local entries = {}
    for i, n in ipairs(names) do entries[i] = { name = n, tensor = T.from({ i }, { 1 }) } end
    local path = H.tmpname(".safetensors")
    st.save(path, entries)
    local f = st.load(path)
    os.remove(path)
    assert.same(names, f.order)
    for i, n in ipairs(names) do assert.equal(i, f.tensors[n]:get(1)) end
  end)

  it("inspect validates the header without reading data", function()
    local path = H.tmpname(".safetensors")
    st.save(path, { x = T.zeros({ 3, 4 }), y = T.zeros({ 5 }, "float64") }, { step = "12" })
    local h = st.inspect(path)
    os.remove(path)
    assert.same({ "x", "y" }, h.order) -- a name map is stored sorted by name
    assert.equal(48 + 40, h.data_size)
    assert.same({ 3, 4 }, h.entries[1].shape)
    assert.equal("float32", h.entries[1].dtype)
    assert.same({ 48, 88 }, h.entries[2].offsets)
    assert.equal("12", h.metadata.step)
    assert.equal("1", h.metadata["muon.format"])
  end)
end)

describe("safetensors round trip", function()
  it("is bit-exact for float32/float64, 0-D..4-D, empty and special values", function()
    local cases = {
      { "s32", T.from({ 3.25 }, {}, "float32") },
      { "v32", T.randn({ 17 }, 1) },
      { "m64", T.randn({ 5, 3 }, 2, "float64") },
      { "c32", T.randn({ 2, 3, 4 }, 3) },
      { "d64", T.randn({ 2, 1, 3, 2 }, 4, "float64") },
      { "e32", T.zeros({ 0 }) },
      { "e64", T.zeros({ 3, 0, 2 }, "float64") },
      { "t32", T.randn({ 4, 6 }, 5):transpose(1, 2) }, -- non-contiguous input
      { "sp32", T.from({ 0 / 0, 1 / 0, -1 / 0, -0.0, 1e-45, 3.4e38 }, { 6 }) },
      { "sp64", T.from({ 0 / 0, 1 / 0, -1 / 0, -0.0, 5e-324, 1.7976931348623157e308 }, { 6 }, "float64") },
    }
    local entries = {}
    for i, c in ipairs(cases) do entries[i] = { name = c[1], tensor = c[2] } end
    local path = H.tmpname(".safetensors")
    st.save(path, entries, { note = "round trip" })
    local f = st.load(path)
    os.remove(path)
    assert.equal(#cases, #f.order)
    for i, c in ipairs(cases) do
      local name, want = c[1], c[2]
      local got = f.tensors[name]
      assert.equal(name, f.order[i])
      assert.equal(want:dtype(), got:dtype())
      assert.same(want:size(), got:size())
      assert.is_true(got:is_contiguous())
      assert.equal(bytes_of(want), bytes_of(got), name .. " differs")
    end
    assert.equal("round trip", f.metadata.note)
  end)

  it("handles an empty file (no tensors)", function()
    local path = H.tmpname(".safetensors")
    assert.equal(0, st.save(path, {}))
    local f = st.load(path)
    os.remove(path)
    assert.same({}, f.order)
    assert.equal("xxh64:ef46db3751d8e999", f.metadata["muon.checksum"])
  end)
end)

describe("safetensors hostile input", function()
  local good_header = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
  local good_data = f32le(1) .. f32le(2)

  it("accepts the minimal valid file used below", function()
    local path = H.tmpname(".safetensors")
    H.write_file(path, st_bytes(good_header, good_data))
    local f = st.load(path)
    os.remove(path)
    assert.equal(2, f.tensors.a:get(2))
  end)

  -- The reference reader (serde_json) refuses these; cjson alone lets them through.
  it("rejects NUL (or any non-space) padding after the JSON object, naming the file", function()
    local hdr = good_header .. " " -- 56 bytes: 8-aligned with one space
    for _, pad in ipairs({ "\0\0\0\0\0\0\0\0", "       \0", "\t\t\t\t\t\t\t\t", "\n       ", "  x     " }) do
      local err, path = load_err(u64le(#good_header + #pad) .. good_header .. pad .. good_data)
      assert.truthy(err:find(path, 1, true), err)
      assert.truthy(err:find("control character", 1, true) or err:find("other than space padding", 1, true)
        or err:find("not valid JSON", 1, true), err)
    end
    local path = H.tmpname(".safetensors")
    H.write_file(path, u64le(#hdr + 8) .. hdr .. "        " .. good_data) -- spaces are fine
    assert.equal(2, st.load(path).tensors.a:get(2))
    os.remove(path)
  end)

  it("rejects a NUL or control character inside a JSON string", function()
    local err = load_err(st_bytes('{"a\0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("control character (byte 0x00)", 1, true), err)
    err = load_err(st_bytes('{"__metadata__":{"k":"v\1"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
      good_data))
    assert.truthy(err:find("control character (byte 0x01)", 1, true), err)
  end)

  it("rejects a duplicate field inside an entry or a duplicate metadata key", function()
    local err = load_err(st_bytes('{"a":{"dtype":"F64","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("tensor 'a': duplicate field 'dtype'", 1, true), err)
    err = load_err(st_bytes('{"a":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}}', good_data))
    assert.truthy(err:find("duplicate field 'shape'", 1, true), err)
    err = load_err(st_bytes('{"__metadata__":{"k":"1","\\u006b":"2"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
      good_data))
    assert.truthy(err:find("__metadata__: duplicate key 'k'", 1, true), err)
    err = load_err(st_bytes('{"__metadata__":{},"__metadata__":{},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
      good_data))
    assert.truthy(err:find("'__metadata__' appears more than once", 1, true), err)
  end)

  it("refuses a FIFO, a directory or a device at once (EIO naming the path, no blocking)", function()
    local dir = tmpdir()
    local fifo = dir .. "/pipe.safetensors"
    assert(os.execute("mkfifo '" .. fifo .. "'") == 0)
    for _, p in ipairs({ fifo, dir, "/dev/zero" }) do
      local ok, err = pcall(st.load, p)
      assert.is_false(ok)
      assert.equal(E.EIO, err.code)
      assert.truthy(tostring(err):find("'" .. p .. "' is not a regular file", 1, true), tostring(err))
    end
    rmrf(dir)
  end)

  it("save refuses a directory, a FIFO and links to them (the link stays); through a link to a file it replaces the file",
    function()
    local dir = tmpdir()
    local x = T.randn({ 3, 2 }, 5)
    local function sh(cmd) assert(os.execute(cmd) == 0, cmd) end
    sh(("mkdir '%s/d' && mkfifo '%s/fifo'"):format(dir, dir))
    sh(("ln -s d '%s/to_dir' && ln -s to_dir '%s/to_link' && ln -s fifo '%s/to_fifo' && ln -s nowhere '%s/dangling'")
      :format(dir, dir, dir, dir))
    local refused = {
      { "d", "it is a directory, not a file" }, { "to_dir", "it is a symbolic link to a directory" },
      { "to_link", "it is a symbolic link to a directory" }, { "fifo", "it is a FIFO" },
      { "to_fifo", "it is a symbolic link to a FIFO" }, { "dangling", "it is a symbolic link that leads to no file" },
      { "d/", "it is a directory" }, { "to_dir/", "it is a directory" },
    }
    local function listing() return table.concat(listdir(dir), ",") .. "|" .. table.concat(listdir(dir .. "/d"), ",") end
    local before = listing()
    for _, c in ipairs(refused) do
      local p = dir .. "/" .. c[1]
      for _, save in ipairs({ function() st.save(p, { x = x }) end, function() x:save(p) end }) do
        local ok, err = pcall(save)
        assert.is_false(ok, p)
        assert.equal(E.EIO, err.code)
        assert.truthy(tostring(err):find("cannot save '" .. p .. "': " .. c[2], 1, true), tostring(err))
      end
    end
    assert.equal(before, listing()) -- no link replaced, nothing written in the directory
    assert.equal("d", H.readlink(dir .. "/to_dir"))
    -- loads refuse them too
    for _, c in ipairs({ "d", "to_dir", "to_link" }) do
      local ok, err = pcall(st.load, dir .. "/" .. c)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("is not a regular file", 1, true), tostring(err))
    end
    -- a link to a file: the file gets the new contents, the link stays
    st.save(dir .. "/d/real.safetensors", { x = T.zeros({ 1 }) })
    sh(("ln -s d/real.safetensors '%s/to_file'"):format(dir))
    st.save(dir .. "/to_file", { x = x })
    assert.equal("d/real.safetensors", H.readlink(dir .. "/to_file"))
    assert.equal(bytes_of(x), bytes_of(st.load(dir .. "/d/real.safetensors").tensors.x))
    assert.equal(bytes_of(x), bytes_of(st.load(dir .. "/to_file").tensors.x))
    assert.same({ "real.safetensors" }, listdir(dir .. "/d")) -- no temporary left
    rmrf(dir)
  end)

  it("rejects files too short for the length field", function()
    assert.matches("too short", load_err("\1\0\0"))
    assert.matches("too short", load_err(""))
  end)

  it("rejects a header length larger than the file or above 100 MB", function()
    local err, path = load_err(u64le(1000) .. good_header)
    assert.matches("larger than the file", err)
    assert.truthy(err:find(path, 1, true), "error names the path")
    assert.matches("exceeds the limit", load_err(u64le(2 ^ 40) .. good_header))
    assert.matches("exceeds the limit", load_err(string.rep("\255", 8) .. good_header))
  end)

  it("rejects truncated files (header and data)", function()
    local path = H.tmpname(".safetensors")
    st.save(path, { { name = "w", tensor = T.randn({ 8, 8 }, 9) } })
    local full = H.read_file(path)
    os.remove(path)
    assert.matches("tensor 'w'.*past the end", load_err(full:sub(1, #full - 1)))
    assert.matches("past the end", load_err(full:sub(1, #full - 100)))
    assert.matches("larger than the file", load_err(full:sub(1, 20)))
    assert.matches("trailing", load_err(full .. "xx"))
  end)

  it("rejects bad JSON, non-UTF-8, non-objects and deep nesting", function()
    assert.matches("not valid JSON", load_err(st_bytes('{"a": {"dtype": "F32",', "")))
    assert.matches("not valid JSON", load_err(st_bytes('{"a":NaN}', "")))
    assert.matches("not valid UTF%-8", load_err(st_bytes('{"\255":1}', "")))
    assert.matches("not valid UTF%-8", load_err(st_bytes('{"\237\160\128":1}', ""))) -- surrogate
    assert.matches("does not start with", load_err(st_bytes('[1,2]', "")))
    assert.matches("does not start with", load_err(st_bytes('"x"', "")))
    assert.matches("not valid JSON", load_err(st_bytes('{"a":' .. string.rep("[", 500) .. string.rep("]", 500) .. "}", "")))
    assert.matches("tensor 'a': entry is not an object", load_err(st_bytes('{"a":1}', "")))
    assert.matches("tensor 'a': unexpected key 'extra'",
      load_err(st_bytes('{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4],"extra":1}}', f32le(1))))
  end)

  it("rejects unsupported dtypes naming the tensor and the dtype", function()
    local err = load_err(st_bytes('{"emb":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}', "ab"))
    assert.matches("tensor 'emb': dtype 'F8_E4M3' is not supported", err)
    local path
    err, path = load_err(st_bytes('{"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}', "12345678"))
    assert.truthy(err:find(("safetensors '%s': tensor 'i' is I64, which muon does not store: load(path, { dtype = \"float32\" })")
      :format(path), 1, true), err)
    assert.matches("dtype is missing", load_err(st_bytes('{"i":{"shape":[1],"data_offsets":[0,4]}}', "1234")))
  end)

  it("rejects bad shapes", function()
    local function shp(s)
      return load_err(st_bytes('{"a":{"dtype":"F32","shape":' .. s .. ',"data_offsets":[0,8]}}', good_data))
    end
    assert.matches("tensor 'a': shape entry 1 %(%-2%)", shp("[-2]"))
    assert.matches("shape entry 2 %(1.5%)", shp("[1,1.5]"))
    assert.matches("shape entry 1", shp('["2"]'))
    assert.matches("shape is missing or not a list", shp('"2"'))
    assert.matches("shape has 9 dims", shp("[1,1,1,1,1,1,1,1,2]"))
    assert.matches("shape %[1%] of F32 needs 4 bytes but data_offsets %[0, 8%] hold 8", shp("[1]"))
    assert.matches("shape %[3%] needs more than the 8 bytes of its data_offsets %[0, 8%]", shp("[3]"))
    assert.matches("shape entry 1", shp("[1e300]"))
  end)

  it("rejects a 10^15-element claim before allocating", function()
    local err = load_err(st_bytes('{"big":{"dtype":"F32","shape":[1000000,1000000,1000],"data_offsets":[0,8]}}', good_data))
    assert.matches("tensor 'big': shape %[1000000, 1000000, 1000%] needs more than the 8 bytes", err)
    err = load_err(st_bytes('{"big":{"dtype":"F64","shape":[1000000000000000],"data_offsets":[0,8000000000000000]}}', good_data))
    assert.matches("tensor 'big': data_offsets %[0, 8000000000000000%] run past the end", err)
    -- product overflowing int64 / double precision
    err = load_err(st_bytes('{"big":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}', good_data))
    assert.matches("needs more than", err)
  end)

  it("rejects offsets out of range, reversed, overlapping or leaving gaps", function()
    local function off(h, data)
      return load_err(st_bytes(h, data or good_data))
    end
    assert.matches("tensor 'a': data_offsets %[0, 12%] run past the end of the data section %(8 bytes%)",
      off('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}'))
    assert.matches("begin after they end", off('{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}'))
    assert.matches("data_offsets is not a list of two", off('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}'))
    assert.matches("not non%-negative integers", off('{"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}'))
    assert.matches("not non%-negative integers", off('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}}'))
    local err = off('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
      .. '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', good_data .. f32le(3))
    assert.matches("tensor 'b' %(data_offsets %[4, 12%]%) overlaps tensor 'a'", err)
    err = off('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
      .. '"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')
    assert.matches("overlaps", err)
    err = off('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')
    assert.matches("tensor 'a' starts at 4, leaving a gap of 4 bytes", err)
  end)

  it("rejects duplicate tensor names (which cjson would merge)", function()
    local err = load_err(st_bytes('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
      .. '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', good_data))
    assert.matches("tensor 'a' appears more than once", err)
    -- the same name spelled with an escape is still a duplicate
    err = load_err(st_bytes('{"ab":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
      .. '"a\\u0062":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', good_data))
    assert.matches("tensor 'ab' appears more than once", err)
    -- nested keys of the same name are fine
    local path = H.tmpname(".safetensors")
    H.write_file(path, st_bytes('{"__metadata__":{"dtype":"x"},"dtype":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', good_data))
    local f = st.load(path)
    os.remove(path)
    assert.equal(1, f.tensors.dtype:get(1))
  end)

  it("rejects non-string metadata", function()
    assert.matches("__metadata__ value of 'step' is a number",
      load_err(st_bytes('{"__metadata__":{"step":3}}', "")))
    assert.matches("__metadata__ is not an object", load_err(st_bytes('{"__metadata__":"x"}', "")))
  end)

  it("detects a bit flip or a wrong checksum", function()
    local path = H.tmpname(".safetensors")
    st.save(path, { { name = "w", tensor = T.randn({ 16, 16 }, 11) }, { name = "v", tensor = T.randn({ 7 }, 12, "float64") } })
    local full = H.read_file(path)
    os.remove(path)
    for _, pos in ipairs({ #full, #full - 100, #full - 1023 }) do
      local flipped = full:sub(1, pos - 1) .. string.char(bit.bxor(full:byte(pos), 0x10)) .. full:sub(pos + 1)
      assert.matches("checksum mismatch", load_err(flipped))
    end
    local other = full:gsub('"xxh64:(%x+)"', '"xxh64:0000000000000000"')
    assert.matches("checksum mismatch %(header says xxh64:0000000000000000", load_err(other))
    other = full:gsub('"xxh64:(%x+)"', '"crc32:0000000000000000"')
    assert.matches("unsupported checksum", load_err(other))
  end)

  it("survives random corruption of a valid file without crashing", function()
    local path = H.tmpname(".safetensors")
    st.save(path, { a = T.randn({ 3, 5 }, 1), b = T.randn({ 4 }, 2, "float64") }, { k = "v" })
    local full = H.read_file(path)
    local seed = 12345
    local function rnd(n)
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed % n + 1
    end
    local failures = 0
    for _ = 1, 300 do
      local s = full
      for _ = 1, rnd(4) do
        local p = rnd(#s)
        s = s:sub(1, p - 1) .. string.char(rnd(256) - 1) .. s:sub(p + 1)
      end
      if rnd(4) == 1 then s = s:sub(1, rnd(#s)) end
      H.write_file(path, s)
      local ok, err = pcall(st.load, path)
      if not ok then
        failures = failures + 1
        assert.truthy(tostring(err):find(path, 1, true), "error names the path: " .. tostring(err))
        assert.equal(E.EFORMAT, E.code(err), tostring(err))
      end
    end
    os.remove(path)
    assert.is_true(failures > 250) -- almost every corruption is detected
  end)
end)

describe("safetensors error codes", function()
  local function code_of(f, ...)
    local ok, err = pcall(f, ...)
    assert.is_false(ok, "expected an error")
    assert.is_true(E.is(err), "not an error object: " .. tostring(err))
    return err.code, err
  end

  it("EIO when the file cannot be opened or read", function()
    local missing = H.tmpname(".safetensors")
    local code, err = code_of(st.load, missing)
    assert.equal(E.EIO, code)
    assert.truthy(err:find(missing, 1, true), err.msg)
    assert.equal(E.EIO, (code_of(st.inspect, missing)))
    local dir = tmpdir()
    assert.equal(E.EIO, (code_of(st.load, dir)))
    assert.equal(E.EIO, (code_of(st.save, dir .. "/missing/x.safetensors", { w = T.zeros({ 2 }) })))
    rmrf(dir)
  end)

  it("EFORMAT for bad contents, whichever layer finds them", function()
    local path = H.tmpname(".safetensors")
    st.save(path, { w = T.randn({ 8, 8 }, 9) })
    local full = H.read_file(path)
    local cases = {
      { "too short (C reader)", "\1\0\0" },
      { "length past the end (C reader)", full:sub(1, 20) },
      { "data truncated", full:sub(1, #full - 1) },
      { "bad JSON", st_bytes('{"a": {"dtype": "F32",', "") },
      { "checksum mismatch", full:sub(1, #full - 1) .. string.char(bit.bxor(full:byte(#full), 1)) },
    }
    for _, c in ipairs(cases) do
      H.write_file(path, c[2])
      assert.equal(E.EFORMAT, (code_of(st.load, path)), c[1])
      if c[1] ~= "checksum mismatch" then assert.equal(E.EFORMAT, (code_of(st.inspect, path)), c[1]) end
    end
    os.remove(path)
  end)

  it("EINVAL for bad arguments, with the same messages", function()
    local x = T.zeros({ 2 })
    local p = H.tmpname(".safetensors")
    local code, err = code_of(st.save, nil, { x = x })
    assert.equal(E.EINVAL, code)
    assert.equal("path must be a non-empty string, got nil", err.msg)
    assert.equal(E.EINVAL, (code_of(st.save, p, { a = 1 })))
    assert.equal(E.EINVAL, (code_of(st.save, p, { a = x }, { ["muon.format"] = "2" })))
    assert.equal(E.EINVAL, (code_of(st.load, 42)))
    assert.is_nil(io.open(p, "rb"))
  end)
end)

describe("safetensors C reader", function()
  it("bounds-checks every read (offsets, sizes, contiguity)", function()
    local path = H.tmpname(".safetensors")
    H.write_file(path, st_bytes('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}',
                                f32le(1) .. f32le(2) .. f32le(3) .. f32le(4)))
    local box = ffi.new("mu_st_reader *[1]")
    assert.equal(0, C.mu_st_reader_open(path, box))
    local r = box[0]
    local len = ffi.new("size_t[1]")
    local hdr = ffi.string(C.mu_st_reader_header(r, len), len[0])
    assert.equal(0, #hdr % 8)
    assert.equal("{", hdr:sub(1, 1))
    assert.equal(16, tonumber(C.mu_st_reader_data_size(r)))
    local t = T.zeros({ 2 })
    assert.equal(0, C.mu_st_reader_read(r, 4, 12, t))
    assert.same({ 2, 3 }, t:totable())
    assert.equal(C.MU_EFORMAT, C.mu_st_reader_read(r, 12, 20, t))
    assert.matches("past the end", ffi.string(C.mu_last_error()))
    assert.equal(C.MU_EFORMAT, C.mu_st_reader_read(r, 8, 4, t))
    assert.equal(C.MU_EFORMAT, C.mu_st_reader_read(r, -8, 0, t))
    assert.equal(C.MU_ESHAPE, C.mu_st_reader_read(r, 0, 12, t))
    assert.equal(C.MU_ESHAPE, C.mu_st_reader_read(r, 0, 8, T.zeros({ 2 }, "float64")))
    assert.equal(C.MU_EINVAL, C.mu_st_reader_read(r, 0, 8, T.zeros({ 2, 2 }):narrow(2, 1, 1)))
    assert.equal(0, C.mu_st_reader_read(r, 16, 16, T.zeros({ 0 })))
    C.mu_st_reader_close(r)
    os.remove(path)
    assert.equal(C.MU_EIO, C.mu_st_reader_open(path, box))
    assert.matches("cannot open", ffi.string(C.mu_last_error()))
    assert.equal(C.MU_EIO, C.mu_st_reader_open("/tmp", box))
  end)
end)

describe("safetensors save", function()
  it("validates its arguments", function()
    local x = T.zeros({ 2 })
    local p = H.tmpname(".safetensors")
    assert.has_error(function() st.save(nil, { x = x }) end, "path must be a non-empty string, got nil")
    assert.has_error(function() st.save(p, 3) end)
    assert.has_error(function() st.save(p, { { name = "a", tensor = x }, { name = "a", tensor = x } }) end,
                     "tensor name 'a' is used twice")
    assert.has_error(function() st.save(p, { { name = "a" } }) end, "entries[1] must be {name = string, tensor = tensor}")
    assert.has_error(function() st.save(p, { { name = "a", tensor = x, dtype = "x" } }) end, "entries[1]: unknown key 'dtype'")
    assert.has_error(function() st.save(p, { __metadata__ = x }) end, "'__metadata__' cannot be a tensor name")
    assert.has_error(function() st.save(p, { ["\255"] = x }) end)
    assert.has_error(function() st.save(p, { a = 1 }) end, "entries['a'] is not a tensor")
    assert.has_error(function() st.save(p, { a = x }, { n = 1 }) end, "metadata must map strings to strings (key n holds a number)")
    assert.has_error(function() st.save(p, { a = x }, { ["muon.checksum"] = "x" }) end,
                     "metadata key 'muon.checksum' is reserved (written by save)")
    os.remove(p)
  end)

  it("fails without touching the previous file when the temp file cannot be created", function()
    local dir = tmpdir()
    local path = dir .. "/ckpt.safetensors"
    local old = T.randn({ 4, 4 }, 21)
    st.save(path, { w = old })
    local before = H.read_file(path)
    -- no file descriptor left: the temporary file cannot be created
    local new = T.randn({ 4, 4 }, 22)
    local ok, err = H.without_fds(st.save, path, { w = new })
    assert.is_false(ok)
    assert.matches("cannot save '.*ckpt.safetensors': cannot create a temporary file in its directory", err)
    assert.equal(before, H.read_file(path))
    assert.equal(bytes_of(old), bytes_of(st.load(path).tensors.w))
    -- missing directory
    ok, err = pcall(st.save, dir .. "/missing/x.safetensors", { w = old })
    assert.is_false(ok)
    assert.matches("No such file or directory", err)
    assert.same({ "ckpt.safetensors" }, listdir(dir))
    rmrf(dir)
  end)

  it("fails on a full disk, leaving the previous file intact (64 KiB tmpfs)", function()
    local dir = tmpdir()
    if os.execute("mount -t tmpfs -o size=64k tmpfs '" .. dir .. "' 2>/dev/null") ~= 0 then
      rmrf(dir)
      pending("cannot mount a tmpfs here (needs root); the injection test above still runs")
      return
    end
    local ok, err = pcall(function()
      local path = dir .. "/ckpt.safetensors"
      local old = T.randn({ 64, 64 }, 31) -- 16 KiB
      st.save(path, { w = old })
      local before = H.read_file(path)
      local ok2, err2 = pcall(st.save, path, { w = T.randn({ 128, 128 }, 32) }) -- 64 KiB: no room
      assert.is_false(ok2)
      assert.matches("cannot save '.*ckpt.safetensors': writing temporary file .* No space left on device", err2)
      assert.equal(before, H.read_file(path))
      assert.equal(bytes_of(old), bytes_of(st.load(path).tensors.w))
      assert.same({ "ckpt.safetensors" }, listdir(dir)) -- no temp file left behind
    end)
    os.execute("umount '" .. dir .. "'")
    rmrf(dir)
    assert(ok, err)
  end)

  it("saves to a 250-byte file name (the temporary name is cut to fit NAME_MAX) and leaves no temporary", function()
    local dir = tmpdir()
    local name = string.rep("n", 238) .. ".safetensors" -- 250 bytes
    assert.equal(250, #name)
    local x = T.randn({ 3, 5 }, 41)
    st.save(dir .. "/" .. name, { x = x })
    assert.equal(bytes_of(x), bytes_of(st.load(dir .. "/" .. name).tensors.x))
    x:save(dir .. "/" .. string.rep("m", 246) .. ".npy")
    assert.same({ string.rep("m", 246) .. ".npy", name }, listdir(dir))
    rmrf(dir)
  end)

  it("keeps the previous file loadable when the saving process is killed mid-save", function()
    local dir = tmpdir()
    local path = dir .. "/ckpt.safetensors"
    local n = 1024 * 1024
    local a = T.zeros({ n }):fill(1)
    local b = T.zeros({ n }):fill(2)
    st.save(path, { w = a })
    local seen, torn, round = {}, 0, 0
    while round < 20 and (round < 4 or torn < 2) do
      round = round + 1
      local pid = ffi.C.fork()
      assert(pid >= 0, "fork failed")
      if pid == 0 then
        pcall(function()
          for i = 1, 50 do st.save(path, { w = (i % 2 == 1) and b or a }) end
        end)
        ffi.C._exit(0)
      end
      H.kill_when_exists(pid, function() return H.dir_has(dir, ".tmp.") end)
      local f = st.load(path) -- checksum verified: a torn file would fail here
      local v = f.tensors.w:get(1)
      assert.is_true(v == 1 or v == 2)
      assert.equal(math.sqrt(n) * v, f.tensors.w:norm())
      seen[v] = true
      for _, e in ipairs(listdir(dir)) do
        if e:find(".tmp.", 1, true) then torn = torn + 1 end
      end
      os.execute("rm -f '" .. path .. "'.tmp.*")
    end
    assert.is_true(torn >= 1, "no kill landed during a save in 20 rounds")
    rmrf(dir)
  end)
end)
