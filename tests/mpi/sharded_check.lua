-- Sharded checkpoints under mpirun: failures and memory.
--   build/muon run tests/mpi/sharded_check.lua MESH DIR
-- A save that fails on one rank (a NaN in its state) fails every rank and
-- leaves the previous checkpoint whole (its files, and it loads); a second
-- save replaces the first's files; a corrupt, missing, extra or swapped
-- shard and a corrupt index fail the load on every rank naming the file,
-- nothing changed; the save's peak resident growth on each rank stays
-- within its own state plus its largest box (the gathered single-file save
-- exceeds it on rank 0: the measure sees a gather).
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local engine = require("muon.engine")
local read = require("helpers").read_file

local mesh_arg, dir = arg[1], arg[2]
local AXES = H.axes(mesh_arg)

-- AdamW matrices large enough that a gathered state stands out from noise,
-- a small Muon matrix, an AdamW vector.
local PARAMS = {
  { "big.0", { 1024, 512 }, { 1, 2 }, 1 },
  { "big.1", { 1024, 512 }, { 1, 2 }, 1 },
  { "big.2", { 1024, 512 }, { 2, 1 }, 1 },
  { "big.3", { 1024, 512 }, { 1, 2 }, 1 },
  { "w", { 24, 16 }, { 1, 2 }, 2 },
  { "b", { 10 }, { 1 }, 1 },
}

local function kib(field)
  for l in io.lines("/proc/self/status") do
    local v = l:match("^" .. field .. ":%s*(%d+)")
    if v then return tonumber(v) end
  end
end

-- Peak resident growth (bytes) while f runs: the peak reset first.
local function peak_growth(f)
  collectgarbage()
  collectgarbage()
  local cr = assert(io.open("/proc/self/clear_refs", "w"))
  cr:write("5")
  cr:close()
  local before = kib("VmRSS")
  f()
  return (kib("VmHWM") - before) * 1024
end

H.main(function()
  H.init()
  local W, me = H.size, H.rank
  local cfg = H.grouped_config({ { optimizer = "adamw", lr = 1e-3 }, { optimizer = "muon", lr = 0.02 } }, PARAMS, AXES)
  local eng = engine.new(cfg)
  local mesh = D.mesh(AXES, W)
  local locals = {}
  for _, spec in ipairs(PARAMS) do
    local pl = H.placement(AXES, spec)
    local box = D.local_box(spec[2], D.placement(pl, mesh, #spec[2]), mesh, me)
    local value = D.box_view(T.randn(spec[2], H.seed_of(spec[1])), box):clone()
    local grad = T.zeros(box.len)
    pl.shape = spec[2]
    eng:add_param(spec[1], value, grad, pl)
    locals[spec[1]] = { value = value, grad = grad, box = box, spec = spec }
  end
  local function step(n)
    for _, l in pairs(locals) do
      l.grad:copy(D.box_view(T.randn(l.spec[2], H.seed_of(l.spec[1]) + 7 * n), l.box))
    end
    eng:step()
  end
  -- this rank's state and values, copied
  local function snapshot()
    local s = {}
    for name, l in pairs(locals) do
      s[name] = { value = l.value:clone() }
      for k, v in pairs(eng:state(name) or {}) do
        if T.is_tensor(v) then s[name][k] = v:clone() else s[name][k] = v end
      end
    end
    return s
  end
  local function same_state(a)
    for name in pairs(locals) do
      local cur = eng:state(name) or {}
      for k, v in pairs(a[name]) do
        if k ~= "value" then
          local c = cur[k]
          if T.is_tensor(v) then
            if not (c and H.bits_equal(v, c)) then return false, name .. "/" .. k end
          elseif c ~= v then
            return false, name .. "/" .. k
          end
        end
      end
      for k in pairs(cur) do
        if a[name][k] == nil then return false, name .. "/" .. k .. " appeared" end
      end
    end
    return true
  end
  local function sh(cmd)
    if me == 0 then assert(os.execute(cmd) == 0, cmd) end
    H.world:barrier()
  end
  local function listing(d)
    local p = io.popen(("ls -1 %q"):format(d))
    local out = p:read("*a")
    p:close()
    return out
  end

  step(1)
  eng:save(dir, { sharded = true })
  local s1, files1, index1 = snapshot(), listing(dir), read(dir .. "/index.json")
  H.check("one-file-per-rank", select(2, files1:gsub("%.safetensors", "")) == W, files1)
  step(2)

  -- a save that fails on the last rank fails everywhere; the first stays
  local name_nan = W > 1 and "big.3" or "big.0"
  local st = eng:state(name_nan)
  local poisoned = me == W - 1 and st and st.exp_avg:numel() > 0
  local keep
  if poisoned then
    keep = st.exp_avg:get(1, 1)
    st.exp_avg:set(0 / 0, 1, 1)
  end
  local ok, err = pcall(eng.save, eng, dir, { sharded = true })
  if poisoned then st.exp_avg:set(keep, 1, 1) end
  local any = H.world:allreduce({ poisoned and 1 or 0 }, "max")[1] == 1
  H.check("failed-save-fails-every-rank", not any or (not ok and tostring(err):find("NaN", 1, true) ~= nil),
    tostring(err))
  H.check("failed-save-keeps-previous", listing(dir) == files1 and read(dir .. "/index.json") == index1,
    listing(dir))
  local s2 = snapshot()

  -- the previous checkpoint still loads (step 1's state), then the current again
  eng:load(dir)
  H.check("previous-loads", same_state(s1) and eng:get("step") == 1, select(2, same_state(s1)))
  step(2)
  H.check("state-after-reload-and-step", same_state(s2), select(2, same_state(s2)))
  eng:save(dir, { sharded = true })
  local files2 = listing(dir)
  H.check("second-save-replaces-files", select(2, files2:gsub("%.safetensors", "")) == W and files2 ~= files1, files2)

  -- broken copies: each fails on every rank, naming the file, nothing changed
  local names = {}
  for n in files2:gmatch("(rank%-%S+%.safetensors)") do names[#names + 1] = n end
  local function fails(tag, setup, want)
    local d = dir .. "-" .. tag
    sh(("rm -rf %q && cp -r %q %q && %s"):format(d, dir, d, setup(d)))
    local snap = snapshot()
    local okl, errl = pcall(eng.load, eng, d)
    local msg = tostring(errl)
    H.check("load-fails-" .. tag, not okl and msg:find(want, 1, true) ~= nil and same_state(snap)
      and eng:get("step") == 2, msg)
    sh(("rm -rf %q"):format(d))
  end
  local last = names[#names]
  -- a byte of the data section (the header is < 64 KiB; the files are larger but for W = 4's empty ranks)
  local biggest, size = names[1], 0
  for _, n in ipairs(names) do
    local s = #read(dir .. "/" .. n)
    if s > size then biggest, size = n, s end
  end
  fails("corrupt", function(d)
    return ("printf '\\377' | dd of=%q bs=1 seek=%d conv=notrunc 2>/dev/null"):format(d .. "/" .. biggest, size - 3)
  end, biggest)
  fails("missing", function(d) return ("rm %q"):format(d .. "/" .. last) end, last)
  local extra = ("rank-%05d-of-%05d.s9-00000000deadbeef.safetensors"):format(W, W + 1)
  fails("extra", function(d) return ("cp %q %q"):format(d .. "/" .. names[1], d .. "/" .. extra) end, extra)
  fails("index", function(d)
    return ("sed -i 's/\"muon.engine.step\":\"2\"/\"muon.engine.step\":\"3\"/' %q"):format(d .. "/index.json")
  end,
    "index.json")
  if W > 1 then
    fails("swapped", function(d)
      local a, b = d .. "/" .. names[1], d .. "/" .. biggest
      if a == b then b = d .. "/" .. names[2] end
      return ("mv %q %q.t && mv %q %q && mv %q.t %q"):format(a, a, b, a, a, b)
    end, "does not match index.json")
  end

  -- ranks that ask for different formats fail together (no hang), nothing written
  if W > 1 then
    local okd, errd = pcall(eng.save, eng, dir, { sharded = me == 0 })
    H.check("different-formats-fail-every-rank", not okd and tostring(errd):find("not in the same call", 1, true) ~= nil
      and listing(dir) == files2, tostring(errd))
  end

  -- memory: the sharded save allocates nothing of the state's size
  local s3 = snapshot()
  local own = eng:memory().state_bytes
  local box = 0
  for name, l in pairs(locals) do
    for _, v in pairs(eng:state(name) or {}) do
      if T.is_tensor(v) then box = math.max(box, v:numel() * 4) end
    end
    box = math.max(box, H.numel(l.box.len) * 4)
  end
  local grew = peak_growth(function() eng:save(dir, { sharded = true }) end)
  H.check("save-peak-within-own-state-plus-one-box", grew <= own + box,
    ("rank %d: peak growth %d bytes, own state %d, box %d"):format(me, grew, own, box))
  if W > 1 then
    local gathered = peak_growth(function() eng:save(dir .. "/../gathered.safetensors") end)
    H.check("gathered-save-exceeds-the-bound-on-rank-0", me ~= 0 or gathered > own + box,
      ("rank %d: gathered save grew %d bytes (bound %d)"):format(me, gathered, own + box))
    sh(("rm -f %q"):format(dir .. "/../gathered.safetensors"))
  end
  eng:load(dir)
  H.check("reload-bitwise", same_state(s3) and eng:get("step") == 2, select(2, same_state(s3)))
end)
