-- Faults at the engine level: full or read-only disk on save, a process
-- killed mid-save, truncated or bit-flipped checkpoints, NaN/Inf gradients
-- with per-group policies. Each guarantee is checked on the engine's state
-- (parameters, optimizer state, step counters), not only on the file.
package.path = "tests/fuzz/?.lua;" .. package.path
local ffi = require("ffi")
local H = require("helpers")
local T = H.T
local D = require("driver")
local engine = require("muon.engine")

local tmpdir, rmrf, listdir = H.tmpdir, H.rmrf, H.listdir

-- An engine stepped `steps` times from fixed gradients.
local function stepped_engine(steps, big)
  local eng = D.make_engine()
  if big then
    eng:add_param("big", T.randn({ 512, 512 }, 77), T.randn({ 512, 512 }, 78))
  end
  for _ = 1, steps do eng:step() end
  return eng
end

-- Run fn(dir) on a small tmpfs (root only); pending otherwise.
local function with_tmpfs(size, fn)
  local dir = tmpdir()
  if os.execute("mount -t tmpfs -o size=" .. size .. " tmpfs '" .. dir .. "' 2>/dev/null") ~= 0 then
    rmrf(dir)
    pending("cannot mount a tmpfs here (needs root)")
    return
  end
  local ok, err = pcall(fn, dir)
  os.execute("umount '" .. dir .. "' 2>/dev/null")
  rmrf(dir)
  assert(ok, err)
end

describe("engine checkpoint save under faults", function()
  it("disk full: save fails naming the file, the previous checkpoint loads unchanged", function()
    with_tmpfs("64k", function(dir)
      local path = dir .. "/opt.safetensors"
      local eng = stepped_engine(1)
      eng:save(path) -- small: fits
      local want = D.snapshot(eng, true)
      local before = H.read_file(path)
      local big = stepped_engine(2, true) -- 1 MiB of momentum: no room
      local ok, err = pcall(big.save, big, path)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("cannot save '" .. path .. "'", 1, true), tostring(err))
      assert.truthy(tostring(err):find("No space left on device", 1, true), tostring(err))
      assert.equal(before, H.read_file(path))
      assert.same({ "opt.safetensors" }, listdir(dir)) -- no temporary file left
      local fresh = D.make_engine()
      fresh:load(path)
      assert.equal(want, D.snapshot(fresh, true))
    end)
  end)

  it("read-only directory: save fails naming the file, the previous checkpoint loads unchanged", function()
    with_tmpfs("1m", function(dir)
      local path = dir .. "/opt.safetensors"
      local eng = stepped_engine(1)
      eng:save(path)
      local want = D.snapshot(eng, true)
      local before = H.read_file(path)
      assert(os.execute("mount -o remount,ro '" .. dir .. "'") == 0)
      eng:step()
      local ok, err = pcall(eng.save, eng, path)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("cannot save '" .. path .. "'", 1, true), tostring(err))
      assert.truthy(tostring(err):find("Read-only file system", 1, true), tostring(err))
      assert.equal(before, H.read_file(path))
      local fresh = D.make_engine()
      fresh:load(path)
      assert.equal(want, D.snapshot(fresh, true))
    end)
  end)

  it("killed mid-save: the previous checkpoint is intact and loads into the engine", function()
    local dir = tmpdir()
    local path = dir .. "/opt.safetensors"
    local a, b = stepped_engine(1, true), stepped_engine(2, true)
    local snaps = { [D.snapshot(a, true)] = true, [D.snapshot(b, true)] = true }
    a:save(path)
    local torn, round = 0, 0
    while round < 20 and (round < 3 or torn < 1) do
      round = round + 1
      local pid = ffi.C.fork()
      assert(pid >= 0, "fork failed")
      if pid == 0 then
        pcall(function()
          for i = 1, 40 do ((i % 2 == 1) and b or a):save(path) end
        end)
        ffi.C._exit(0)
      end
      H.kill_when_exists(pid, function() return H.dir_has(dir, ".tmp.") end)
      local fresh = stepped_engine(0, true)
      fresh:load(path) -- checksums verified: a torn file would fail here
      assert.truthy(snaps[D.snapshot(fresh, true)], "loaded state is neither checkpoint")
      for _, e in ipairs(listdir(dir)) do
        if e:find(".tmp.", 1, true) then torn = torn + 1 end
      end
      os.execute("rm -f '" .. path .. "'.tmp.*")
    end
    rmrf(dir)
    assert.truthy(torn >= 1, "no kill landed in the middle of a save")
  end)
end)

describe("corrupted checkpoints", function()
  local good, path
  local function write(bytes)
    path = H.tmpname(".safetensors")
    H.write_file(path, bytes)
    return path
  end
  setup(function()
    local eng = stepped_engine(2)
    local p = H.tmpname(".safetensors")
    eng:save(p)
    good = H.read_file(p)
    os.remove(p)
  end)

  local function header_len(bytes)
    local n = 0
    for i = 1, 8 do n = n + bytes:byte(i) * 256 ^ (i - 1) end
    return n
  end
  local function flip(bytes, pos, bitn)
    return bytes:sub(1, pos - 1) .. string.char(bit.bxor(bytes:byte(pos), bit.lshift(1, bitn))) .. bytes:sub(pos + 1)
  end

  -- Each case: the file bytes and a phrase the error must contain.
  local function cases()
    local n = header_len(good)
    local hdr = good:sub(9, 8 + n)
    local step_at = 8 + hdr:find('"muon.engine.step":"2"', 1, true) + #'"muon.engine.step":"'
    local shape_at = 8 + hdr:find('"shape":[4,3]', 1, true) + #'"shape":['
    return {
      { "empty file", "", "too short" },
      { "truncated in the length field", good:sub(1, 5), "too short" },
      { "truncated in the header", good:sub(1, 8 + math.floor(n / 2)), "truncated" },
      { "truncated in the data", good:sub(1, #good - 13), "truncated" },
      { "last byte missing", good:sub(1, #good - 1), "truncated" },
      { "bit flip in the data", flip(good, 8 + n + 7, 3), "checksum mismatch" },
      { "bit flip in the last data byte", flip(good, #good, 0), "checksum mismatch" },
      { "step count changed in the metadata", good:sub(1, step_at - 1) .. "7" .. good:sub(step_at + 1),
        "metadata checksum mismatch" },
      { "shape changed in the tensor header", good:sub(1, shape_at - 1) .. "3" .. good:sub(shape_at + 1),
        "needs" },
      { "bit flip in the length field", flip(good, 2, 5), "larger than the file" },
      { "appended bytes", good .. "\0\0\0\0", "trailing bytes" },
    }
  end

  it("each fails with a clear error naming the file and changes nothing", function()
    for _, c in ipairs(cases()) do
      local eng = stepped_engine(3)
      local before = D.snapshot(eng)
      local p = write(c[2])
      local ok, err = pcall(eng.load, eng, p)
      os.remove(p)
      assert.is_false(ok, c[1] .. " was accepted")
      err = tostring(err)
      assert.truthy(err:find(p, 1, true), c[1] .. ": error does not name the file: " .. err)
      assert.truthy(err:find(c[3], 1, true), c[1] .. ": " .. err)
      assert.equal(before, D.snapshot(eng), c[1] .. ": a failed load changed the engine")
      -- and the engine still steps exactly like one that never saw the file
      local ref = stepped_engine(3)
      eng:step()
      ref:step()
      assert.equal(D.snapshot(ref), D.snapshot(eng), c[1])
    end
  end)

  it("the good file loads (the cases above differ from it only by the corruption)", function()
    local eng = stepped_engine(0)
    local p = write(good)
    eng:load(p)
    os.remove(p)
    assert.equal(D.snapshot(stepped_engine(2), true), D.snapshot(eng, true))
  end)

  it("a Muon optimizer's own load also rejects a bit flip and keeps its state", function()
    local muon = H.muon
    local w, g = T.randn({ 6, 4 }, 1), T.randn({ 6, 4 }, 2)
    local opt = muon.optim.Muon({ muon.param("w", w, g) })
    opt:step()
    local p = H.tmpname(".safetensors")
    opt:save(p)
    local bytes = H.read_file(p)
    H.write_file(p, flip(bytes, #bytes - 5, 6))
    local buf = opt.state[opt:params()[1]].momentum_buffer:flat()
    local ok, err = pcall(opt.load, opt, p)
    os.remove(p)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("checksum mismatch", 1, true), tostring(err))
    assert.same(buf, opt.state[opt:params()[1]].momentum_buffer:flat())
  end)
end)

describe("NaN/Inf gradients: per-group policy through a config", function()
  local config = H.config_file
  local CFG = [[
    return { groups = {
      { name = "skipper", optimizer = "muon", match = "^s", lr = 0.02, weight_decay = 0, nonfinite = "skip" },
      { name = "strict", optimizer = "muon", match = "^m", lr = 0.02, weight_decay = 0 },
      { name = "adam", optimizer = "adamw", lr = 1e-2, weight_decay = 0, nonfinite = "skip" },
    } }
  ]]
  local function build()
    local path = config(CFG)
    local eng = engine.new(path)
    os.remove(path)
    local ps = {}
    for i, spec in ipairs({ { "s.w", { 4, 3 } }, { "m.w", { 3, 5 } }, { "bias", { 3 } } }) do
      ps[spec[1]] = { w = T.randn(spec[2], i), g = T.randn(spec[2], 10 + i) }
      eng:add_param(spec[1], ps[spec[1]].w, ps[spec[1]].g)
    end
    return eng, ps
  end

  it("'skip' skips only that group's step and counts it; the others step as usual", function()
    local eng, ps = build()
    local ref, rps = build()
    local s0 = ps["s.w"].w:flat()
    ps["s.w"].g:set(0 / 0, 2, 2)
    ps["bias"].g:set(math.huge, 1)
    eng:step()
    ref:step()
    assert.same(s0, ps["s.w"].w:flat()) -- skipped: unchanged
    H.assert_equal_bits(rps["m.w"].w, ps["m.w"].w, "m.w stepped like the reference")
    local st = eng:stats()
    assert.equal(1, st.muon.skipped_nonfinite)
    assert.equal(1, st.adamw.skipped_nonfinite)
    assert.equal(1, st.steps)
    assert.equal(0, ref:stats().muon.skipped_nonfinite)
    -- a later finite step proceeds for every group
    ps["s.w"].g:copy(rps["s.w"].g)
    ps["bias"].g:copy(rps["bias"].g)
    eng:step()
    assert.is_false(H.max_abs_diff(s0, ps["s.w"].w) == 0)
    assert.equal(1, eng:stats().muon.skipped_nonfinite)
  end)

  it("'error' (the default) fails atomically naming the parameter", function()
    local eng, ps = build()
    eng:step()
    local before = D.snapshot(eng)
    local st0 = eng:stats()
    ps["m.w"].g:set(-math.huge, 3, 1)
    local ok, err = pcall(eng.step, eng)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("parameter 'm.w': gradient holds NaN or Inf", 1, true), tostring(err))
    assert.equal(before, D.snapshot(eng)) -- every group unchanged, skip groups included
    assert.same(st0, eng:stats())
  end)
end)
