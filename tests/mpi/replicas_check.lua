-- Gradient reduction and replica checks under mpirun (tests/mpi/replicas.sh):
--   reduce   MESH: after eng:reduce_grads({ op = "mean" }) each rank's own
--            gradients give parameters bitwise equal to a one-process run
--            given, per box, the mean of its replicas' gradients computed
--            in rank order ((g_0 + g_1 + ...) / n); "sum" likewise; the bytes
--            show in comm_stats; a grad missing on one rank fails everywhere.
--   replicas MESH: check_replicas = "grads" fails a run with unreduced
--            gradients on every rank, naming the parameter and the ranks,
--            and passes after reduce_grads; "params" passes a healthy run
--            and names a parameter a hook changed on one rank.
--   load     MESH DIR: ranks loading different checkpoint files fail the
--            load on every rank; the same file loads.
local H = require("mpi.harness")
local T = require("muon.tensor")
local D = require("muon.dist")
local E = require("muon.errors")
local engine = require("muon.engine")

local mode, mesh_arg, dir = arg[1], arg[2], arg[3]

local bits_equal = H.bits_equal

H.main(function()
  local w = H.init()
  local me, W = H.rank, H.size
  local axes = {}
  for name, n in mesh_arg:gmatch("(%a+):(%d+)") do axes[#axes + 1] = { name, tonumber(n) } end
  local mesh = D.mesh(axes, W)
  local SHAPES = { { "l.w1", { 12, 8 } }, { "l.w2", { 8, 6 } }, { "l.w3", { 5, 7 } }, { "bias", { 10 } } }
  local function placement(shape)
    local pl = {}
    for a, ax in ipairs(mesh.axes) do pl[a] = ax.name:match("^shard") and "S(1)" or "R" end
    return D.placement(pl, mesh, #shape), pl
  end
  local function config(dist, extra)
    local c = { groups = { { optimizer = "muon", match = "^l%.", lr = 0.02, weight_decay = 0.1 },
      { optimizer = "adamw", match = ".*", lr = 1e-2 } } }
    if dist then
      c.dist = { mesh = axes }
      for k, v in pairs(extra or {}) do c.dist[k] = v end
    end
    return c
  end
  local function setup(extra)
    local eng, ref = engine.new(config(true, extra)), engine.new(H.alone(config(false)))
    local l = {}
    for i, s in ipairs(SHAPES) do
      local name, shape = s[1], s[2]
      local pl, spec = placement(shape)
      local box = D.local_box(shape, pl, mesh, me)
      local full = T.randn(shape, i)
      local v = D.box_view(full, box):clone()
      local g = T.zeros(box.len)
      local sp = { shape = shape }
      for a = 1, #spec do sp[a] = spec[a] end
      eng:add_param(name, v, g, sp)
      local rg = T.zeros(shape)
      ref:add_param(name, full:clone(), rg)
      l[i] = { name = name, shape = shape, pl = pl, box = box, v = v, g = g, rg = rg, ref_v = ref:param(name).value }
    end
    return eng, ref, l
  end
  -- Rank q's own gradient of parameter i at step t (a global tensor; each
  -- rank passes its box).
  local function grad_of(q, i, t, shape) return T.randn(shape, 10000 * t + 100 * i + q) end
  -- The reference gradient: per box, the replicas' gradients in rank order.
  local function ref_grad(x, i, t, op)
    for q = 0, W - 1 do
      local b = D.local_box(x.shape, x.pl, mesh, q)
      local first = true
      for q2 = 0, W - 1 do
        local b2 = D.local_box(x.shape, x.pl, mesh, q2)
        if table.concat(b2.start, ",") == table.concat(b.start, ",") and table.concat(b2.len, ",") == table.concat(b.len, ",") then
          if q2 < q then first = false end
        end
      end
      if first and D.numel(b.len) > 0 then -- the lowest rank of the box computes it
        local acc, n = nil, 0
        for q2 = 0, W - 1 do
          local b2 = D.local_box(x.shape, x.pl, mesh, q2)
          if table.concat(b2.start, ",") == table.concat(b.start, ",") and table.concat(b2.len, ",") == table.concat(b.len, ",") then
            local g = D.box_view(grad_of(q2, i, t, x.shape), b):clone()
            if acc then acc:add_(g) else acc = g end
            n = n + 1
          end
        end
        if op == "mean" then acc:div_(n) end
        D.box_view(x.rg, b):copy(acc)
      end
    end
  end
  local function set_own(l, t)
    for i, x in ipairs(l) do
      if x.g:numel() > 0 then x.g:copy(D.box_view(grad_of(me, i, t, x.shape), x.box)) end
    end
  end
  if mode == "reduce" then
    for _, op in ipairs({ "mean", "sum" }) do
      local eng, ref, l = setup()
      local ok_all, first = true, nil
      local before = eng:comm_stats().data
      for t = 1, 4 do
        set_own(l, t)
        eng:reduce_grads({ op = op })
        for i, x in ipairs(l) do ref_grad(x, i, t, op) end
        -- the reduced grads equal the reference's box, on every replica
        for _, x in ipairs(l) do
          local ok, why = bits_equal(x.g, D.box_view(x.rg, x.box))
          if not ok then ok_all, first = false, first or ("grad " .. x.name .. " step " .. t .. ": " .. why) end
        end
        eng:step()
        ref:step()
        for _, x in ipairs(l) do
          local ok, why = bits_equal(x.v, D.box_view(x.ref_v, x.box))
          if not ok then ok_all, first = false, first or ("param " .. x.name .. " step " .. t .. ": " .. why) end
        end
      end
      H.check("reduce-" .. op .. "-bitwise", ok_all, first)
      local after = eng:comm_stats().data
      H.check("reduce-" .. op .. "-bytes-counted", after.bytes_sent > before.bytes_sent and after.bytes_recv > before.bytes_recv,
        ("%d -> %d"):format(before.bytes_sent, after.bytes_sent))
    end
    -- A grad missing on the last rank (it holds elements of every parameter).
    local eng, _, l = setup()
    set_own(l, 1)
    local keep = {}
    for _, x in ipairs(l) do keep[#keep + 1] = x.g:clone() end
    if me == W - 1 then eng:param("l.w2").grad = nil end
    local ok, err = pcall(eng.reduce_grads, eng, { op = "mean" })
    local msg = tostring(err)
    H.check("reduce-missing-grad-fails-everywhere", not ok and E.code(err) == E.EINVAL
      and msg:find("parameter 'l.w2' has no grad on rank " .. (W - 1), 1, true) ~= nil, msg)
    local same = true
    for i, x in ipairs(l) do if not bits_equal(x.g, keep[i]) then same = false end end
    H.check("reduce-missing-grad-changes-nothing", same)
    local okb, errb = pcall(eng.reduce_grads, eng, { op = "max" })
    H.check("reduce-bad-op", not okb and tostring(errb):find("op must be 'mean' or 'sum', got max", 1, true) ~= nil, tostring(errb))
    -- rank 0 saves while the others reduce: every rank fails, none hangs
    local okg, errg
    if me == 0 then okg, errg = pcall(eng.save, eng, os.tmpname())
    else okg, errg = pcall(eng.reduce_grads, eng, { op = "mean" }) end
    H.check("reduce-against-save-fails-everywhere", not okg and tostring(errg):find("the ranks are not in the same call", 1, true) ~= nil,
      tostring(errg))
  end
  if mode == "replicas" then
    local eng, _, l = setup({ check_replicas = "grads" })
    set_own(l, 1)
    local before = {}
    for i, x in ipairs(l) do before[i] = x.v:clone() end
    local ok, err = pcall(eng.step, eng)
    local msg = tostring(err)
    -- l.w1's boxes are replicated over the replicate axis: every replica
    -- group differs (each rank has its own data)
    H.check("grads-unreduced-fails-everywhere", not ok and E.code(err) == E.EINVAL
      and msg:find("check_replicas: parameter 'l.w1': its gradients differ across replicas of the same box (ranks 0, 1", 1, true) ~= nil
      and msg:find("reduce_grads", 1, true) ~= nil, msg)
    local same = true
    for i, x in ipairs(l) do if not bits_equal(x.v, before[i]) then same = false end end
    H.check("grads-unreduced-changes-nothing", same and eng:get("step") == 0)
    eng:reduce_grads({ op = "mean" })
    local ok2, err2 = pcall(eng.step, eng)
    H.check("grads-reduced-steps", ok2 and eng:get("step") == 1, tostring(err2))
    -- "params": a healthy run passes; a replica whose value drifted fails
    -- on every rank, naming it.
    local e2, _, l2 = setup({ check_replicas = "params" })
    local okp = true
    for t = 1, 2 do
      set_own(l2, t)
      e2:reduce_grads()
      local o, e = pcall(e2.step, e2)
      okp = okp and o
      if not o then H.check("params-healthy", false, tostring(e)) end
    end
    H.check("params-healthy", okp)
    if me == W - 1 then l2[2].v:fill(0.5) end -- drift on one replica of l.w2's box
    set_own(l2, 3)
    e2:reduce_grads()
    local before2 = {}
    for i, x in ipairs(l2) do before2[i] = x.v:clone() end
    local o3, e3 = pcall(e2.step, e2)
    local m3 = tostring(e3)
    local same2 = true
    for i, x in ipairs(l2) do if not bits_equal(x.v, before2[i]) then same2 = false end end
    H.check("params-drift-changes-nothing", same2 and e2:get("step") == 2)
    H.check("params-drift-fails-everywhere", not o3 and m3:find("parameter 'l.w2': its values differ across replicas", 1, true) ~= nil
      and m3:find("ranks ", 1, true) ~= nil and m3:find(tostring(W - 1), 1, true) ~= nil, m3)
    local off, eoff = pcall(engine.new, config(true, { check_replicas = "yes" }))
    H.check("check-replicas-bad-value", not off and tostring(eoff):find("check_replicas must be 'off', 'grads' or 'params', got yes", 1, true) ~= nil,
      tostring(eoff))
  end
  if mode == "load" then
    local eng, _, l = setup()
    for t = 1, 2 do
      set_own(l, t)
      eng:reduce_grads()
      eng:step()
    end
    eng:save(dir .. "/a.safetensors")
    set_own(l, 3)
    eng:reduce_grads()
    eng:step()
    eng:save(dir .. "/b.safetensors")
    local e2 = setup()
    local ok, err = pcall(e2.load, e2, dir .. (me == 0 and "/a.safetensors" or "/b.safetensors"))
    local msg = tostring(err)
    H.check("load-different-files-fails-everywhere", not ok and E.code(err) == E.EINVAL
      and msg:find("checkpoints loaded from", 1, true) ~= nil and msg:find("differ across ranks at step: rank 0 has 2", 1, true) ~= nil
      and msg:find("every rank must load the same file", 1, true) ~= nil, msg)
    H.check("load-different-files-changes-nothing", e2:get("step") == 0)
    local ok2, err2 = pcall(e2.load, e2, dir .. "/b.safetensors")
    H.check("load-same-file", ok2 and e2:get("step") == 3, tostring(err2))
  end
  w:barrier()
end)
