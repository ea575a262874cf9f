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
