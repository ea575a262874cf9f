-- Hostile input: replays every fuzzer finding (tests/fuzz/regressions/) and
-- the seed corpora through the same checks as the libFuzzer harnesses
-- (tests/fuzz/driver.lua), hand-made hostile .npy headers, and a bounded,
-- seeded random mutation of checkpoint headers (structure-aware: the
-- libFuzzer harness only sees C coverage, not the Lua parser's).
package.path = "tests/fuzz/?.lua;" .. package.path
local H = require("helpers")
local T = H.T
local D = require("driver")

local function files(dir)
  local list = {}
  local p = io.popen("ls -1 " .. dir .. " 2>/dev/null")
  for name in p:lines() do list[#list + 1] = dir .. "/" .. name end
  p:close()
  return list
end

local function copy_to_tmp(path)
  local tmp = H.tmpname()
  H.write_file(tmp, H.read_file(path))
  return tmp
end

describe("fuzz regressions and corpus", function()
  for _, kind in ipairs({ "npy", "safetensors", "config" }) do
    for _, where in ipairs({ "regressions", "corpus" }) do
      for _, path in ipairs(files("tests/fuzz/" .. where .. "/" .. kind)) do
        it(("%s %s: %s"):format(kind, where, path:match("[^/]+$")), function()
          if kind == "npy" then
            local ok, err = pcall(T.load, path)
            if where == "corpus" then assert.is_true(ok, tostring(err)) end
            if not ok then assert.truthy(tostring(err):find(path, 1, true), tostring(err)) end
          else
            local tmp = copy_to_tmp(path) -- the driver wants a path it may name
            local ok, err = pcall(D[kind], tmp)
            os.remove(tmp)
            assert.is_true(ok, tostring(err))
          end
        end)
      end
    end
  end

  it("the fuzzer's npy finding stays an error: a (0, 10^16, 10^4) shape", function()
    local ok, err = pcall(T.load, "tests/fuzz/regressions/npy/shape_strides_overflow.npy")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("is not printable ASCII", 1, true), tostring(err)) -- a NUL in its padding
    assert.has_error(function() T.zeros({ 0, 1e16, 1e4 }) end)
  end)
end)

-- .npy bytes: magic, version, little-endian header length, dict, payload.
local function npy(version, dict, payload, hlen, raw)
  if not raw and dict:sub(-1) == "}" then dict = dict .. "\n" end -- NumPy's terminator
  local n = hlen or #dict
  local len = version == 1 and string.char(n % 256, math.floor(n / 256) % 256)
    or string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256, math.floor(n / 16777216) % 256)
  return "\147NUMPY" .. string.char(version, 0) .. len .. dict .. (payload or "")
end

describe("npy reader on hostile headers", function()
  local D4 = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
  local cases = {
    { "10^15 elements claimed, 8 bytes present", npy(1, D4:format("(1000000000000000,)"), ("\0"):rep(8)), "claims" },
    { "10^15 elements as (10^5, 10^5, 10^5)", npy(1, D4:format("(100000, 100000, 100000)"), ""), "claims" },
    { "shape product overflows int64", npy(1, D4:format("(4294967296, 4294967296, 4294967296)"), ""), "claims" },
    { "a zero dim hiding an overflowing one", npy(1, D4:format("(0, 99999999999999999, 99999)"), ""), "claims" },
    { "dim too long for int64", npy(1, D4:format("(99999999999999999999,)"), ""), "malformed shape" },
    { "header length past the end (v2, 4 GiB)", npy(2, D4:format("(1,)"), "", 0xFFFFFFFF), "header too long" },
    { "header length past the end (v1)", npy(1, D4:format("(1,)"), "", 60000), "truncated inside its header" },
    { "header over 1 MiB (v3)", npy(3, D4:format("(1,)"), "", 2 ^ 20 + 1), "header too long" },
    { "duplicate shape key", npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'shape': (2,), }", ("\0"):rep(8)),
      "duplicate key 'shape'" },
    { "unknown version", "\147NUMPY\9\0\10\0{}", "not supported" },
    { "truncated magic", "\147NUM", "bad magic" },
    { "unterminated string", npy(1, "{'descr': '<f4", ""), "npy header" },
    { "trailing bytes", npy(1, D4:format("(1,)"), ("\0"):rep(5)), "trailing" },
    -- NumPy (ast.literal_eval) refuses NUL bytes; its writer ends the
    -- header with space padding and one newline
    { "a NUL in the padding", npy(1, D4:format("(1,)") .. "  \0\n", ("\0"):rep(4), nil, true), "0x00" },
    { "a NUL inside a key", npy(1, "{'descr\0': '<f4', 'fortran_order': False, 'shape': (1,), }", ("\0"):rep(4)),
      "0x00" },
    { "a non-ASCII byte", npy(1, D4:format("(1,)") .. " \128\n", ("\0"):rep(4), nil, true), "0x80" },
    { "no final newline", npy(1, D4:format("(1,)") .. "   ", ("\0"):rep(4), nil, true), "final newline" },
    { "text after the dict", npy(1, D4:format("(1,)") .. " x\n", ("\0"):rep(4), nil, true), "final newline" },
  }
  for _, c in ipairs(cases) do
    it("rejects " .. c[1], function()
      local p = H.tmpname(".npy")
      H.write_file(p, c[2])
      local ok, err = pcall(T.load, p)
      os.remove(p)
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[3], 1, true), tostring(err))
      assert.truthy(tostring(err):find(p, 1, true), tostring(err))
    end)
  end
end)

describe("npy files that are not regular files", function()
  it("a FIFO fails at once with EIO naming the path (no blocking open or read)", function()
    local dir = H.tmpdir()
    local fifo = dir .. "/pipe.npy"
    assert(os.execute("mkfifo '" .. fifo .. "'") == 0)
    local ok, err = pcall(T.load, fifo)
    assert.is_false(ok)
    assert.equal(require("muon.errors").EIO, err.code)
    assert.truthy(tostring(err):find("'" .. fifo .. "' is not a regular file", 1, true), tostring(err))
    ok, err = pcall(T.load, dir)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("is not a regular file", 1, true), tostring(err))
    -- muon check's params file
    local shapes, msg = require("muon.check").read_shapes(fifo)
    assert.is_nil(shapes)
    assert.truthy(msg:find("'" .. fifo .. "': not a regular file (a FIFO)", 1, true), msg)
    H.rmrf(dir)
  end)

  it("a NumPy-written header (space padding, final newline) loads; saves are atomic and round-trip", function()
    local dir = H.tmpdir()
    local p = dir .. "/x.npy"
    local x = T.from({ { 1, 2, 3 }, { 4, 5, 6 } }, "float64")
    x:save(p)
    local bytes = H.read_file(p)
    assert.equal(0, (#bytes - 48) % 64) -- header padded to 64 bytes
    assert.equal("\n", bytes:sub(10 + bytes:byte(9), 10 + bytes:byte(9)))
    assert.same(x:totable(), T.load(p):totable())
    assert.same({ "x.npy" }, H.listdir(dir)) -- no temporary file left
    H.rmrf(dir)
  end)
end)

describe("checkpoint header mutations (seeded)", function()
  it("every mutation of a real checkpoint loads cleanly or fails cleanly, changing nothing", function()
    local eng = D.make_engine()
    eng:step()
    local src = H.tmpname(".safetensors")
    eng:save(src)
    local bytes = H.read_file(src)
    os.remove(src)
    local n = 0
    for i = 1, 8 do n = n + bytes:byte(i) * 256 ^ (i - 1) end
    local header, data = bytes:sub(9, 8 + n), bytes:sub(9 + n)
    local seed = 12345
    local function rnd(k) -- LCG, deterministic (its high bits: the low ones cycle)
      seed = (seed * 1103515245 + 12345) % 2147483648
      return math.floor(seed / 65536) % k + 1
    end
    local REPL = { "0", "-1", "1e308", "18446744073709551616", "null", "[]", "{}", '""', '"F16"', "[1,2,3]",
      '"x"', "true", "9007199254740993", "0.5", '"\\u0000"' }
    local tmp = H.tmpname(".safetensors")
    local accepted = 0
    for _ = 1, 300 do
      local h = header
      local what = rnd(4)
      if what == 1 then -- replace a number
        local starts = {}
        for s in h:gmatch("()%d+") do starts[#starts + 1] = s end
        local s = starts[rnd(#starts)]
        local e = h:find("%D", s)
        h = h:sub(1, s - 1) .. REPL[rnd(#REPL)] .. h:sub(e)
      elseif what == 2 then -- replace a string
        local starts = {}
        for s in h:gmatch('()"[^"\\]*"') do starts[#starts + 1] = s end
        local s = starts[rnd(#starts)]
        local e = h:find('"', s + 1, true)
        h = h:sub(1, s - 1) .. REPL[rnd(#REPL)] .. h:sub(e + 1)
      elseif what == 3 then -- flip one bit
        local pos = rnd(#h)
        h = h:sub(1, pos - 1) .. string.char(bit.bxor(h:byte(pos), 2 ^ (rnd(8) - 1))) .. h:sub(pos + 1)
      else -- delete a span
        local s = rnd(#h)
        h = h:sub(1, s - 1) .. h:sub(s + rnd(20))
      end
      local len = #h
      local pre = {}
      for i = 1, 8 do
        pre[i] = string.char(len % 256)
        len = math.floor(len / 256)
      end
      H.write_file(tmp, table.concat(pre) .. h .. data)
      local ok, err = pcall(D.safetensors, tmp)
      assert(ok, tostring(err))
      local fresh = D.make_engine()
      if pcall(fresh.load, fresh, tmp) then accepted = accepted + 1 end
    end
    os.remove(tmp)
    -- the engine accepts only harmless mutations (whitespace, muon.format)
    assert.truthy(accepted < 10, ("%d of 300 mutated headers were accepted"):format(accepted))
  end)
end)

describe("config findings", function()
  it("a huge ns_steps is an option error, not an allocation attempt", function()
    local engine = require("muon.engine")
    for _, n in ipairs({ 577777777777, 1e8, 1001 }) do
      local ok, err = pcall(engine.new, { groups = { { optimizer = "muon", ns_steps = n } } })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("ns_steps must be at most 1000", 1, true), tostring(err))
    end
    assert.has_no.errors(function() engine.new({ groups = { { optimizer = "muon", ns_steps = 3 } } }) end)
  end)
end)

-- The tensor view fuzzer (tests/fuzz/tensor_fuzz.lua), short and seeded;
-- make fuzz runs it for FUZZ_SECONDS with fresh seeds.
describe("tensor view fuzzer (seeded)", function()
  local F = require("tensor_fuzz")
  for seed = 1, 3 do
    it("seed " .. seed .. ": every accepted view stays inside its storage, every rejection is an MU_E* object", function()
      local stats = F.run({ seed = seed, iterations = 1500 })
      assert.equal(1500, stats.ops)
      assert.truthy(stats.accepted > 100 and stats.rejected > 100, ("accepted %d, rejected %d"):format(stats.accepted,
        stats.rejected))
    end)
  end

  it("the invariant check catches a view that leaves its storage (the fuzzer can fail)", function()
    local ffi = require("ffi")
    local x = T.zeros({ 4 })
    local v = x:narrow(1, 2, 2)
    local ok = pcall(F.check_view, { { t = x, base = ffi.cast("char *", x.data), nbytes = 16 } }, v, "narrow")
    assert.is_true(ok)
    local bad = ffi.new("mu_tensor", v) -- a copy whose size runs past the end (C never makes one)
    bad.dims[0] = 5
    ok = pcall(F.check_view, { { t = x, base = ffi.cast("char *", x.data), nbytes = 16 } }, bad, "forged")
    assert.is_false(ok)
  end)
end)

describe("tensor arguments that are not integers", function()
  local E = require("muon.errors")
  local x = T.zeros({ 4, 3 })
  local cases = {
    { "narrow start NaN", function() return x:narrow(1, 0 / 0, 1) end, "start must be an integer" },
    { "narrow start 1.5", function() return x:narrow(1, 1.5, 1) end, "start must be an integer" },
    { "narrow length inf", function() return x:narrow(1, 1, 1 / 0) end, "length must be an integer" },
    { "unsqueeze 1.5", function() return x:unsqueeze(1.5) end, "unsqueeze: dim 1.5" },
    { "unsqueeze NaN", function() return x:unsqueeze(0 / 0) end, "unsqueeze: dim nan" },
    { "select index 2^63", function() return x:select(1, 2 ^ 63) end, "out of range" },
    { "transpose dim -inf", function() return x:transpose(-1 / 0, 1) end, "transpose: dim -inf" },
    { "get index 1.5", function() return x:get(1.5, 1) end, "index 1.5 out of range" },
    { "get index 2^53", function() return x:get(2 ^ 53, 1) end, "out of range" },
    { "set index NaN", function() return x:set(1, 0 / 0, 1) end, "index nan out of range" },
    { "view size 2^32 x 2^32 of an empty tensor", function() return T.zeros({ 0 }):view({ 2 ^ 32, 2 ^ 32 }) end,
      "too large" },
    { "view size 0.5", function() return x:view({ 0.5 }) end, "bad shape: size 0.5 in dim 1" },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. c[1] .. " with an EINVAL object naming it", function()
      local ok, err = pcall(c[2])
      assert.is_false(ok)
      assert.is_true(E.is(err), tostring(err))
      assert.equal(E.EINVAL, err.code)
      assert.truthy(tostring(err):find(c[3], 1, true), tostring(err))
    end)
  end
end)
