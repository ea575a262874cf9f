-- Sharded checkpoints in one process (the mesh cases: tests/mpi/sharded_ckpt.sh):
-- the directory and its index, a resume bitwise equal to an uninterrupted
-- run, the single-file format beside it, and every broken directory
-- failing with nothing changed, naming the file.
local T = require("muon.tensor")
local engine = require("muon.engine")
local cjson = require("cjson")
local H = require("helpers")

local function model(eng, seed)
  return {
    eng:add_param("embed.weight", T.randn({ 10, 4 }, seed + 1), T.randn({ 10, 4 }, seed + 2)),
    eng:add_param("hidden.0.weight", T.randn({ 8, 4 }, seed + 3), T.randn({ 8, 4 }, seed + 4)),
    eng:add_param("hidden.1.weight", T.randn({ 6, 5 }, seed + 9), T.randn({ 6, 5 }, seed + 10)),
    eng:add_param("hidden.0.bias", T.randn({ 8 }, seed + 5), T.randn({ 8 }, seed + 6)),
    eng:add_param("head.weight", T.randn({ 3, 8 }, seed + 7), T.randn({ 3, 8 }, seed + 8)),
  }
end

-- An engine at step n (grads fixed), and its parameters.
local function trained(n)
  local eng = engine.new("configs/muon.lua")
  local ps = model(eng, 40)
  for _ = 1, n do eng:step() end
  return eng, ps
end

local function shards(dir)
  local out = {}
  for _, n in ipairs(H.listdir(dir)) do
    if n:match("%.safetensors$") then out[#out + 1] = n end
  end
  return out
end

-- Every state tensor and step count of eng, copied.
local function state_of(eng, ps)
  local s = {}
  for _, p in ipairs(ps) do
    s[p.name] = {}
    for k, v in pairs(eng:state(p.name) or {}) do s[p.name][k] = T.is_tensor(v) and v:clone() or v end
  end
  return s
end

local function assert_state(eng, ps, want)
  for _, p in ipairs(ps) do
    local cur = eng:state(p.name) or {}
    for k, v in pairs(want[p.name]) do
      if T.is_tensor(v) then H.assert_equal_bits(cur[k], v, p.name .. "/" .. k)
      else assert.equal(v, cur[k], p.name .. "/" .. k) end
    end
    for k in pairs(cur) do assert.not_nil(want[p.name][k], p.name .. "/" .. k) end
  end
end

describe("sharded checkpoints", function()
  local dir
  before_each(function() dir = H.tmpdir() .. "/ckpt" end)
  after_each(function() H.rmrf(dir:gsub("/ckpt$", "")) end)

  it("write one file and an index that describes it; a load resumes bitwise", function()
    local a, pa = trained(3)
    a:save(dir, { sharded = true })
    local files = shards(dir)
    assert.equal(1, #files)
    assert.truthy(files[1]:match("^rank%-00000%-of%-00001%.s3%-%x+%.safetensors$"), files[1])
    local idx = cjson.decode(H.read_file(dir .. "/index.json"))
    assert.equal("muon.sharded", idx.format)
    assert.equal(1, idx.world)
    assert.equal(files[1], idx.files[1].name)
    assert.equal("3", idx.metadata["muon.engine.step"])
    -- every state tensor: its full shape, one box covering it in file 1
    local t = idx.tensors["muon/hidden.1.weight/momentum_buffer"]
    assert.same({ 6, 5 }, t.shape)
    assert.same({ { file = 1, start = { 0, 0 }, len = { 6, 5 } } }, t.boxes)
    assert.not_nil(idx.tensors["adamw/embed.weight/exp_avg_sq"])
    -- the file's data checksum is the index's
    local f = require("muon.safetensors").open(dir .. "/" .. files[1])
    assert.equal(idx.files[1].checksum, f.checksum())
    f.close()

    local b = engine.new("configs/muon.lua")
    local pb = model(b, 999)
    for i = 1, #pa do pb[i].value:copy(pa[i].value) pb[i].grad:copy(pa[i].grad) end
    b:load(dir)
    assert.equal(3, b:get("step"))
    assert_state(b, pb, state_of(a, pa))
    for _ = 1, 2 do
      a:step()
      b:step()
    end
    for i = 1, #pa do H.assert_equal_bits(pa[i].value, pb[i].value, pa[i].name) end
  end)

  it("keep hook state (NorMuon's) by its key, and load it back bitwise", function()
    local function normuon(seed)
      local e = engine.new("configs/normuon.lua")
      return e, model(e, seed)
    end
    local a, pa = normuon(40)
    for _ = 1, 3 do a:step() end
    a:save(dir, { sharded = true })
    local idx = cjson.decode(H.read_file(dir .. "/index.json"))
    local hooks = 0
    for name in pairs(idx.tensors) do
      if name:match("/hook%.") then hooks = hooks + 1 end
    end
    assert.is_true(hooks > 0, "the index lists hook state")
    local b, pb = normuon(999)
    for i = 1, #pa do pb[i].value:copy(pa[i].value) pb[i].grad:copy(pa[i].grad) end
    b:load(dir)
    assert_state(b, pb, state_of(a, pa))
    a:step()
    b:step()
    for i = 1, #pa do H.assert_equal_bits(pa[i].value, pb[i].value, pa[i].name) end
  end)

  it("replace the previous save's files; a save that fails keeps the previous checkpoint whole", function()
    local a, pa = trained(1)
    a:save(dir, { sharded = true })
    local first, index1 = shards(dir), H.read_file(dir .. "/index.json")
    local s1 = state_of(a, pa)
    a:step()
    -- a NaN in the state: nothing written, the first checkpoint stays
    local m = a:state("hidden.0.weight").momentum_buffer
    local keep = m:get(1, 1)
    m:set(0 / 0, 1, 1)
    local ok, err = pcall(a.save, a, dir, { sharded = true })
    m:set(keep, 1, 1)
    assert.is_false(ok)
    H.has(err, "state tensor 'muon/hidden.0.weight/momentum_buffer' holds NaN or Inf")
    assert.same(first, shards(dir))
    assert.equal(index1, H.read_file(dir .. "/index.json"))
    local s2 = state_of(a, pa)
    a:load(dir)
    assert.equal(1, a:get("step"))
    assert_state(a, pa, s1)
    a:load(dir) -- (twice: the same)
    a:step()
    assert_state(a, pa, s2)
    a:save(dir, { sharded = true })
    local second = shards(dir)
    assert.equal(1, #second)
    assert.are_not.equal(first[1], second[1])
  end)

  it("tell a file from a directory; the single-file format stays", function()
    local a, pa = trained(2)
    local file = dir .. ".safetensors"
    a:save(file)
    a:save(dir, { sharded = true })
    local s = state_of(a, pa)
    a:step()
    a:load(file)
    assert_state(a, pa, s)
    a:step()
    a:load(dir)
    assert_state(a, pa, s)
    os.remove(file)
    -- a directory without an index
    local empty = dir .. "-empty"
    os.execute("mkdir '" .. empty .. "'")
    local ok, err = pcall(a.load, a, empty)
    os.execute("rmdir '" .. empty .. "'")
    assert.is_false(ok)
    H.has(err, "is a directory but not a sharded checkpoint")
    H.has(err, "index.json")
    -- the options
    ok, err = pcall(a.save, a, dir, { shraded = true })
    H.has(err, "unknown option 'shraded'")
    ok, err = pcall(a.save, a, dir, { sharded = 1 })
    H.has(err, "sharded must be a boolean")
    ok, err = pcall(a.save, a, file, { sharded = true })
    assert.is_true(ok, err)
    H.write_file(file .. "x", "")
    ok, err = pcall(a.save, a, file .. "x", { sharded = true })
    os.remove(file .. "x")
    H.rmrf(file)
    assert.is_false(ok)
    H.has(err, "exists and is not a directory")
  end)

  it("refuse a corrupt, missing, extra or mismatched shard and a corrupt index, naming it, nothing changed", function()
    local a, pa = trained(2)
    a:save(dir, { sharded = true })
    local other = dir .. "-other"
    a:step()
    a:save(other, { sharded = true }) -- another save: the same names but its tag
    local name = shards(dir)[1]
    local path = dir .. "/" .. name
    local good = H.read_file(path)
    local index = H.read_file(dir .. "/index.json")
    local function restore()
      H.rmrf(dir)
      os.execute("mkdir '" .. dir .. "'")
      H.write_file(path, good)
      H.write_file(dir .. "/index.json", index)
    end
    local cases = {
      { "corrupt data", function() H.write_file(path, good:sub(1, -5) .. "\1\2\3\4") end, path .. "' is corrupted" },
      { "missing", function() os.remove(path) end, path .. "' (listed in index.json) cannot be read" },
      { "extra", function() H.write_file(dir .. "/rank-00001-of-00002.s2-0123456789abcdef.safetensors", good) end,
        "rank-00001-of-00002.s2-0123456789abcdef.safetensors' is not listed in index.json" },
      { "another save's", function() H.write_file(path, H.read_file(other .. "/" .. shards(other)[1])) end,
        path .. "' is corrupted" },
      { "truncated", function() H.write_file(path, good:sub(1, 100)) end, path },
      { "index edited", function() H.write_file(dir .. "/index.json", (index:gsub('"muon.engine.step":"2"',
        '"muon.engine.step":"1"'))) end, "index.json': checksum mismatch" },
      { "index not JSON", function() H.write_file(dir .. "/index.json", "{") end, "index.json' is malformed" },
    }
    local s = state_of(a, pa)
    local values = {}
    for i, p in ipairs(pa) do values[i] = p.value:clone() end
    for _, c in ipairs(cases) do
      restore()
      c[2]()
      local ok, err = pcall(a.load, a, dir)
      assert.is_false(ok, c[1])
      H.has(err, c[3])
      assert.equal(3, a:get("step"), c[1])
      assert_state(a, pa, s)
      for i, p in ipairs(pa) do H.assert_equal_bits(p.value, values[i], c[1]) end
    end
    -- without checksums an edited index is read, and what it says is checked against the files
    restore()
    local idx = cjson.decode(index)
    idx.tensors["muon/hidden.1.weight/momentum_buffer"].boxes[1].len = { 6, 4 }
    H.write_file(dir .. "/index.json", require("muon.checkpoint").canonical_json(idx))
    local ok, err = pcall(a.load, a, dir, { checksum = false })
    assert.is_false(ok)
    H.has(err, path .. "' does not match index.json: tensor 'muon/hidden.1.weight/momentum_buffer' is float32 (6, 5), "
      .. "the index says float32 (6, 4)")
    assert_state(a, pa, s)
    restore()
    a:load(dir)
    assert.equal(2, a:get("step"))
    H.rmrf(other)
  end)
end)
