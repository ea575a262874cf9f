-- Ranks in different collective calls (save on one, step on another; load
-- against step; save against load; the first call of an engine) fail on
-- every rank with one clear message instead of hanging; an argument error
-- on one rank only fails the call everywhere, as do arguments or config
-- keys that differ across ranks, and a missing file on one rank (its own
-- error); after each, the ranks go on together and nothing changed.
--   build/muon run tests/mpi/mismatch_check.lua PATH
local H = require("mpi.harness")
local T = require("muon.tensor")
local E = require("muon.errors")
local engine = require("muon.engine")

local path = arg[1]
H.init()
local W, me = H.size, H.rank

-- dist and top: more keys of the config's dist section and of the config.
local function make(dist, top)
  local cfg = { groups = {
    { optimizer = "muon", match = "^w", lr = 0.02, post_update_fn = function(_, x, ctx) ctx.allreduce(x, "sum") end },
    { optimizer = "adamw", match = "^b", lr = 0.01 } }, dist = { mesh = { { "shard", W } } } }
  for k, v in pairs(dist or {}) do cfg.dist[k] = v end
  for k, v in pairs(top or {}) do cfg[k] = v end
  local eng = engine.new(cfg)
  local rows = 4 * W
  local function part(n, seed)
    return T.randn({ n, 6 }, seed):narrow(1, me * (n / W) + 1, n / W):contiguous()
  end
  eng:add_param("w", part(rows, 1), part(rows, 2), { "S(1)", shape = { rows, 6 } })
  eng:add_param("b", T.randn({ 5 }, 3), T.randn({ 5 }, 4))
  return eng
end

-- Every bit of parameters, grads, state and counters on this rank.
local function snapshot(eng)
  local parts = { tostring(eng:get("step")) }
  for _, name in ipairs({ "w", "b" }) do
    parts[#parts + 1] = table.concat(eng:param(name).value:flat(), ",")
    parts[#parts + 1] = table.concat(eng:param(name).grad:flat(), ",")
    local s = eng:state(name)
    for _, k in ipairs({ "momentum_buffer", "exp_avg", "exp_avg_sq", "step" }) do
      local v = s and s[k]
      if v ~= nil then parts[#parts + 1] = k .. "=" .. (T.is_tensor(v) and table.concat(v:flat(), ",") or tostring(v)) end
    end
  end
  return table.concat(parts, ";")
end

local CALLS = {
  step = function(eng) eng:step() end,
  save = function(eng) eng:save(path) end,
  load = function(eng) eng:load(path) end,
  clip_grad_norm = function(eng) eng:clip_grad_norm(1e9) end,
  reduce_grads = function(eng) eng:reduce_grads() end,
}

-- rank 0 calls a, every other rank b: every rank fails with ESTATE naming
-- both calls; nothing changed; then a step together works.
local function mismatch(eng, a, b, label)
  local before = snapshot(eng)
  local mine, other = me == 0 and a or b, me == 0 and b or a
  local ok, err = pcall(CALLS[mine], eng)
  local msg = not ok and E.message(err) or ""
  H.check(label .. "-fails", not ok and E.name(E.code(err)) == "ESTATE"
    and msg:find("the ranks are not in the same call: rank " .. me .. " called " .. mine
      .. " while another rank called " .. other, 1, true) ~= nil, msg)
  H.check(label .. "-nothing-changed", snapshot(eng) == before)
  local ok2, err2 = pcall(eng.step, eng)
  H.check(label .. "-then-step", ok2, not ok2 and E.message(err2) or nil)
end

H.main(function()
  -- the first call of an engine (before its plan is built)
  local fresh = make()
  mismatch(fresh, "save", "step", "first-call-save-vs-step")
  local eng = make()
  eng:step()
  eng:save(path)
  mismatch(eng, "save", "step", "save-vs-step")
  mismatch(eng, "step", "save", "step-vs-save")
  mismatch(eng, "load", "step", "load-vs-step")
  mismatch(eng, "save", "load", "save-vs-load")
  mismatch(eng, "step", "load", "step-vs-load")
  mismatch(eng, "clip_grad_norm", "step", "clip-vs-step")
  mismatch(eng, "step", "clip_grad_norm", "step-vs-clip")
  mismatch(eng, "save", "clip_grad_norm", "save-vs-clip")
  mismatch(eng, "clip_grad_norm", "reduce_grads", "clip-vs-reduce")
  -- an argument error on the last rank only: every rank fails with its message
  for _, call in ipairs({ "save", "load" }) do
    local before = snapshot(eng)
    local bad = me == W - 1
    local ok, err = pcall(eng[call], eng, bad and 42 or path)
    local msg = not ok and E.message(err) or ""
    H.check(call .. "-bad-path-on-one-rank-fails-everywhere", not ok and E.name(E.code(err)) == "EINVAL"
      and msg:find(("rank %d: %s: path must be a string, got number"):format(W - 1, call), 1, true) ~= nil, msg)
    H.check(call .. "-bad-path-nothing-changed", snapshot(eng) == before)
  end
  do -- a bad max_norm on the last rank only
    local before = snapshot(eng)
    local ok, err = pcall(eng.clip_grad_norm, eng, me == W - 1 and -1 or 1e9)
    local msg = not ok and E.message(err) or ""
    H.check("clip-bad-max-norm-on-one-rank-fails-everywhere", not ok and E.name(E.code(err)) == "EINVAL"
      and msg:find(("rank %d: clip_grad_norm: max_norm must be a finite number >= 0, got -1"):format(W - 1), 1, true)
        ~= nil, msg)
    H.check("clip-bad-max-norm-nothing-changed", snapshot(eng) == before)
  end
  -- a call's arguments that differ on the last rank: every rank fails
  -- before communicating, naming the key and both values; nothing changed
  local last = me == W - 1
  local differ = {
    { "reduce-op", function() eng:reduce_grads({ op = last and "sum" or "mean" }) end,
      "reduce_grads: the arguments differ across ranks at op: rank 0 has 'mean', rank %d has 'sum'" },
    { "clip-max-norm", function() eng:clip_grad_norm(last and 2 or 1) end,
      "clip_grad_norm: the arguments differ across ranks at max_norm: rank 0 has 1, rank %d has 2" },
    { "load-checksum", function() eng:load(path, last and { checksum = false } or nil) end,
      "load: the arguments differ across ranks at checksum: rank 0 has true, rank %d has false" },
    { "load-dtype", function() eng:load(path, last and { dtype = "float64" } or nil) end,
      "load: the arguments differ across ranks at dtype: rank 0 has nil, rank %d has float64" },
  }
  for _, c in ipairs(differ) do
    local before = snapshot(eng)
    local ok, err = pcall(c[2])
    local msg = not ok and E.message(err) or ""
    H.check(c[1] .. "-differs-fails-everywhere", not ok and E.code(err) == E.EINVAL
      and msg:find(c[3]:format(W - 1), 1, true) ~= nil and msg:find("every rank must pass the same", 1, true) ~= nil, msg)
    H.check(c[1] .. "-differs-nothing-changed", snapshot(eng) == before)
  end
  do -- the last rank's file is missing: every rank gives that rank's own error
    local before = snapshot(eng)
    local ok, err = pcall(eng.load, eng, last and path .. ".missing" or path)
    local msg = not ok and E.message(err) or ""
    H.check("load-missing-on-one-rank-gives-its-error", not ok and E.code(err) == E.EIO
      and msg:find(("rank %d: "):format(W - 1), 1, true) ~= nil
      and msg:find("cannot open '" .. path .. ".missing'", 1, true) ~= nil and not msg:find("differ", 1, true), msg)
    H.check("load-missing-nothing-changed", snapshot(eng) == before)
  end
  -- config keys that change what the ranks do together differ on the
  -- last rank: the first step fails on every rank naming both values
  for _, c in ipairs({
    { "check-replicas-off", { check_replicas = last and "off" or "grads" }, nil, "check_replicas: rank 0 has grads, rank %d has off" },
    { "check-replicas-params", { check_replicas = last and "params" or "grads" }, nil,
      "check_replicas: rank 0 has grads, rank %d has params" },
    { "hook-budget", nil, { hook_budget = last and { seconds = 5 } or nil }, "hook_budget: rank 0 has nil, rank %d has" },
  }) do
    local e = make(c[2], c[3])
    local ok, err = pcall(e.step, e)
    local msg = not ok and E.message(err) or ""
    H.check(c[1] .. "-config-differs-fails-everywhere", not ok and E.code(err) == E.EINVAL
      and msg:find("configs differ across ranks at " .. c[4]:format(W - 1), 1, true) ~= nil, msg)
    H.check(c[1] .. "-config-differs-nothing-changed", e:get("step") == 0)
  end
  do -- a ctx kept by post_update_fn, called from a later pre_ortho_fn (on
    -- the owner of w alone): that rank fails, so the step fails everywhere
    local kept
    local k = engine.new({ groups = {
      { optimizer = "muon", match = "^w", lr = 0.02, post_update_fn = function(_, x, ctx)
        kept = kept or ctx
        ctx.allreduce(x, "sum")
      end, pre_ortho_fn = function(G) if kept then kept.allreduce(G, "sum") end end },
      { optimizer = "adamw", match = "^b", lr = 0.01 } }, dist = { mesh = { { "shard", W } } } })
    local rows = 4 * W
    k:add_param("w", T.randn({ rows, 6 }, 1):narrow(1, me * 4 + 1, 4):contiguous(),
      T.randn({ rows, 6 }, 2):narrow(1, me * 4 + 1, 4):contiguous(), { "S(1)", shape = { rows, 6 } })
    k:add_param("b", T.randn({ 5 }, 3), T.randn({ 5 }, 4))
    k:step()
    local before = snapshot(k)
    local ok, err = pcall(k.step, k)
    local msg = not ok and E.message(err) or ""
    H.check("kept-ctx-fails-everywhere", not ok and msg:find("ctx.allreduce called outside the hook call", 1, true)
      ~= nil, msg)
    H.check("kept-ctx-nothing-changed", snapshot(k) == before)
  end
  local ok, err = pcall(eng.step, eng)
  H.check("steps-after-all", ok, not ok and E.message(err) or nil)
  if me == 0 then os.remove(path) end
end)
