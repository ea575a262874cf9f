-- bfloat16 tensors: conversions bit for bit against torch 1.13 (fixtures made
-- once by tests/fixtures/bf16/make.py: random values over many scales, exact
-- and near ties, subnormals, overflow, Inf and NaNs), exact widening, and a
-- storage dtype's limits (the maths refuse it, with a message).
local ffi = require("ffi")
local H = require("helpers")
local T = H.T

local DIR = "tests/fixtures/bf16/"

-- The fixture's inputs (as a tensor of dtype) and torch's bfloat16 bits.
local function fixture(name, dtype, width)
  local f = assert(io.open(DIR .. name, "rb"))
  local data = f:read("*a")
  f:close()
  local n = #data / (width + 2)
  local x = T.zeros({ n }, dtype)
  ffi.copy(x.data, data, n * width)
  local want = ffi.new("uint16_t[?]", n)
  ffi.copy(want, data:sub(n * width + 1), n * 2)
  return x, want, n
end

local function bits_of(x)
  return ffi.cast("uint16_t *", x.data)
end

local function assert_bits(got, want, n, inputs, what)
  local bad = 0
  for i = 0, n - 1 do
    if got[i] ~= want[i] then
      bad = bad + 1
      if bad <= 3 then print(("%s: input %d (0x%s): got 0x%04x, torch 0x%04x"):format(what, i,
          bit.tohex(inputs[i]), got[i], want[i])) end
    end
  end
  assert.are.equal(0, bad, what .. ": elements differing from torch")
end

describe("bfloat16 conversions", function()
  for _, case in ipairs({ { "f32.bin", "float32", 4, "uint32_t *" }, { "f64.bin", "float64", 8, "uint32_t *" } }) do
    local file, dt, width = case[1], case[2], case[3]
    it(dt .. " -> bfloat16 equals torch bit for bit (clone, copy, set)", function()
      local x, want, n = fixture(file, dt, width)
      assert.is_true(n > 3000)
      local hi = ffi.cast("uint32_t *", x.data) -- the inputs' upper words, for messages
      local view = {}
      for i = 0, n - 1 do view[i] = width == 4 and hi[i] or hi[2 * i + 1] end
      assert_bits(bits_of(x:clone("bfloat16")), want, n, view, dt .. " clone")
      local y = T.zeros({ n }, "bfloat16")
      y:copy(x)
      assert_bits(bits_of(y), want, n, view, dt .. " copy")
      -- strided source and destination
      local xs, ys = T.zeros({ n, 2 }, dt), T.zeros({ n, 2 }, "bfloat16")
      xs:narrow(2, 2, 1):copy(x:view({ n, 1 }))
      ys:narrow(2, 1, 1):copy(xs:narrow(2, 2, 1))
      local yc = ys:narrow(2, 1, 1):contiguous()
      assert_bits(bits_of(yc), want, n, view, dt .. " strided copy")
      if dt == "float64" then -- set takes a double
        local z = T.zeros({ n }, "bfloat16")
        local p = x:ptr()
        for i = 0, n - 1 do
          if p[i] == p[i] then z:set(p[i], i + 1) else z:set(0 / 0, i + 1) end
        end
        for i = 0, n - 1 do if p[i] ~= p[i] then bits_of(z)[i] = want[i] end end -- (Lua NaNs lose their bits)
        assert_bits(bits_of(z), want, n, view, "set")
      end
    end)
  end

  it("rounds to nearest even, keeps subnormals and sends NaN to a NaN (hand-written cases)", function()
    local cases = { -- float32 bits -> bfloat16 bits
      { 0x3f808000, 0x3f80 }, { 0x3f818000, 0x3f82 }, { 0x3f808001, 0x3f81 }, { 0x3f807fff, 0x3f80 },
      { 0x00000001, 0x0000 }, { 0x00008000, 0x0000 }, { 0x00018000, 0x0002 }, { 0x807fffff, 0x8080 },
      { 0x7f7fffff, 0x7f80 }, { 0xff800000, 0xff80 }, { 0x7fc00000, 0xffff }, { 0xff800001, 0xffff },
    }
    local x = T.zeros({ #cases })
    local u = ffi.cast("uint32_t *", x.data)
    for i, c in ipairs(cases) do u[i - 1] = c[1] end
    local b = bits_of(x:clone("bfloat16"))
    for i, c in ipairs(cases) do
      assert.are.equal(c[2], b[i - 1], ("0x%08x"):format(c[1]))
    end
  end)

  it("widens exactly: every bfloat16 pattern is the upper half of its float32, the same value in float64", function()
    local b = T.zeros({ 65536 }, "bfloat16")
    local p = bits_of(b)
    for i = 0, 65535 do p[i] = i end
    local f, d = b:clone("float32"), b:clone("float64")
    local fu, dp, fp = ffi.cast("uint32_t *", f.data), d:ptr(), f:ptr()
    for i = 0, 65535 do
      assert(fu[i] == i * 65536, i)
      local exp = bit.band(i, 0x7f80)
      if not (exp == 0x7f80 and bit.band(i, 0x7f) ~= 0) then assert(dp[i] == fp[i], i) end
    end
    -- and back: bfloat16 -> float32 -> bfloat16 is the identity but for NaNs (0xffff)
    local back = bits_of(f:clone("bfloat16"))
    for i = 0, 65535 do
      local nan = bit.band(i, 0x7f80) == 0x7f80 and bit.band(i, 0x7f) ~= 0
      assert(back[i] == (nan and 0xffff or i), i)
    end
  end)
end)

describe("bfloat16 tensors", function()
  it("are made, filled, read and reduced", function()
    local b = T.zeros({ 2, 3 }, "bfloat16")
    assert.are.equal("bfloat16", b:dtype())
    b:fill(1.7) -- 1.703125 in bfloat16
    assert.are.same({ { 1.703125, 1.703125, 1.703125 }, { 1.703125, 1.703125, 1.703125 } }, b:totable())
    b:set(-3, 2, 3)
    assert.are.equal(-3, b:get(2, 3))
    assert.are.equal(math.sqrt(5 * 1.703125 ^ 2 + 9), b:norm())
    assert.is_true((b:all_finite()))
    b:set(1 / 0, 1, 2)
    assert.is_false((b:all_finite()))
    b:set(0 / 0, 1, 1)
    local v = b:flat()[1]
    assert.is_true(v ~= v, "a NaN reads as a Lua NaN")
    assert.is_true(b:get(1, 1) ~= b:get(1, 1))
    assert.are.same({ float32 = 4, float64 = 8, bfloat16 = 2 }, T.DTYPE_SIZES)
  end)

  it("are refused by the maths and by .npy, naming the dtype", function()
    local b = T.zeros({ 2, 2 }, "bfloat16")
    for _, f in ipairs({ function() return b:add(1) end, function() return b:sum(1) end,
                         function() return b:matmul(b) end }) do
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("bfloat16, a storage dtype", 1, true), tostring(err))
    end
    local ok, err = pcall(b.save, b, os.tmpname())
    assert.is_false(ok)
    assert.truthy(tostring(err):find(".npy has no bfloat16 type", 1, true), tostring(err))
    ok, err = pcall(T.zeros, { 2 }, "bf16")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("'bfloat16'", 1, true), tostring(err))
  end)
end)

describe("foreach with bfloat16 state", function()
  -- State arrays (momentum's bufs, AdamW's moments) may be bfloat16 beside
  -- float32 parameters and gradients: loaded exactly, computed in float32,
  -- rounded once on store. So the float32 kernel run on the widened state
  -- gives the same updates and parameters bit for bit, and its new state
  -- rounded to bfloat16 is the bfloat16 kernel's; the results are within
  -- bfloat16 rounding of a float64 reference, and the same for every kernel
  -- variant, tail and thread split.
  local F = require("muon.foreach")
  local SIZES = { 1, 7, 16, 17, 33, 100, 1000 }
  local function list(seed, dtype, scale)
    local out = {}
    for i, n in ipairs(SIZES) do
      local t = T.randn({ n }, seed * 100 + i)
      if scale then t = t:mul(scale) end
      out[i] = t:clone(dtype or "float32")
    end
    return out
  end
  local function widen(l) return H.clones(l, "float32") end
  local clones = H.clones
  local function same_list(a, b, what)
    for i = 1, #a do H.assert_equal_bits(a[i], b[i], what .. " " .. i) end
  end
  local function rounded(l) return H.clones(l, "bfloat16") end
  -- |got - want| <= rel * |want| + abs, element by element
  local function near(got, want, rel, abs, what)
    for i = 1, #got do
      local g, w = got[i]:flat(), want[i]
      for k = 1, #g do
        local d = math.abs(g[k] - w[k])
        if d > rel * math.abs(w[k]) + abs then
          error(("%s %d[%d]: got %.9g, float64 %.9g"):format(what, i, k, g[k], w[k]))
        end
      end
    end
  end
  local U = 2 ^ -24 -- float32 unit roundoff; bfloat16's is 2^-8

  it("momentum: the float32 kernel's bits on the widened state, rounded once", function()
    for _, nest in ipairs({ false, true }) do
      local g, b = list(1), list(2, "bfloat16")
      local u, nb = list(3), list(4, "bfloat16")
      F.momentum(g, b, nb, u, 0.95, 0.9, nest)
      local b32, u32, nb32 = widen(b), list(3), list(4)
      F.momentum(g, b32, nb32, u32, 0.95, 0.9, nest)
      same_list(u, u32, "updates")
      same_list(nb, rounded(nb32), "new_bufs")
      -- float64 reference from the bfloat16 inputs
      local wu, wb = {}, {}
      for i = 1, #g do
        local gv, bv = g[i]:flat(), b[i]:flat()
        wu[i], wb[i] = {}, {}
        for k = 1, #gv do
          local uu = gv[k] + 0.95 * bv[k]
          wb[i][k] = 0.9 * bv[k] + gv[k]
          if nest then uu = 0.95 * uu + gv[k] end
          wu[i][k] = uu
        end
      end
      near(u, wu, 8 * U, 8 * U * 4, "momentum u")
      near(nb, wb, 2 ^ -8, 8 * U * 4, "momentum buf")
      -- in place
      local bi = clones(b)
      F.momentum(g, bi, nil, list(3), 0.95, 0.9, nest)
      same_list(bi, nb, "in place")
    end
  end)

  it("adamw and adamw_update: the float32 kernel's bits on the widened moments, rounded once", function()
    local o = { lr = 1e-2, betas = { 0.9, 0.99 }, eps = 1e-8, weight_decay = 0.1, step = 3 }
    local p, g = list(5), list(6)
    local m = list(7, "bfloat16", 0.1)
    local v = list(8, "bfloat16")
    for i = 1, #v do v[i] = v[i]:clone("float32"):mul(v[i]:clone("float32")):mul(0.01):clone("bfloat16") end
    local p32, m32, v32 = clones(p), widen(m), widen(v)
    local mb, vb = clones(m), clones(v)
    F.adamw(p, g, mb, vb, o)
    F.adamw(p32, g, m32, v32, o)
    same_list(p, p32, "params")
    same_list(mb, rounded(m32), "exp_avgs")
    same_list(vb, rounded(v32), "exp_avg_sqs")
    -- the update path, new moments apart and in place
    local nm, nv, u = list(9, "bfloat16"), list(9, "bfloat16"), list(9)
    F.adamw_update(g, m, v, nm, nv, u, o)
    local u32, nm32, nv32 = list(9), list(9), list(9)
    F.adamw_update(g, widen(m), widen(v), nm32, nv32, u32, o)
    same_list(u, u32, "update")
    same_list(nm, mb, "exp_avgs (update)")
    same_list(nv, vb, "exp_avg_sqs (update)")
    -- float64 reference (torch's AdamW formulas) from the bfloat16 moments
    local bc1, bc2 = 1 - 0.9 ^ 3, 1 - 0.99 ^ 3
    local wm, wv, wu = {}, {}, {}
    for i = 1, #g do
      local gv, mv, vv = g[i]:flat(), m[i]:flat(), v[i]:flat()
      wm[i], wv[i], wu[i] = {}, {}, {}
      for k = 1, #gv do
        wm[i][k] = 0.9 * mv[k] + 0.1 * gv[k]
        wv[i][k] = 0.99 * vv[k] + 0.01 * gv[k] ^ 2
        wu[i][k] = -(1e-2 / bc1) * wm[i][k] / (math.sqrt(wv[i][k]) / math.sqrt(bc2) + 1e-8)
      end
    end
    near(nm, wm, 2 ^ -8, 16 * U, "exp_avg")
    near(nv, wv, 2 ^ -8, 16 * U * 0.05, "exp_avg_sq")
    near(u, wu, 1e-5, 1e-8, "update")
  end)

  it("lion_update: the float32 kernel's bits on the widened moment, rounded once", function()
    local g, m = list(11), list(12, "bfloat16", 0.1)
    local nm, u = list(13, "bfloat16"), list(13)
    F.lion_update(g, m, nm, u, 0.9, 0.99)
    local nm32, u32 = list(13), list(13)
    F.lion_update(g, widen(m), nm32, u32, 0.9, 0.99)
    same_list(u, u32, "updates")
    same_list(nm, rounded(nm32), "new exp_avgs")
    local wm, wu = {}, {}
    for i = 1, #g do
      local gv, mv = g[i]:flat(), m[i]:flat()
      wm[i], wu[i] = {}, {}
      for k = 1, #gv do
        local c = 0.9 * mv[k] + 0.1 * gv[k]
        wu[i][k] = c > 0 and 1 or c < 0 and -1 or 0
        wm[i][k] = 0.99 * mv[k] + 0.01 * gv[k]
      end
    end
    near(u, wu, 0, 0, "lion sign")
    near(nm, wm, 2 ^ -8, 16 * U, "lion moment")
    local mi = clones(m)
    F.lion_update(g, mi, mi, list(13), 0.9, 0.99)
    same_list(mi, nm, "in place")
  end)

  it("rounds state on store as torch, in every kernel variant (ties, subnormals, Inf, NaN)", function()
    pcall(ffi.cdef, "int setenv(const char *, const char *, int);")
    local g, want, n = fixture("f32.bin", "float32", 4)
    local gu = ffi.cast("uint32_t *", g.data)
    for _, isa in ipairs({ "portable", "avx2", "avx512", "" }) do
      ffi.C.setenv("MU_FOREACH_SIMD", isa, 1)
      local b, nb, u = T.zeros({ n }, "bfloat16"), T.zeros({ n }, "bfloat16"), T.zeros({ n })
      F.momentum({ g }, { b }, { nb }, { u }, 0.5, 0.5, false) -- buf' = 0 * 0.5 + g: g, rounded on store
      ffi.C.setenv("MU_FOREACH_SIMD", "", 1)
      local got = bits_of(nb)
      for i = 0, n - 1 do
        local w = gu[i] == 0x80000000 and 0 or want[i] -- (0 + -0 is +0)
        if got[i] ~= w then
          error(("%s: input 0x%08x: stored 0x%04x, torch 0x%04x"):format(isa, gu[i], got[i], w))
        end
      end
    end
  end)

  it("all_finite reads bfloat16 tensors, in every kernel variant", function()
    pcall(ffi.cdef, "int setenv(const char *, const char *, int);")
    for _, isa in ipairs({ "portable", "avx2", "avx512", "" }) do
      ffi.C.setenv("MU_FOREACH_SIMD", isa, 1)
      local b = list(10, "bfloat16")
      assert.are.same({ true }, { F.all_finite(b) })
      b[6]:set(1 / 0, 37)
      assert.are.same({ false, 6 }, { F.all_finite(b) })
      b[6]:set(0, 37)
      b[7]:set(0 / 0, 1000)
      assert.are.same({ false, 7 }, { F.all_finite(b) })
      b[7]:set(0, 1000)
      b[5]:set(-1 / 0, 3)
      assert.are.same({ false, 5 }, { F.all_finite(b) })
      ffi.C.setenv("MU_FOREACH_SIMD", "", 1)
    end
  end)

  it("gives the same bits in every kernel variant and thread split", function()
    pcall(ffi.cdef, "int setenv(const char *, const char *, int);")
    local function run()
      local g, b, u = list(1), list(2, "bfloat16"), list(3)
      F.momentum(g, b, nil, u, 0.9, 0.8, true)
      local p, m, v = list(4), list(5, "bfloat16", 0.1), list(6, "bfloat16", 0)
      F.adamw(p, g, m, v, { lr = 1e-2, betas = { 0.3, 0.99 }, step = 1 })
      local lm, lu = list(7, "bfloat16", 0.1), list(8)
      F.lion_update(g, lm, lm, lu, 0.9, 0.99)
      return { b, u, p, m, v, lm, lu }
    end
    local ref = run()
    for _, env in ipairs({ { "MU_FOREACH_SIMD", "portable" }, { "MU_FOREACH_SIMD", "avx2" },
                           { "MU_FOREACH_SIMD", "avx512" }, { "MU_FOREACH_MT_MIN", "64" } }) do
      ffi.C.setenv(env[1], env[2], 1)
      if env[1] == "MU_FOREACH_MT_MIN" then ffi.C.setenv("MU_FOREACH_THREADS", "3", 1) end
      local got = run()
      ffi.C.setenv(env[1], "", 1)
      ffi.C.setenv("MU_FOREACH_THREADS", "", 1)
      for k = 1, #ref do same_list(got[k], ref[k], env[1] .. "=" .. env[2] .. " result " .. k) end
    end
  end)

  it("refuses bfloat16 where it is not state, and beside float64, naming the array", function()
    local g, b, u = list(1), list(2, "bfloat16"), list(3)
    local cases = {
      { function() F.momentum(rounded(g), b, nil, u, 0.9, 0.9, false) end, "grads[1] is bfloat16" },
      { function() F.momentum(g, b, nil, rounded(u), 0.9, 0.9, false) end, "updates[0] has dtype bfloat16, expected float32" },
      { function() F.apply(rounded(g), rounded(u), nil, 1, 1) end, "params[0] has unsupported dtype bfloat16" },
      { function()
        local g64 = {}
        for i, t in ipairs(g) do g64[i] = t:clone("float64") end
        F.momentum(g64, b, nil, g64, 0.9, 0.9, false)
      end, "bufs[1] is bfloat16 but grads[1] is float64" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)
end)

describe("bfloat16 and other dtypes in files", function()
  local st = require("muon.safetensors")
  local TORCH = DIR .. "torch.safetensors" -- written from torch's bytes by make.py

  it("safetensors from torch: BF16 loads as bfloat16, the rest only when a dtype is asked for", function()
    local ok, err = pcall(st.load, TORCH, { checksum = false })
    assert.is_false(ok)
    assert.truthy(tostring(err):find(("safetensors '%s': tensor 'f16' is F16, which muon does not store: "
      .. "load(path, { dtype = \"float32\" }) converts it"):format(TORCH), 1, true), tostring(err))
    local h = st.inspect(TORCH)
    local by = {}
    for _, e in ipairs(h.entries) do by[e.name] = e end
    assert.are.equal("bfloat16", by.bf16.dtype)
    assert.are.equal("I16", by.i16.st_dtype)
  end)

  it("converts BF16, F16, integer and BOOL tensors to float64 exactly as torch, to float32 and bfloat16 rounded", function()
    local f64 = st.load(TORCH, { dtype = "float64" }).tensors
    local names = { "bf16", "f16", "i8", "u8", "i16", "i32", "i64", "bool", "f32" }
    for _, n in ipairs(names) do
      H.assert_equal_bits(f64[n], f64[n .. ".f64"], n .. " as float64")
    end
    local f32 = st.load(TORCH, { dtype = "float32" }).tensors
    local b16 = st.load(TORCH, { dtype = "bfloat16" }).tensors
    for _, n in ipairs(names) do
      if n ~= "i64" then -- (an int64 rounds once to float32; through float64 it may round twice)
        H.assert_equal_bits(f32[n], f64[n .. ".f64"]:clone("float32"), n .. " as float32")
        H.assert_equal_bits(b16[n], f64[n .. ".f64"]:clone("float32"):clone("bfloat16"), n .. " as bfloat16")
      end
    end
    H.assert_close(f32.i64, f64["i64.f64"], 2 ^ -23 * 4e17, "i64 as float32")
    local raw = st.load(TORCH, { dtype = "bfloat16" }).tensors.bf16 -- BF16 read as it is
    H.assert_equal_bits(raw:clone("float64"), f64["bf16.f64"], "bf16 bits")
  end)

  it("saves bfloat16 tensors as BF16 and reads them back bit for bit, checksum included", function()
    local b = T.randn({ 3, 17 }, 5):clone("bfloat16")
    local path = H.tmpname(".safetensors")
    st.save(path, { { name = "m", tensor = b }, { name = "w", tensor = T.randn({ 4 }, 6) } })
    local h = st.inspect(path)
    assert.are.equal("BF16", h.entries[1].st_dtype)
    assert.are.same({ 0, 3 * 17 * 2 }, h.entries[1].offsets)
    local back = st.load(path).tensors
    assert.are.equal("bfloat16", back.m:dtype())
    local p, q = ffi.cast("uint16_t *", b.data), ffi.cast("uint16_t *", back.m.data)
    for i = 0, b:numel() - 1 do assert(p[i] == q[i], i) end
    -- converted on load: the checksum is the file's, so it still verifies
    local f = st.load(path, { dtype = "float32" }).tensors
    H.assert_equal_bits(f.m, b:clone("float32"), "m as float32")
    -- and torch reads it (when /usr/bin/python3 has torch)
    local py = "/usr/bin/python3"
    if os.execute(py .. " -c 'import torch' >/dev/null 2>&1") == 0 then
      local out = io.popen(py .. [==[ -c "
import json, struct, sys, torch
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
e = h['m']; d = b[8 + n + e['data_offsets'][0]:8 + n + e['data_offsets'][1]]
t = torch.frombuffer(bytearray(d), dtype=torch.bfloat16).reshape(e['shape'])
print(e['dtype'], e['shape'], ' '.join(repr(v) for v in t.flatten().tolist()))" ]==] .. path):read("*a")
      assert.are.equal("BF16 [3, 17] ", out:sub(1, 13))
      local got = {}
      for v in out:sub(14):gmatch("%S+") do got[#got + 1] = tonumber(v) end
      assert.are.same(b:flat(), got)
    end
    os.remove(path)
  end)

  it("T.load reads .npy float16, integer and boolean data on request, refuses it otherwise", function()
    local function npy(descr, shape, payload)
      local dict = ("{'descr': '%s', 'fortran_order': False, 'shape': %s, }"):format(descr, shape)
      local total = 10 + #dict + 1
      local header = dict .. string.rep(" ", (64 - total % 64) % 64) .. "\n"
      local path = H.tmpname(".npy")
      H.write_file(path, "\147NUMPY\1\0" .. string.char(#header % 256, math.floor(#header / 256)) .. header .. payload)
      return path
    end
    local cases = {
      { "<i2", "(3,)", "\1\0\255\255\0\128", { 1, -1, -32768 } },
      { "|u1", "(2,)", "\7\255", { 7, 255 } },
      { "<f2", "(4,)", "\0\60\0\188\1\0\0\124", { 1, -1, 2 ^ -24, 1 / 0 } },
      { "|b1", "(2,)", "\0\1", { 0, 1 } },
      { "<i8", "(1,)", "\1\0\0\0\0\0\32\0", { 2 ^ 53 + 1 } },
    }
    for _, c in ipairs(cases) do
      local path = npy(c[1], c[2], c[3])
      local ok, err = pcall(T.load, path)
      assert.is_false(ok)
      assert.truthy(tostring(err):find(path, 1, true), tostring(err))
      assert.truthy(tostring(err):find(("npy dtype '%s'"):format(c[1]), 1, true), tostring(err))
      assert.are.same(c[4], T.load(path, { dtype = "float64" }):flat())
      assert.are.equal("float32", T.load(path, { dtype = "float32" }):dtype())
      os.remove(path)
    end
    local ok, err = pcall(T.load, "x.npy", { dtyp = "float32" })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("dtype", 1, true))
  end)
end)
