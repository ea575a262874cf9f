-- What a step commits, and what it refuses (issue 22): empty parameters
-- step, save and load in every kind; calls into the optimizer from inside
-- its own hooks are refused (nothing changed); every tensor the commit
-- writes is checked under the group's nonfinite policy, and save refuses
-- non-finite state; a failed step cannot change hook state through any
-- alias a hook kept. Snapshots compare every bit of parameters, state and
-- step counters (tests/fuzz/driver.lua).
package.path = "tests/fuzz/?.lua;" .. package.path
local H = require("helpers")
local T = H.T
local D = require("driver")
local E = require("muon.errors")
local engine = require("muon.engine")
local muon = require("muon")

local function tmp() return H.tmpname(".safetensors") end

-- pcall(f): the error's code name and message (fails the test if f passed).
local function fails(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return E.name(E.code(err)), E.message(err)
end

describe("empty parameters", function()
  -- (Muon takes >= 2-D parameters; AdamW and Lion any)
  local SHAPES = {
    muon = { { 0, 4 }, { 4, 0 }, { 2, 0, 3 }, { 0, 0 }, { 3, 0, 0, 2 } },
    adamw = { { 0 }, { 0, 4 }, { 4, 0 }, { 2, 0, 3 } },
    lion = { { 0 }, { 0, 4 }, { 4, 0 }, { 2, 0, 3 } },
  }
  for _, kind in ipairs({ "muon", "adamw", "lion" }) do
    for _, shape in ipairs(SHAPES[kind]) do
      local label = ("%s group, shape (%s)"):format(kind, table.concat(shape, ", "))
      it(label .. ": steps, saves and loads beside a non-empty parameter", function()
        local function make()
          local eng = engine.new({ groups = { { optimizer = kind, match = ".", lr = 0.05, weight_decay = 0.1 } } })
          eng:add_param("empty", T.zeros(shape), T.zeros(shape))
          local w = T.randn({ 3, 4 }, 5)
          eng:add_param("w", w, T.zeros({ 3, 4 }))
          return eng, w
        end
        local a, wa = make()
        local function grad(eng, s) eng:param("w").grad:copy(T.randn({ 3, 4 }, 100 + s)) end
        for s = 1, 3 do grad(a, s); a:step() end
        local st = a:state("empty")
        assert.is_table(st)
        for k, v in pairs(st) do
          if T.is_tensor(v) then
            assert.are.equal(0, v:numel(), k)
            assert.are.same(shape, v:size(), k)
          end
        end
        local path = tmp()
        a:save(path)
        local b, wb = make()
        b:load(path)
        os.remove(path)
        wb:copy(wa) -- (a load restores the optimizer, not the parameters)
        assert.are.equal(D.snapshot(a), D.snapshot(b))
        -- the loaded state goes on as the saved one: same bits after two more steps
        for s = 4, 5 do
          grad(a, s); a:step()
          grad(b, s); b:step()
        end
        H.assert_equal_bits(wa, wb, "w after the load")
        assert.are.equal(D.snapshot(a), D.snapshot(b))
        assert.are.equal(0, a:param("empty").value:numel())
      end)
    end
  end

  it("Muon hook state of an empty parameter (square preconditioners) saves and loads", function()
    for _, shape in ipairs({ { 4, 0 }, { 0, 4 }, { 2, 0, 3 } }) do
      local function make()
        local eng = engine.new({ groups = { { optimizer = "muon", match = ".", lr = 0.05,
          hook_state = { K = "cols_cols", R = "rows_rows", v = "matrix" },
          pre_ortho_fn = function(G, state) state.v:copy(G) end } } })
        eng:add_param("empty", T.zeros(shape), T.zeros(shape))
        eng:add_param("w", T.randn({ 3, 4 }, 5), T.randn({ 3, 4 }, 6))
        return eng
      end
      local a = make()
      a:step()
      a:step()
      local path = tmp()
      a:save(path)
      local b = make()
      b:load(path)
      os.remove(path)
      assert.are.equal(D.snapshot(a, true), D.snapshot(b, true))
    end
  end)

  it("the one-process classes save and load empty parameters", function()
    for _, cls in ipairs({ "Muon", "AdamW", "Lion" }) do
      local function make()
        local ps = { muon.param("e", T.zeros({ 0, 5 }), T.zeros({ 0, 5 })), muon.param("w", T.randn({ 4, 5 }, 1), T.randn({ 4, 5 }, 2)) }
        return muon.optim[cls](ps, { lr = 0.02 }), ps
      end
      local a, pa = make()
      a:step()
      local path = tmp()
      a:save(path)
      local b, pb = make()
      b:load(path)
      os.remove(path)
      pb[2].value:copy(pa[2].value) -- (a load restores the optimizer, not the parameters)
      a:step()
      b:step()
      H.assert_equal_bits(pa[2].value, pb[2].value, cls)
      for _, opt in ipairs({ a, b }) do
        local st = opt.state[pa[1]] or opt.state[pb[1]]
        for k, v in pairs(st) do
          if T.is_tensor(v) then assert.are.same({ 0, 5 }, v:size(), cls .. " " .. k) end
        end
      end
    end
  end)
end)

describe("calls from inside the optimizer's own hooks", function()
  local CALLS = {
    step = function(eng) eng:step() end,
    save = function(eng) eng:save(H.tmpname(".safetensors")) end,
    load = function(eng, path) eng:load(path) end,
    add_param = function(eng) eng:add_param("w_late", T.zeros({ 2, 2 }), T.zeros({ 2, 2 })) end,
    set = function(eng) eng:set("lr_scale", 3) end,
    set_signal = function(eng) eng:set_signal("s", { 1 }) end,
    state = function(eng) eng:state("w") end,
  }
  local HOOKS = {
    post_update_fn = function(f) return function() f() end end,
    pre_ortho_fn = function(f) return function() f() end end,
    post_ortho_fn = function(f) return function() f() end end,
    zeropower_fn = function(f) return function(x) f() return x end end,
    momentum_update_fn = function(f)
      return function(grads, bufs)
        f()
        local u = {}
        for i, g in ipairs(grads) do
          bufs[i]:mul(0.9):add(g)
          u[i] = bufs[i]:clone()
        end
        return u
      end
    end,
  }
  local HOOK_ORDER = { "post_update_fn", "pre_ortho_fn", "post_ortho_fn", "zeropower_fn", "momentum_update_fn" }
  local CALL_ORDER = { "step", "save", "load", "add_param", "set", "set_signal", "state" }

  for _, hook in ipairs(HOOK_ORDER) do
    it(hook .. ": every re-entrant call is refused (MU_ESTATE), the step goes on as a plain one", function()
      for _, call in ipairs(CALL_ORDER) do
        local eng, caught
        local path = tmp()
        local function make(reenter)
          local g = { optimizer = "muon", match = "^w", lr = 0.05 }
          g[hook] = HOOKS[hook](function()
            if reenter then
              local ok, err = pcall(CALLS[call], eng, path)
              caught = caught or { ok = ok, err = err }
            end
          end)
          local e = engine.new({ groups = { g, { optimizer = "adamw", match = "^b", lr = 0.01 } } })
          e:add_param("w", T.randn({ 3, 4 }, 1), T.randn({ 3, 4 }, 2))
          e:add_param("b", T.randn({ 4 }, 3), T.randn({ 4 }, 4))
          return e
        end
        local plain = make(false)
        eng = make(true)
        eng:save(path) -- (a file for the re-entrant load)
        plain:step(); plain:step()
        eng:step(); eng:step()
        os.remove(path)
        assert.is_false(caught.ok, call)
        assert.are.equal("ESTATE", E.name(E.code(caught.err)), call)
        assert.truthy(E.message(caught.err):find(call .. ": refused: the optimizer is already in a call (step)", 1, true),
          E.message(caught.err))
        assert.are.equal(D.snapshot(plain), D.snapshot(eng), hook .. " -> " .. call)
        assert.are.equal(1, eng:get("lr_scale"))
        assert.is_nil(eng:param("w_late"))
      end
    end)
  end

  it("an uncaught refusal fails the outer step: nothing changed", function()
    local eng
    eng = engine.new({ groups = { { optimizer = "muon", match = ".", lr = 0.05,
      post_update_fn = function() eng:step() end } } })
    eng:add_param("w", T.randn({ 3, 4 }, 1), T.randn({ 3, 4 }, 2))
    local before = D.snapshot(eng)
    local _, msg = fails(eng.step, eng)
    assert.truthy(msg:find("step: refused", 1, true), msg)
    assert.are.equal(before, D.snapshot(eng))
    assert.are.equal(0, eng:get("step"))
  end)

  it("the one-process classes refuse their own step from a hook", function()
    local opt
    local p = muon.param("w", T.randn({ 3, 4 }, 1), T.randn({ 3, 4 }, 2))
    local err
    opt = muon.optim.Muon({ p }, { lr = 0.05, post_update_fn = function()
      local ok, e = pcall(opt.step, opt)
      err = not ok and e or nil
    end })
    opt:step()
    assert.are.equal("ESTATE", E.name(E.code(err)))
  end)
end)

-- An engine of one Muon group (w, 3x4) and one AdamW group (b, 4); extra
-- options for the Muon group; grads set from seeds each step.
local function pair(muon_opts, adamw_opts, dtype)
  local g = { optimizer = "muon", match = "^w", lr = 0.05 }
  for k, v in pairs(muon_opts or {}) do g[k] = v end
  local a = { optimizer = "adamw", match = "^b", lr = 0.01 }
  for k, v in pairs(adamw_opts or {}) do a[k] = v end
  local eng = engine.new({ groups = { g, a } })
  eng:add_param("w", T.randn({ 3, 4 }, 1, dtype), T.zeros({ 3, 4 }, dtype))
  eng:add_param("b", T.randn({ 4 }, 3, dtype), T.zeros({ 4 }, dtype))
  return eng
end
local function grads(eng, s)
  eng:param("w").grad:copy(T.randn({ 3, 4 }, 10 + s, eng:param("w").grad:dtype()))
  eng:param("b").grad:copy(T.randn({ 4 }, 20 + s, eng:param("b").grad:dtype()))
end

-- A value that fails the check: NaN, +Inf or -Inf at element `at` (the
-- last by default: the fused check reads the whole tensor).
local BAD = { 0 / 0, math.huge, -math.huge }
local function poison(t, v, at)
  local flat = t:view({ t:numel() })
  flat:narrow(1, at or t:numel(), 1):fill(v)
end

-- Under nonfinite = "error": eng:step() fails with ENONFINITE, its message
-- holding want, and changes nothing (D.snapshot: values and state).
local function step_fails_unchanged(eng, want)
  local before = D.snapshot(eng)
  local code, msg = fails(eng.step, eng)
  assert.are.equal("ENONFINITE", code)
  assert.truthy(msg:find(want, 1, true), msg)
  assert.are.equal(before, D.snapshot(eng))
end

describe("every tensor the commit writes is checked", function()
  for bi, bad in ipairs(BAD) do
    it(("momentum_update_fn leaving %s in the momentum, finite updates: error names the tensor; skip skips"):format(tostring(bad)), function()
      for _, policy in ipairs({ "error", "skip" }) do
        local n = 0
        local eng = pair({ nonfinite = policy, momentum_update_fn = function(gs, bufs)
          n = n + 1
          local u = {}
          for i, g in ipairs(gs) do
            bufs[i]:mul(0.9):add(g)
            u[i] = bufs[i]:clone()
            if n == 2 then poison(bufs[i], bad, bi) end
          end
          return u
        end })
        grads(eng, 1)
        eng:step()
        grads(eng, 2)
        if policy == "error" then
          step_fails_unchanged(eng, "parameter 'w': state tensor 'momentum_buffer' (written by a hook) would hold NaN or Inf")
        else
          eng:step()
          assert.are.equal(1, eng:stats().muon.skipped_nonfinite)
          -- the skipped group's parameters and state are as before
          local s = eng:state("w")
          assert.is_true(s.momentum_buffer:all_finite())
        end
        eng:save(H.tmpname(".safetensors")) -- (what is left saves)
      end
    end)
  end

  for _, hook in ipairs({ "pre_ortho_fn", "post_ortho_fn" }) do
    for bi, bad in ipairs(BAD) do
      it(("%s leaving %s in its hook state: error names the hook state; skip skips"):format(hook, tostring(bad)), function()
        for _, policy in ipairs({ "error", "skip" }) do
          local n = 0
          local eng = pair({ nonfinite = policy, hook_state = { v = "matrix", r = "rows" }, [hook] = function(x, state)
            n = n + 1
            state.v:mul(0.5):add(x)
            state.r:add(1)
            if n == 2 then poison(bi == 1 and state.v or state.r, bad) end
          end })
          grads(eng, 1)
          eng:step()
          grads(eng, 2)
          if policy == "error" then
            local which = bi == 1 and "v" or "r"
            step_fails_unchanged(eng, "parameter 'w': hook state '" .. which .. "' (pre_ortho_fn / post_ortho_fn) would hold NaN or Inf")
          else
            eng:step()
            assert.are.equal(1, eng:stats().muon.skipped_nonfinite)
            assert.is_true(eng:state("w")["hook.v"]:all_finite())
            assert.is_true(eng:state("w")["hook.r"]:all_finite())
          end
          local path = H.tmpname(".safetensors")
          eng:save(path)
          pair({ nonfinite = policy, hook_state = { v = "matrix", r = "rows" }, [hook] = function() end }):load(path)
          os.remove(path)
        end
      end)
    end
  end

  for _, dtype in ipairs({ "float32", "float64" }) do
    it(dtype .. ": a commit that would overflow a parameter fails before writing (both kinds, both policies)", function()
      local big = dtype == "float32" and 3.4e38 or 1.797e308
      for _, which in ipairs({ "w", "b" }) do
        for _, policy in ipairs({ "error", "skip" }) do
          -- a huge lr: AdamW's update is about lr in size, Muon's
          -- orthogonalized update about lr * 0.2 * sqrt(max dim)
          local lr = dtype == "float32" and 1e37 or 1e306
          local eng = pair({ nonfinite = policy, lr = which == "w" and lr or 0.05 },
            { nonfinite = policy, lr = which == "b" and lr or 0.01 }, dtype)
          local p = eng:param(which)
          p.value:fill(big)
          grads(eng, 1)
          p.grad:fill(-1) -- (every update pushes p up)
          if policy == "error" then
            step_fails_unchanged(eng, "parameter '" .. which .. "': the step would leave NaN or Inf in the parameter")
          else
            eng:step()
            assert.are.equal(1, eng:stats()[which == "w" and "muon" or "adamw"].skipped_nonfinite)
            assert.is_true(p.value:all_finite())
            H.assert_equal_bits(p.value, T.zeros(p.value:size(), dtype):fill(big), which)
          end
        end
      end
    end)
  end

  it("state that overflows only as stored (bfloat16 state, finite float32 maths): error names it; skip skips", function()
    -- A gradient of 3.397e38 is finite in float32; the new momentum (Muon,
    -- momentum {0, 0.5}: u = g) or moment (Lion, betas {0.9, 0}: m' = g)
    -- rounds to Inf in bfloat16 while the update stays finite: the
    -- direction pass checks the state as it would be stored.
    for _, case in ipairs({ { "muon", { momentum = { 0, 0.5 } }, "momentum_buffer" },
                            { "lion", { betas = { 0.9, 0 } }, "exp_avg" } }) do
      for _, policy in ipairs({ "error", "skip" }) do
        local g = { optimizer = case[1], lr = 0.01, state_dtype = "bfloat16", nonfinite = policy }
        for k, v in pairs(case[2]) do g[k] = v end
        local eng = engine.new({ groups = { g } })
        eng:add_param("w", T.randn({ 4, 6 }, 1), T.randn({ 4, 6 }, 2))
        eng:step()
        eng:param("w").grad:set(3.397e38, 2, 3)
        if policy == "error" then
          step_fails_unchanged(eng, "parameter 'w': its gradient is finite but the " .. case[3]
            .. " overflowed to NaN or Inf in bfloat16 (state_dtype)")
        else
          local w, st = eng:param("w").value:clone(), eng:state("w")[case[3]]:clone()
          eng:step()
          assert.are.equal(1, eng:stats()[case[1]].skipped_nonfinite)
          H.assert_equal_bits(eng:param("w").value, w, "w")
          H.assert_equal_bits(eng:state("w")[case[3]], st, case[3])
          eng:save(H.tmpname(".safetensors")) -- (nothing non-finite was committed)
        end
      end
    end
  end)

  it("a parameter already holding NaN fails the step under 'error' (cautious decay too)", function()
    for _, mode in ipairs({ "decoupled", "cautious" }) do
      local eng = pair({ weight_decay = 0.1, weight_decay_mode = mode })
      poison(eng:param("w").value, 0 / 0, 5)
      grads(eng, 1)
      local code, msg = fails(eng.step, eng)
      assert.are.equal("ENONFINITE", code)
      assert.truthy(msg:find("parameter 'w': the step would leave NaN or Inf", 1, true), msg)
    end
  end)

  it("post_update_fn leaving NaN or Inf in a parameter: error fails the step; skip skips its group", function()
    for bi, bad in ipairs(BAD) do
      for _, policy in ipairs({ "error", "skip" }) do
        local n = 0
        local eng = pair({ nonfinite = policy, post_update_fn = function(_, x)
          n = n + 1
          if n == 2 then poison(x, bad, bi) end
        end })
        grads(eng, 1)
        eng:step()
        local b_before = eng:param("b").value:clone()
        local w_state = eng:state("w").momentum_buffer:clone()
        grads(eng, 2)
        if policy == "error" then
          step_fails_unchanged(eng, "parameter 'w': post_update_fn left NaN or Inf in the parameter")
        else
          eng:step()
          assert.are.equal(1, eng:stats().muon.skipped_nonfinite)
          assert.are.equal(0, eng:stats().adamw.skipped_nonfinite)
          assert.is_true(eng:param("w").value:all_finite())
          H.assert_equal_bits(eng:state("w").momentum_buffer, w_state, "w's state as before the step")
          assert.is_false(H.max_abs_diff(eng:param("b").value, b_before) == 0, "b stepped")
          -- w goes on from its state before the skipped step: as a run
          -- without that step (Muon's step does not depend on the count)
          local ref = pair({ nonfinite = policy, post_update_fn = function() end })
          grads(ref, 1)
          ref:step()
          grads(ref, 3)
          ref:step()
          grads(eng, 3)
          eng:step()
          H.assert_equal_bits(eng:state("w").momentum_buffer, ref:state("w").momentum_buffer, "w's momentum")
          H.assert_equal_bits(eng:param("w").value, ref:param("w").value, "w")
        end
      end
    end
  end)

  it("save refuses non-finite state, naming the tensor; nothing is written", function()
    for _, case in ipairs({ { "w", "momentum_buffer" }, { "b", "exp_avg" }, { "b", "exp_avg_sq" } }) do
      local eng = pair()
      grads(eng, 1)
      eng:step()
      poison(eng:state(case[1])[case[2]], math.huge, 1)
      local path = H.tmpname(".safetensors")
      os.remove(path)
      local code, msg = fails(eng.save, eng, path)
      assert.are.equal("ENONFINITE", code)
      assert.truthy(msg:find("state tensor '" .. ({ w = "muon/", b = "adamw/" })[case[1]] .. case[1] .. "/" .. case[2]
        .. "' holds NaN or Inf", 1, true), msg)
      assert.is_nil(io.open(path, "rb"))
    end
  end)
end)

describe("a failed step cannot change state through an alias a hook kept", function()
  -- Each route: a hook keeps something at step 1 and, at step 3, writes
  -- through it and fails (raising, or a later hook raising). The state
  -- must be that of a run whose step 3 never happened: the next step
  -- gives the same bits as a reference engine without the failure.
  local function run(opts, fail_at)
    local eng = pair(opts(fail_at))
    for s = 1, 4 do
      grads(eng, s)
      if s == 3 and fail_at then
        local before = D.snapshot(eng)
        fails(eng.step, eng)
        assert.are.equal(before, D.snapshot(eng), "after the failed step")
      else
        eng:step()
      end
    end
    return eng
  end
  local function same_as_reference(opts)
    local ref = pair(opts(nil))
    for s = 1, 4 do
      if s ~= 3 then grads(ref, s); ref:step() end
    end
    local eng = run(opts, 3)
    assert.are.equal(D.snapshot(ref), D.snapshot(eng))
  end

  local function ortho(hook, route)
    return function(fail_at)
      local kept, n = nil, 0
      return { hook_state = { v = "matrix", K = "cols_cols" }, [hook] = function(x, state)
        n = n + 1
        state.v:mul(0.5):add(x)
        state.K:add(0.25)
        -- (steps 1 and 2: the buffers of the two steps before; "last" only
        -- the one before)
        if n <= 2 and (route ~= "last" or n == 2) then
          kept = kept or {}
          kept[#kept + 1] = route == "view" and { v = state.v:narrow(2, 1, 2), K = state.K } or state
        end
        if fail_at and n == fail_at then
          for _, k in ipairs(kept) do
            k.v:fill(1e30)
            k.K:fill(-7)
          end
          error("boom after writing through kept views")
        end
      end }
    end
  end
  for _, hook in ipairs({ "pre_ortho_fn", "post_ortho_fn" }) do
    for _, route in ipairs({ "table", "view", "last" }) do
      it(hook .. ": hook state kept from an earlier step (" .. route .. ")", function()
        same_as_reference(ortho(hook, route))
      end)
    end
  end

  it("momentum_update_fn: buffers kept from an earlier step", function()
    same_as_reference(function(fail_at)
      local kept, n = nil, 0
      return { momentum_update_fn = function(gs, bufs)
        n = n + 1
        if n <= 2 then
          kept = kept or {}
          kept[#kept + 1], kept[#kept + 2] = bufs[1], bufs[1]:view({ 12 })
        end
        local u = {}
        for i, g in ipairs(gs) do
          bufs[i]:mul(0.9):add(g)
          u[i] = bufs[i]:clone()
        end
        if fail_at and n == fail_at then
          for i = 1, #kept, 2 do
            kept[i]:fill(5)
            kept[i + 1]:narrow(1, 1, 3):fill(-5)
          end
          error("boom")
        end
        return u
      end }
    end)
  end)

  it("post_ortho_fn writes kept views, then post_update_fn fails (the last hook before the commit)", function()
    same_as_reference(function(fail_at)
      local kept, n, m = nil, 0, 0
      return { hook_state = { v = "matrix" }, post_ortho_fn = function(x, state)
        n = n + 1
        state.v:mul(0.5):add(x)
        if n <= 2 then
          kept = kept or {}
          kept[n] = state.v
        end
        if fail_at and n == fail_at then
          kept[1]:fill(3)
          kept[2]:fill(3)
        end
      end, post_update_fn = function()
        m = m + 1
        if fail_at and m == fail_at then error("post_update_fn fails") end
      end }
    end)
  end)

  -- post_update_fn runs on a copy of the parameter: what it keeps (the
  -- param, its tensor, a view) is not the parameter in a later step
  for _, hook in ipairs({ "pre_ortho_fn", "post_ortho_fn", "momentum_update_fn", "post_update_fn" }) do
    for _, route in ipairs({ "tensor", "view", "param" }) do
      it("a parameter kept by post_update_fn (" .. route .. "), written by " .. hook .. " of a failed step", function()
        same_as_reference(function(fail_at)
          local kept, n = nil, 0
          local function write_and_fail()
            n = n + 1
            if fail_at and n == fail_at then
              if route == "param" then kept.value:fill(7) else kept:fill(7) end
              error("boom after writing a kept parameter")
            end
          end
          local o = { post_update_fn = function(p, t)
            kept = kept or ({ tensor = t, view = t:narrow(1, 1, 2), param = p })[route]
            if hook == "post_update_fn" then write_and_fail() end
          end }
          if hook == "momentum_update_fn" then
            o.momentum_update_fn = function(gs, bufs)
              write_and_fail()
              local u = {}
              for i, g in ipairs(gs) do u[i] = bufs[i]:mul(0.9):add(g):clone() end
              return u
            end
          elseif hook ~= "post_update_fn" then
            o[hook] = write_and_fail
          end
          return o
        end)
      end)
    end
  end

  it("a sandboxed config: hook state stashed in an upvalue and in a table of the config", function()
    local path = H.tmpname(".lua")
    local function write(fail)
      H.write_file(path, ([[
local kept, n = {}, 0
local saved = {}
return { groups = {
  { optimizer = "muon", match = "^w", lr = 0.05, hook_state = { v = "matrix" },
    pre_ortho_fn = function(G, state)
      n = n + 1
      state.v:mul(0.5):add(G)
      if n == 1 then kept[1] = state.v end
      if n == 2 then saved.s = state end
      if %s and n == 3 then
        kept[1]:fill(9); saved.s.v:narrow(1, 1, 1):fill(-9)
        error("boom")
      end
    end },
  { optimizer = "adamw", match = "^b", lr = 0.01 } } }
]]):format(fail and "true" or "false"))
      local eng = engine.new(path)
      eng:add_param("w", T.randn({ 3, 4 }, 1), T.zeros({ 3, 4 }))
      eng:add_param("b", T.randn({ 4 }, 3), T.zeros({ 4 }))
      return eng
    end
    local ref = write(false)
    for s = 1, 4 do
      if s ~= 3 then grads(ref, s); ref:step() end
    end
    local eng = write(true)
    for s = 1, 4 do
      grads(eng, s)
      if s == 3 then fails(eng.step, eng) else eng:step() end
    end
    os.remove(path)
    assert.are.equal(D.snapshot(ref), D.snapshot(eng))
  end)
end)

describe("a failing post_update_fn changes nothing (the step computes, then commits)", function()
  -- Groups: w (Muon: pre_ortho_fn with hook state, post_update_fn), u
  -- (Muon, no hook: the direct path), b (AdamW). At step 1 the hooks keep
  -- what they got (post_update_fn: its tensor, a view of it or its param
  -- table; pre_ortho_fn: its hook state); at step 3 they write through it
  -- and into the step's own tensor, then post_update_fn fails: raising,
  -- leaving NaN (nonfinite = "error") or running out of its budget. The
  -- failed step leaves every bit as it was (parameters, state and hook
  -- state, step counts, counters), and the run goes on as one without it.
  local MODES = {
    error = { "ELUA", "post_update_fn fails" },
    nan = { "ENONFINITE", "parameter 'w': post_update_fn left NaN or Inf in the parameter" },
    budget = { "ELUA", "exceeded the hook budget of 1000000 Lua instructions" },
  }
  local function make(mode, route, fail_at)
    local kept, n, m = {}, 0, 0
    local cfg = { hook_budget = mode == "budget" and { instructions = 1e6 } or nil, groups = {
      { optimizer = "muon", match = "^w", lr = 0.05, hook_state = { v = "matrix", r = "rows" },
        pre_ortho_fn = function(G, state)
          n = n + 1
          state.v:mul(0.5):add(G)
          state.r:add(1)
          if n == 1 then kept.state = state end
          if fail_at and n == fail_at then kept.state.v:fill(9); kept.state.r:fill(-9) end
        end,
        post_update_fn = function(p, x)
          m = m + 1
          if m == 1 then kept.post = ({ tensor = x, view = x:narrow(1, 2, 2), param = p })[route] end
          if fail_at and m == fail_at then
            if route == "param" then kept.post.value:fill(7) else kept.post:fill(7) end
            x:narrow(2, 1, 1):fill(-7)
            if mode == "error" then error("post_update_fn fails") end
            if mode == "nan" then x:narrow(1, 1, 1):fill(0 / 0) end
            if mode == "budget" then while true do end end
          end
        end },
      { optimizer = "muon", match = "^u", lr = 0.05 },
      { optimizer = "adamw", match = "^b", lr = 0.01 } } }
    local eng = engine.new(cfg)
    eng:add_param("w", T.randn({ 3, 4 }, 1), T.zeros({ 3, 4 }))
    eng:add_param("u", T.randn({ 4, 2 }, 2), T.zeros({ 4, 2 }))
    eng:add_param("b", T.randn({ 4 }, 3), T.zeros({ 4 }))
    return eng
  end
  local function set_grads(eng, s)
    for i, name in ipairs({ "w", "u", "b" }) do
      local g = eng:param(name).grad
      g:copy(T.randn(g:size(), 10 * s + i))
    end
  end
  local function counters(eng)
    local st = eng:stats()
    return ("%d %d %d %d %d"):format(st.steps, st.muon.steps, st.muon.skipped_nonfinite, st.adamw.steps,
      st.adamw.skipped_nonfinite)
  end

  for _, mode in ipairs({ "error", "nan", "budget" }) do
    for _, route in ipairs({ "tensor", "view", "param" }) do
      it(mode .. ", a parameter kept by post_update_fn (" .. route .. ") and hook state kept by pre_ortho_fn", function()
        local eng = make(mode, route, 3)
        for s = 1, 2 do set_grads(eng, s); eng:step() end
        set_grads(eng, 3)
        local before, c = D.snapshot(eng), counters(eng)
        local code, msg = fails(eng.step, eng)
        assert.are.equal(MODES[mode][1], code)
        assert.truthy(msg:find(MODES[mode][2], 1, true), msg)
        assert.are.equal(before, D.snapshot(eng))
        assert.are.equal(c, counters(eng))
        -- and the next step is that of a run that never took the failed one
        set_grads(eng, 4)
        eng:step()
        local ref = make(mode, route, nil)
        for _, s in ipairs({ 1, 2, 4 }) do set_grads(ref, s); ref:step() end
        assert.are.equal(D.snapshot(ref), D.snapshot(eng))
      end)
    end
  end
end)

describe("a load keeps the config the source of truth for every schedulable key of every kind", function()
  local K = require("muon.optim.kinds")
  local stderr_of = H.stderr_of
  -- another valid value of an option
  local function other(v)
    if type(v) == "table" then return { v[1] * 0.5, v[2] } end
    if v == 0 then return 0.05 end
    return v * 0.5
  end
  for _, kind in ipairs(K.names()) do
    local k = K.get(kind)
    for _, key in ipairs(k.SCHEDULE_ORDER) do
      if key ~= "lr" then -- (lr: the schedule's, tests/kind_spec.lua)
        it(("%s.%s: the file's value until the next step, a note naming it, then the config's"):format(kind, key), function()
          local function make(v)
            local g = { optimizer = kind, match = ".", [key] = v }
            local eng = engine.new({ groups = { g } })
            eng:add_param("w", T.randn({ 4, 3 }, 1), T.randn({ 4, 3 }, 2))
            return eng
          end
          local base = k.DEFAULTS[key]
          local a = make(base)
          a:step()
          local path = tmp()
          a:save(path)
          local b = make(other(base))
          local text = stderr_of(function() b:load(path) end)
          os.remove(path)
          assert.truthy(text:find(key .. " = ", 1, true) and text:find("in the checkpoint", 1, true), text)
          assert.are.same(base, b.groups[1].options[key]) -- the checkpoint's, until the next step
          b:step()
          assert.are.same(other(base), b.groups[1].options[key])
          -- the same config: no note
          local c = make(base)
          local p2 = tmp()
          a:save(p2)
          assert.are.equal("", stderr_of(function() c:load(p2) end))
          os.remove(p2)
        end)
      end
    end
  end
end)

describe("foreach.apply_finite (the commit's check of the values it writes)", function()
  local foreach = require("muon.foreach")
  -- (sizes around the vector widths and the threads' split: every kernel
  -- variant and the portable tail see the bad element)
  local SIZES = { 1, 7, 16, 17, 33, 1000, 4099, 70001 }
  for _, dtype in ipairs({ "float32", "float64" }) do
    it(dtype .. ": writes nothing, finds the first tensor whose result would overflow or be NaN", function()
      local big = dtype == "float32" and 3.4e38 or 1.797e308
      for _, cautious in ipairs({ false, true }) do
        for si, n in ipairs(SIZES) do
          local ps, us = {}, {}
          for i = 1, 3 do
            ps[i] = T.randn({ n }, 10 * si + i, dtype)
            us[i] = T.randn({ n }, 100 * si + i, dtype)
          end
          local copies = {}
          for i = 1, 3 do copies[i] = ps[i]:clone() end
          local ok, bad = foreach.apply_finite(ps, us, nil, 0.99, -0.01, cautious)
          assert.is_true(ok)
          assert.is_nil(bad)
          for _, at in ipairs({ 1, n, math.max(1, n - 3) }) do
            for _, case in ipairs({ "overflow", "nan-update", "nan-param" }) do
              local q = ps[2]:view({ n }):narrow(1, at, 1)
              local v = us[2]:view({ n }):narrow(1, at, 1)
              local q0, v0 = q:flat()[1], v:flat()[1]
              if case == "overflow" then q:fill(big); v:fill(-big) -- p * 0.99 - 0.01 * (-big) > max
              elseif case == "nan-update" then v:fill(0 / 0)
              else q:fill(0 / 0) end
              local ok2, bad2 = foreach.apply_finite(ps, us, nil, case == "overflow" and 1.0 or 0.99,
                case == "overflow" and -0.5 or -0.01, cautious)
              assert.is_false(ok2, ("%s n=%d at=%d cautious=%s"):format(case, n, at, tostring(cautious)))
              assert.are.equal(2, bad2)
              q:fill(q0)
              v:fill(v0)
            end
          end
          for i = 1, 3 do H.assert_equal_bits(ps[i], copies[i], "apply_finite wrote nothing") end
        end
      end
    end)
  end
end)
