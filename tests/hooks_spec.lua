-- The hooks for research variants (issue 20): pre_ortho_fn with square hook
-- state, reductions inside hooks (ctx.allreduce, ctx.global_norm), hooks
-- whose result would be ignored, and the three shipped variants
-- (configs/adamuon.lua, configs/newton_muon.lua, configs/muonh.lua), each
-- over a 10-step trajectory against an independent double-precision
-- reference (tests/ref_variants.lua): float64 to 1e-10, float32 to 3e-5.
-- Their bitwise equality over meshes of 1-4 ranks: tests/mpi/hooks_check.lua.
local H = require("helpers")
local T = H.T or H.muon.tensor
local V = require("ref_variants")
local engine = require("muon.engine")
local E = require("muon.errors")
local Rd = require("muon.reduce")

local TOL = { float32 = 3e-5, float64 = 1e-10 }

-- Symmetric positive semi-definite n x n (row-major list and rows) from a seed.
local function second_moment(n, seed)
  local Z = T.randn({ n, 2 * n }, seed, "float64")
  local S = Z:mm(Z:transpose(1, 2)):div(2 * n)
  local list, rows = S:flat(), {}
  for i = 1, n do
    rows[i] = {}
    for j = 1, n do rows[i][j] = list[(i - 1) * n + j] end
  end
  return list, rows
end

local function warm(base, step) return base * step / 20 end

-- 10 steps of an engine beside the reference (H.trajectory); specs:
-- { name, shape }. before(step, refs) runs before each step (signals);
-- ref(step, list) steps the reference.
local function trajectory(eng, specs, dtype, ref, before, init)
  return H.trajectory(eng, specs, dtype, TOL[dtype], function(step, _, list) ref(step, list) end, before, init)
end

local SPECS = { { "layers.0.w", { 8, 6 } }, { "layers.1.w", { 5, 9 } }, { "experts", { 3, 6, 4 } } }

-- The MuonH radius of configs/muonh.lua: sqrt(every dim but the last).
local function radius(shape)
  local r = 1
  for d = 1, #shape - 1 do r = r * shape[d] end
  return math.sqrt(r)
end

for _, dtype in ipairs({ "float32", "float64" }) do
  describe("the shipped variants (" .. dtype .. ") against a double-precision reference, 10 steps:", function()
    it("AdaMuon, configs/adamuon.lua (pre_ortho_fn sign + post_ortho_fn second moment)", function()
      local eng = engine.new("configs/adamuon.lua")
      local hooks = V.adamuon_hooks(0.95, 1e-8)
      trajectory(eng, SPECS, dtype, function(step, list)
        V.hooked_step(list, { lr = warm(0.02, step), weight_decay = 0.1, scale = 1 }, hooks)
      end)
      assert.are.same({ 3, 6, 4 }, eng:state("experts")["hook.v"]:size())
    end)

    it("Newton-Muon, configs/newton_muon.lua (pre_ortho_fn, cols_cols state, signals)", function()
      local eng = engine.new("configs/newton_muon.lua")
      local hooks = V.newton_muon_hooks(0.95, 0.1, 1e-12)
      trajectory(eng, SPECS, dtype, function(step, list)
        V.hooked_step(list, { lr = warm(0.02, step), weight_decay = 0.1 }, hooks)
      end, function(step, refs)
        for i, s in ipairs(SPECS) do
          local cols = s[2][#s[2]]
          local flat, rows = second_moment(cols, 77 * step + i)
          eng:set_signal("zz." .. s[1], flat)
          refs[s[1]].zz = rows
        end
      end)
      -- the square state: cols x cols per core matrix
      assert.are.same({ 9, 9 }, eng:state("layers.1.w")["hook.K"]:size())
      assert.are.same({ 3, 4, 4 }, eng:state("experts")["hook.K"]:size())
    end)

    it("MuonH, configs/muonh.lua (post_ortho_fn and post_update_fn with ctx.global_norm)", function()
      local eng = engine.new("configs/muonh.lua")
      local hooks = V.muonh_hooks(radius, 1e-8)
      local ps = trajectory(eng, SPECS, dtype, function(step, list)
        V.hooked_step(list, { lr = warm(0.02, step), weight_decay = 0, scale = 1 }, hooks)
      end, nil, function(w, s) w:mul_(radius(s[2]) / w:norm()) end)
      for _, s in ipairs(SPECS) do
        assert.is_true(math.abs(ps[s[1]].w:norm() - radius(s[2])) < 1e-5 * radius(s[2]), s[1])
      end
    end)
  end)
end

describe("pre_ortho_fn and square hook state", function()
  it("pre_ortho_fn sees the Newton-Schulz input and the state post_ortho_fn sees next", function()
    local seen = {}
    local eng = engine.new({ groups = { { optimizer = "muon", nesterov = false, momentum = 0,
      hook_state = { L = "rows_rows", R = "cols_cols" },
      pre_ortho_fn = function(G, state, ctx)
        seen.G = G:clone()
        seen.sizes = { state.L:size(), state.R:size() }
        state.L:add_(1)
        seen.ctx = ctx
      end,
      post_ortho_fn = function(_, state) seen.L = state.L:clone() end } } })
    local w, g = T.randn({ 5, 3 }, 1), T.randn({ 5, 3 }, 2)
    eng:add_param("w", w, g)
    eng:step()
    -- momentum 0, no nesterov: the input is the gradient, as (1, rows, cols)
    H.assert_equal_bits(seen.G:view({ 5, 3 }), g, "pre_ortho_fn's G")
    assert.are.same({ { 1, 5, 5 }, { 1, 3, 3 } }, seen.sizes)
    H.assert_equal_bits(seen.L, T.full({ 1, 5, 5 }, 1), "post_ortho_fn sees pre_ortho_fn's state")
    assert.are.same({ 5, 5 }, eng:state("w")["hook.L"]:size())
    assert.are.same({ 3, 3 }, eng:state("w")["hook.R"]:size())
    assert.equal("w", seen.ctx.param_fqn)
    assert.equal(1, seen.ctx.step)
  end)

  it("square rules on N-D parameters keep the batch dims, in both nd_modes", function()
    local kind = require("muon.optim.muon").kind
    local g = { hook_state = { L = "rows_rows", R = "cols_cols" }, _hook_keys = { "L", "R" }, nd_mode = "batch" }
    local shapes = kind.hook_shapes(g, { 2, 3, 5, 4 })
    assert.are.same({ 2, 3, 5, 5 }, shapes[1].shape)
    assert.are.same({ 2, 3, 4, 4 }, shapes[2].shape)
    g.nd_mode = "flatten" -- one 4 x 60 matrix: rows x rows and 60 x 60 (in the first dim and the rest)
    shapes = kind.hook_shapes(g, { 4, 3, 5, 4 })
    assert.are.same({ 4, 4, 1, 1 }, shapes[1].shape)
    assert.are.same({ 60, 3, 5, 4 }, shapes[2].shape)
    shapes = kind.hook_shapes(g, { 6, 1, 5 }) -- one 6 x 5 matrix
    assert.are.same({ 6, 6, 1 }, shapes[1].shape)
    assert.are.same({ 5, 1, 5 }, shapes[2].shape)
    g.nd_mode = "batch"
    shapes = kind.hook_shapes(g, { 6, 1, 5 }) -- conv-like (A, 1, B)
    assert.are.same({ 6, 1, 6 }, shapes[1].shape)
    assert.are.same({ 5, 1, 5 }, shapes[2].shape)
  end)

  it("a square rule on a sharded dim of another size goes whole to coordinate 0 of its axes", function()
    local D = require("muon.dist")
    local mesh = D.mesh({ { "shard", 4 } }, 4)
    local pl = D.placement({ "S(2)" }, mesh, 2)
    -- parameter 8 x 2 sharded on its cols (1, 1, 0, 0): the rows x rows state has 8 cols
    for q = 0, 3 do
      local b = D.hook_box({ 8, 8 }, { 8, 2 }, pl, mesh, q)
      assert.are.same(q == 0 and { 8, 8 } or { 8, 0 }, b.len, "rank " .. q)
    end
    -- cols x cols (2 x 2) of an (8, 2) parameter sharded on its rows: rank 0's
    pl = D.placement({ "S(1)" }, mesh, 2)
    for q = 0, 3 do
      assert.are.same(q == 0 and { 2, 2 } or { 0, 2 }, D.hook_box({ 2, 2 }, { 8, 2 }, pl, mesh, q).len)
    end
  end)

  it("pre-NS state survives save/load bitwise; a resumed run equals an uninterrupted one bitwise", function()
    local function build()
      local eng = engine.new("configs/newton_muon.lua")
      local ps = {}
      for i, s in ipairs(SPECS) do
        ps[i] = { w = T.randn(s[2], i), g = T.zeros(s[2]) }
        eng:add_param(s[1], ps[i].w, ps[i].g)
      end
      return eng, ps
    end
    local function step(eng, ps, k)
      for i, s in ipairs(SPECS) do
        ps[i].g:copy(T.randn(s[2], 100 * k + i))
        eng:set_signal("zz." .. s[1], (second_moment(s[2][#s[2]], 31 * k + i)))
      end
      eng:step()
    end
    local a, pa = build()
    for k = 1, 3 do step(a, pa, k) end
    local path = H.tmpname(".safetensors")
    a:save(path)
    local b, pb = build()
    for i in ipairs(pa) do pb[i].w:copy(pa[i].w) end
    b:load(path)
    os.remove(path)
    for _, s in ipairs(SPECS) do
      H.assert_equal_bits(a:state(s[1])["hook.K"], b:state(s[1])["hook.K"], "loaded " .. s[1])
    end
    -- a failed step changes no pre-NS state
    local K = a:state("experts")["hook.K"]:clone()
    pa[1].g:set(0 / 0, 1, 1)
    assert.is_false(pcall(a.step, a))
    H.assert_equal_bits(K, a:state("experts")["hook.K"], "state after a failed step")
    for k = 4, 6 do step(a, pa, k); step(b, pb, k) end
    for i, s in ipairs(SPECS) do
      H.assert_equal_bits(pa[i].w, pb[i].w, s[1])
      H.assert_equal_bits(a:state(s[1])["hook.K"], b:state(s[1])["hook.K"], s[1] .. " state")
    end
  end)

  it("pre_ortho_fn and post_ortho_fn refuse hooks that reshape, and a non-finite G names the hook", function()
    local ok, err = pcall(engine.new, { groups = { { pre_ortho_fn = function() end, reshape_fn = function() end } } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("pre_ortho_fn cannot be combined with reshape_fn or ns_transform_fn", 1, true))
    local eng = engine.new({ groups = { { pre_ortho_fn = function(G) G:fill_(0 / 0) end } } })
    local w = T.randn({ 4, 3 }, 1)
    local before = w:clone()
    eng:add_param("w", w, T.randn({ 4, 3 }, 2))
    ok, err = pcall(eng.step, eng)
    assert.is_false(ok)
    assert.equal(E.ENONFINITE, E.code(err))
    assert.truthy(tostring(err):find("parameter 'w': pre_ortho_fn left NaN or Inf", 1, true), tostring(err))
    H.assert_equal_bits(before, w, "nothing changed")
  end)
end)

describe("hooks whose result would be ignored", function()
  for _, c in ipairs({
    { "post_ortho_fn", function(O) return O:mul(2) end, "post_ortho_fn returned a tensor, which would be ignored: it changes O in place" },
    { "pre_ortho_fn", function() return 1 end, "pre_ortho_fn returned a number, which would be ignored: it changes G in place" },
    { "post_update_fn", function(_, w) return w:clone() end, "post_update_fn returned a tensor, which would be ignored" },
  }) do
    it(c[1] .. " returning a value raises, naming the hook", function()
      local eng = engine.new({ groups = { { [c[1]] = c[2] } } })
      eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
      local ok, err = pcall(eng.step, eng)
      assert.is_false(ok)
      assert.equal(E.EINVAL, E.code(err))
      assert.truthy(tostring(err):find(c[3], 1, true), tostring(err))
    end)
  end

  it("returning the tensor it changed in place (torch's x.mul_(2) idiom) is accepted", function()
    local eng = engine.new({ groups = { { post_ortho_fn = function(O) return O:mul_(2) end } } })
    eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
    assert.has_no.errors(function() eng:step() end)
  end)
end)

describe("reductions in hooks", function()
  local function f64(list) return T.from(list, { #list }, "float64") end
  -- Rd.whole's reductions, each call made as if its hook were running
  local function live(hook, shape)
    local f = Rd.whole(hook, shape)
    return {
      allreduce = function(...) return Rd.during(f, f.allreduce, ...) end,
      global_norm = function(...) return Rd.during(f, f.global_norm, ...) end,
    }
  end

  it("sum is exact before one rounding: any split and order give the same bits", function()
    local f = live("test")
    assert.equal(1, f.allreduce(f64({ 1e308, 1, -1e308 }), "sum"))
    assert.equal(2 ^ 53, f.allreduce(f64({ 2 ^ 53, 1 }), "sum")) -- a tie: to even
    assert.equal(2 ^ 53 + 2, f.allreduce(f64({ 2 ^ 53, 1, 2 ^ -60 }), "sum"))
    assert.equal(2 * 5e-324 - 1e-320, f.allreduce(f64({ 5e-324, 5e-324, -1e-320 }), "sum")) -- subnormals, exact
    assert.equal(math.huge, f.allreduce(f64({ math.huge, 1 }), "sum"))
    assert.is_true(f.allreduce(f64({ math.huge, -math.huge }), "sum") ~= f.allreduce(f64({ math.huge, -math.huge }), "sum"))
    local x = T.randn({ 3000 }, 5, "float64"):mul(T.randn({ 3000 }, 6, "float64"):exp():pow(8))
    local whole = f.allreduce(x, "sum")
    -- double-double (TwoSum) accumulation as the reference: correct here to ~2^-100
    local s, c = 0, 0
    for _, v in ipairs(x:flat()) do
      local t = s + v
      local bp = t - s
      c = c + ((s - (t - bp)) + (v - bp))
      s = t
    end
    assert.equal(s + c, whole)
    local flat = x:flat()
    for _, cut in ipairs({ { 1 }, { 1, 3000 }, { 1, 1000, 2000 }, { 1, 1, 2999 }, { 1, 7, 1500, 2993 } }) do
      -- the pieces' accumulators merged (what ranks exchange) give the same bits
      local ffi = require("ffi")
      local C = require("muon.core").C
      local total = ffi.new("mu_xsum")
      C.mu_xsum_zero(total)
      local from = 1
      for k = #cut, 1, -1 do -- in reverse order
        local to = k == #cut and 3000 or cut[k + 1] - 1
        local piece = {}
        for i = cut[k], to do piece[#piece + 1] = flat[i] end
        local part = ffi.new("mu_xsum")
        C.mu_xsum_zero(part)
        if #piece > 0 then C.mu_xsum_add_tensor(part, f64(piece), 0) end
        C.mu_xsum_merge(total, part)
        from = to
      end
      assert(from)
      assert.equal(whole, C.mu_xsum_value(total))
    end
  end)

  it("max, min and global_norm; float32 squares are exact", function()
    local f = live("test")
    local x = T.from({ 3, -7, 2.5, 0 }, { 2, 2 })
    assert.equal(3, f.allreduce(x, "max"))
    assert.equal(-7, f.allreduce(x, "min"))
    assert.equal(-1.5, f.allreduce(x, "sum"))
    assert.equal(math.sqrt(9 + 49 + 6.25), f.global_norm(x))
    assert.equal(-math.huge, f.allreduce(T.zeros({ 0 }), "max"))
    assert.equal(0, f.global_norm(T.zeros({ 0, 3 })))
    assert.is_true(f.allreduce(T.from({ 1, 0 / 0 }, { 2 }), "max") ~= f.allreduce(T.from({ 1, 0 / 0 }, { 2 }), "max"))
    -- a strided view: its own elements
    assert.equal(3 - 7, f.allreduce(x:transpose(1, 2):narrow(2, 1, 1), "sum"))
  end)

  it("misuse names the hook and the argument", function()
    local f = live("post_update_fn", { 4, 3 })
    local cases = {
      { function() f.allreduce(1, "sum") end, "post_update_fn: ctx.allreduce: x must be a tensor, got number" },
      { function() f.allreduce(T.zeros({ 4, 3 }), "avg") end, "op must be 'sum', 'max' or 'min', got 'avg'" },
      { function() f.global_norm(T.zeros({ 3, 4 })) end,
        "ctx.global_norm: x must have the shape of this rank's piece of the parameter, [4, 3] (local_tensor's), got [3, 4]" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  it("work only during the hook call whose ctx they came with", function()
    local f = Rd.whole("post_ortho_fn")
    local ok, err = pcall(f.allreduce, T.zeros({ 2 }), "sum")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("post_ortho_fn: ctx.allreduce called outside the hook call whose ctx it came "
      .. "with", 1, true), tostring(err))
    assert.equal(3, Rd.during(f, function() return f.allreduce(T.from({ 1, 2 }, { 2 }), "sum") end))
    assert.is_false((pcall(f.global_norm, T.zeros({ 2 })))) -- (and not after)
    -- a ctx kept by post_update_fn and called from a later step's
    -- pre_ortho_fn (on a mesh: the owner's alone) fails that step, which
    -- changes nothing
    local kept
    local eng = engine.new({ groups = { { optimizer = "muon", lr = 0.02,
      post_update_fn = function(_, _, ctx) kept = kept or ctx end,
      pre_ortho_fn = function(G) if kept then kept.allreduce(G, "sum") end end } } })
    eng:add_param("w", T.randn({ 3, 4 }, 1), T.randn({ 3, 4 }, 2))
    eng:step()
    local before = eng:param("w").value:clone()
    ok, err = pcall(eng.step, eng)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("post_update_fn: ctx.allreduce called outside the hook call", 1, true),
      tostring(err))
    assert.equal(1, eng:get("step"))
    assert.same(before:flat(), eng:param("w").value:flat())
  end)

  it("reach hooks in sandboxed configs (through the membrane)", function()
    local path = H.tmpname(".lua")
    H.write_file(path, [[
return { groups = { {
  post_ortho_fn = function(O, _, ctx) O:div_(ctx.global_norm(O)) end,
  post_update_fn = function(_, w, ctx) w:mul_(2 / ctx.global_norm(w)); assert(ctx.allreduce(w, "max") <= 2) end,
} } }]])
    local eng = engine.new(path)
    os.remove(path)
    local w = T.randn({ 4, 3 }, 1)
    eng:add_param("w", w, T.randn({ 4, 3 }, 2))
    eng:step()
    assert.is_true(math.abs(w:norm() - 2) < 1e-6)
  end)
end)

-- A trusted hook that yields (a trainer calling eng:step() inside a
-- coroutine): refused where the hook is called, so the step fails like any
-- failing hook and nothing is left suspended or busy.
describe("hooks that yield", function()
  local muon = require("muon")
  local S = require("muon.step")
  local function snapshot(eng) return H.engine_bits(eng, { "w", "b" }) end

  it("every kind of hook (with and without hook_budget), a schedule and a match function: the step fails naming "
    .. "it, nothing changed, no coroutine left suspended; a dropped coroutine leaves the engine idle", function()
    local yielding = true
    local function y() if yielding then coroutine.yield("from a hook") end end
    local function updates(grads) y() local u = {} for i, g in ipairs(grads) do u[i] = g:clone() end return u end
    local hooks = {
      post_update_fn = function() y() end, pre_ortho_fn = function() y() end, post_ortho_fn = function() y() end,
      momentum_update_fn = function(grads, bufs, m1) for i = 1, #bufs do bufs[i]:mul_(m1):add_(grads[i]) end
        return updates(grads) end,
      zeropower_fn = function(x) y() return x end,
      reshape_fn = function(_, x) y() return { x } end,
    }
    for _, budget in ipairs({ false, true }) do
      for name, fn in pairs(hooks) do
        local function make()
          return engine.new({ groups = { { optimizer = "muon", match = "^w", lr = 0.02, [name] = fn },
            { optimizer = "adamw", lr = 0.01 } }, hook_budget = budget and { seconds = 30 } or nil })
        end
        local eng, ref = make(), make() -- (ref steps only once the hook no longer yields)
        for _, e in ipairs({ eng, ref }) do
          e:add_param("w", T.randn({ 6, 4 }, 1), T.randn({ 6, 4 }, 2))
          e:add_param("b", T.randn({ 4 }, 3), T.randn({ 4 }, 4))
        end
        yielding = true
        local before = snapshot(eng)
        local co = coroutine.create(function() return eng:step() end)
        local ok, err = coroutine.resume(co)
        local label = name .. (budget and " (hook_budget)" or "")
        assert.is_false(ok, label)
        assert.equal("dead", coroutine.status(co), label)
        assert.equal(E.ELUA, E.code(err), label)
        assert.truthy(tostring(err):find(name .. ": coroutine.yield inside a hook: a hook must return, not yield", 1,
          true), tostring(err))
        assert.equal(before, snapshot(eng), label)
        -- a second coroutine, dropped while the first never suspended: the engine is idle
        co = coroutine.wrap(function() return eng:step() end)
        assert.is_false((pcall(co)))
        co = nil
        collectgarbage()
        yielding = false
        eng:step()
        ref:step()
        assert.equal(snapshot(ref), snapshot(eng), label .. ": the next step is the one a fresh engine takes")
      end
    end
  end)

  it("a schedule, a match function, a sandboxed config (no coroutine library) and the one-process optimizers", function()
    local eng = engine.new({ groups = { { optimizer = "adamw" } },
      schedule = function(step) coroutine.yield() return 0.01 * step end })
    eng:add_param("b", T.randn({ 4 }, 3), T.randn({ 4 }, 4))
    local co = coroutine.create(function() return eng:step() end)
    local ok, err = coroutine.resume(co)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("schedule: coroutine.yield inside a hook", 1, true), tostring(err))
    assert.equal(0, eng:get("step"))
    local m = engine.new({ groups = { { optimizer = "adamw", match = function() coroutine.yield() return true end } } })
    ok, err = coroutine.resume(coroutine.create(function() return m:add_param("b", T.zeros({ 2 }), T.zeros({ 2 })) end))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("match function: coroutine.yield inside a hook", 1, true), tostring(err))
    assert.equal(0, #m:describe())
    local path = H.tmpname(".lua")
    local f = assert(io.open(path, "w"))
    f:write("return { groups = { { optimizer = 'muon', post_update_fn = function() coroutine.yield() end } } }")
    f:close()
    local s = engine.new(path)
    s:add_param("w", T.randn({ 6, 4 }, 1), T.randn({ 6, 4 }, 2))
    ok, err = pcall(s.step, s)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("coroutine", 1, true), tostring(err))
    os.remove(path)
    local p = muon.param("w", T.randn({ 6, 4 }, 1), T.randn({ 6, 4 }, 2))
    local opt = muon.optim.Muon({ p }, { post_update_fn = function() coroutine.yield() end })
    ok, err = coroutine.resume(coroutine.create(function() return opt:step() end))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("post_update_fn: coroutine.yield inside a hook", 1, true), tostring(err))
    assert.is_nil(opt.state[p])
  end)

  it("a yield that reaches one of the optimizer's calls another way fails that call and leaves it idle", function()
    local st = S.new({ groups = {} })
    local co = coroutine.create(function() return st:exclusive("step", function() coroutine.yield("x") end) end)
    local ok, err = coroutine.resume(co)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("coroutine.yield inside step", 1, true), tostring(err))
    assert.equal("dead", coroutine.status(co))
    st:check_idle("step")
    assert.equal(3, st:exclusive("step", function(a, b) return a + b end, 1, 2))
  end)
end)

-- ctx (and post_update_fn's parameter) is read-only, in trusted and
-- sandboxed configs alike: a write to any field or nested field fails the
-- step naming it, and nothing the engine keeps changes.
describe("a hook's ctx is read-only", function()
  -- hook -> the fields of its ctx, and a value to write into each
  local FIELDS = {
    pre_ortho_fn = { "param_fqn", "logical_shape", "region", "step", "lr", "weight_decay", "signals", "allreduce",
      "global_norm" },
    post_update_fn = { "param_fqn", "logical_shape", "box", "step", "lr", "weight_decay", "signals", "allreduce",
      "global_norm" },
  }
  FIELDS.post_ortho_fn = FIELDS.pre_ortho_fn
  -- nested writes: Lua source run as the hook's body (ctx, param: its arguments)
  local NESTED = {
    pre_ortho_fn = { { "ctx.logical_shape[1] = 2 * ctx.logical_shape[1]", "changed ctx.logical_shape[1] (6 -> 12)" },
      { "ctx.region.start[2] = 3", "changed ctx.region.start[2] (0 -> 3)" },
      { "ctx.region.len = { 1 }", "changed ctx.region.len[1] (6 -> 1)" },
      { "table.insert(ctx.logical_shape, 1)", "changed ctx.logical_shape[3] (nil -> 1)" },
      { "ctx.signals.s[1] = 5", "changed ctx.signals.s[1] (1 -> 5)" },
      { "ctx.signals.t = { 1 }", "changed ctx.signals.t (nil -> a table)" } },
    post_update_fn = { { "ctx.box.start[1] = 4", "changed ctx.box.start[1] (1 -> 4)" },
      { "ctx.box.len[2] = 0", "changed ctx.box.len[2] (4 -> 0)" },
      { "ctx.logical_shape[2] = 1", "changed ctx.logical_shape[2] (4 -> 1)" },
      { "ctx.signals.s = nil", "changed ctx.signals.s (a table -> nil)" },
      { "param.logical_shape[1] = 0", "changed param.logical_shape[1] (6 -> 0)" },
      { "param.value = param.grad", "cannot set param.value: post_update_fn's parameter is read-only" },
      { "param.name = 'x'", "cannot set param.name" } },
  }
  NESTED.post_ortho_fn = NESTED.pre_ortho_fn

  -- An engine over w (6x4) and b (4) whose hook runs body(…) while
  -- switch.on, from a config table (trusted) or a sandboxed file.
  local function make(hook, body, sandboxed)
    local src = ("return { groups = { { optimizer = 'muon', match = '^w', lr = 0.02, %s = function(a, b, ctx) "
      .. "if WRITE then local param, ctx = a, ctx; %s end end }, { optimizer = 'adamw', lr = 0.01 } } }")
      :format(hook, body)
    local eng, switch
    if sandboxed then
      local path = H.tmpname(".lua")
      -- (the sandbox has no shared globals: the switch is a set_signal)
      H.write_file(path, (src:gsub("if WRITE then", "if ctx.signals.on[1] == 1 then")))
      eng = engine.new(path)
      os.remove(path)
      switch = function(on) eng:set_signal("on", { on and 1 or 0 }) end
    else
      local env = setmetatable({ WRITE = false }, { __index = _G })
      eng = engine.new(setfenv(assert(loadstring(src)), env)())
      switch = function(on) env.WRITE = on end
    end
    eng:add_param("w", T.randn({ 6, 4 }, 1), T.randn({ 6, 4 }, 2))
    eng:add_param("b", T.randn({ 4 }, 3), T.randn({ 4 }, 4))
    eng:set_signal("s", { 1, 2 })
    switch(false)
    return eng, switch
  end

  local function snapshot(eng) return H.engine_bits(eng, { "w", "b" }) end

  it("a write to any field or nested field fails the step naming it, trusted and sandboxed; nothing changes, and "
    .. "describe(), save and load go on as before", function()
    local path = H.tmpname(".safetensors")
    for _, sandboxed in ipairs({ false, true }) do
      for hook, fields in pairs(FIELDS) do
        local cases = {}
        for _, f in ipairs(fields) do cases[#cases + 1] = { "ctx." .. f .. " = 1", "cannot set ctx." .. f .. ": " } end
        for _, c in ipairs(NESTED[hook]) do cases[#cases + 1] = c end
        for _, c in ipairs(cases) do
          local eng, switch = make(hook, c[1], sandboxed)
          local ref = make(hook, "", sandboxed)
          eng:step()
          ref:step()
          local before = snapshot(eng)
          switch(true)
          local ok, err = pcall(eng.step, eng)
          local label = ("%s %s (%s)"):format(hook, c[1], sandboxed and "sandboxed" or "trusted")
          assert.is_false(ok, label)
          assert.equal(E.ELUA, E.code(err), label)
          assert.truthy(tostring(err):find(c[2], 1, true), label .. ": " .. tostring(err))
          assert.equal(before, snapshot(eng), label)
          switch(false)
          eng:save(path)
          eng:load(path)
          eng:step()
          ref:step()
          assert.equal(snapshot(ref), snapshot(eng), label)
        end
      end
    end
    os.remove(path)
  end)

  it("reads work as on plain tables: #, ipairs, table.concat, unpack, nested fields", function()
    local seen = {}
    local eng = engine.new({ groups = { { optimizer = "muon", post_update_fn = function(param, _, ctx)
      seen[#seen + 1] = table.concat({ #ctx.logical_shape, table.concat(ctx.logical_shape, "x"), ctx.param_fqn,
        param.name, table.concat(param.logical_shape, "x"), select(2, unpack(ctx.box.len)), ctx.box.start[1],
        #ctx.signals.s, ctx.signals.s[2], ctx.step, tostring(ctx):match("^read%-only ctx") and "view" or "?" }, " ")
      for i, d in ipairs(ctx.logical_shape) do seen[#seen + 1] = i .. ":" .. d end
    end } } })
    eng:add_param("w", T.randn({ 6, 4 }, 1), T.randn({ 6, 4 }, 2))
    eng:set_signal("s", { 7, 8, 9 })
    eng:step()
    assert.same({ "2 6x4 w w 6x4 4 1 3 8 1 view", "1:6", "2:4" }, seen)
  end)
end)
