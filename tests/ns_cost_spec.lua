-- The one Newton-Schulz cost model (src/ns_cost.c, mu_ns_cost_of;
-- muon.ns.cost / shape_cost) against flops and bytes computed by hand from
-- the iterations' products, and its users: the distributed plan's owner
-- loads, `muon check`'s totals and the auto method's choice all give its
-- numbers. Shapes of more than one block (a long side of 8192: the blocked
-- iteration of src/ns_split.c) count its program's products.
local H = require("helpers")
local ns = require("muon.ns")
local D = require("muon.dist")

-- n <= m: the two sides after the transpose.
local function sides(rows, cols) return math.min(rows, cols), math.max(rows, cols) end

describe("the Newton-Schulz cost model", function()
  it("counts the flops each iteration's products perform", function()
    local n, m = sides(768, 3072)
    -- standard, symmetric (syrk counts its triangle): 5 (3 n^2 m + n^3)
    local f, bytes, method = ns.cost(768, 3072)
    assert.are.equal(5 * (3 * n * n * m + n * n * n), f)
    assert.are.equal("standard", method)
    -- elements moved: per step 3nm + 3n^2 (+ 2n^2 for A A), the
    -- normalization nm, in 4 bytes; the float32 input and output
    assert.are.equal(4 * (5 * (3 * n * m + 5 * n * n) + n * m) + 8 * n * m, bytes)
    -- the same either way round
    assert.are.equal(f, (ns.cost(3072, 768)))
    -- plain path: three gemms
    assert.are.equal(5 * (4 * n * n * m + 2 * n * n * n), (ns.cost(768, 3072, { path = "plain" })))
    -- Gram (auto picks it at aspect 4), one restart: 3 (r+1) n^2 m + (6 s - 5 (r+1)) n^3
    f, bytes, method = ns.cost(3072, 768, { method = "auto" })
    assert.are.equal("gram", method)
    assert.are.equal(6 * n * n * m + 20 * n * n * n, f)
    assert.are.equal(4 * (2 * (3 * n * m + 2 * n * n) + 5 * 8 * n * n + n * m) + 8 * n * m, bytes)
    -- a step with c = 0 has no A A: 2 of 3 steps here
    local cubic = { variant = "custom", steps = 3, coefficients = { { 3, -3, 0 }, { 2.5, -1.5, 1 }, { 2.5, -1.5, 0 } } }
    assert.are.equal(3 * 3 * n * n * m + 1 * n * n * n, (ns.cost(768, 3072, cubic)))
    -- 0 steps, empty matrices
    assert.are.equal(0, (ns.cost(768, 3072, { steps = 0 })))
    assert.are.same({ 0, 0, "standard" }, { ns.cost(0, 5) })
  end)

  it("counts the bfloat16 plan's blocks: the tiles on and above the diagonal", function()
    -- 64x96 is one tile per product: A = X X^T and A A whole, B X
    local n, m = 64, 96
    assert.are.equal(5 * (2 * n * n * m + 2 * n * n * n + 2 * n * n * m), (ns.cost(64, 96, { dtype = "bfloat16" })))
    -- 768x768: 4 x 4 blocks of 192, the 10 on and above the diagonal, for
    -- X X^T and A A (inner dimension 768); B X in two column halves
    n = 768
    local per = 2 * 10 * (2 * 192 * 192 * n) + 2 * n * n * n
    local f, bytes = ns.cost(768, 768, { dtype = "bfloat16" })
    assert.are.equal(5 * per, f)
    -- bfloat16 operands are 2 bytes
    assert.are.equal(2 * (5 * (3 * n * n + 5 * n * n) + n * n) + 8 * n * n, bytes)
  end)

  it("counts the blocked iteration's products on shapes of more than one block", function()
    -- 2048x8192: 4 blocks (a syrk and a symm each: 3 n^2 m per step), A A
    -- as 16 row stripes of 128 on the upper trapezoid: n^3 + 128 n^2
    local n, m = 2048, 8192
    H.with_env({ MU_NS_SPLIT_PLAN = false }, function()
      assert.are.equal(5 * (3 * n * n * m + n * n * n + 128 * n * n), (ns.cost(2048, 8192)))
      assert.are.equal(5 * (3 * n * n * m + n * n * n + 128 * n * n), (ns.cost(8192, 2048)))
    end)
    -- the test plan: 40x100 in blocks of 16, stripes of 16 rows (rows 0-15,
    -- 16-31, 32-39): the trapezoid 2 (16 40 + 16 24 + 8 8) = 2176 per column
    n, m = 40, 100
    local trap = 2 * (16 * 40 + 16 * 24 + 8 * 8)
    H.with_env({ MU_NS_SPLIT_PLAN = "64,16,16" }, function()
      assert.are.equal(5 * (3 * n * n * m + trap * n), (ns.cost(40, 100)))
      -- Gram: a restart before step 3 (2 phases); every n x n product is a
      -- symmetric stripe product: 4 s - 3 (r + 1) = 14 of them
      assert.are.equal(2 * 3 * n * n * m + 14 * trap * n, (ns.cost(100, 40, { method = "gram" })))
      -- bfloat16: X X^T on the stripe grid's tiles too, B X whole
      assert.are.equal(5 * (trap * m + trap * n + 2 * n * n * m), (ns.cost(40, 100, { dtype = "bfloat16" })))
      -- c = 0: no A A (2 of 3 steps)
      local cubic = { variant = "custom", steps = 3, coefficients = { { 3, -3, 0 }, { 2.5, -1.5, 1 }, { 2.5, -1.5, 0 } } }
      assert.are.equal(3 * 3 * n * n * m + trap * n, (ns.cost(40, 100, cubic)))
      -- the Gram iteration in bfloat16 is never blocked: its unblocked cost
      local g16 = { dtype = "bfloat16", method = "gram" }
      local whole = H.with_env({ MU_NS_SPLIT_PLAN = "off" }, function() return (ns.cost(40, 100, g16)) end)
      assert.are.equal(whole, (ns.cost(40, 100, g16)))
    end)
    H.with_env({ MU_NS_SPLIT_PLAN = "off" }, function()
      assert.are.equal(5 * (3 * n * n * m + n * n * n), (ns.cost(40, 100)))
    end)
  end)

  it("sums a parameter's core matrices and refuses bad sizes and options", function()
    assert.are.equal(3 * ns.cost(6, 4), (ns.shape_cost({ 3, 6, 4 })))
    assert.are.equal(ns.cost(8, 27, { method = "auto" }), (ns.shape_cost({ 8, 3, 3, 3 }, "flatten", { method = "auto" })))
    assert.are.same({ 0, 0 }, { ns.shape_cost({ 7 }) })
    local ok, err = pcall(ns.cost, -1, 4)
    assert.is_false(ok)
    H.has(err, "cost: rows and cols must be non-negative integers")
    ok, err = pcall(ns.cost, 4, 4, { method = "fast" })
    assert.is_false(ok)
    H.has(err, "method must be 'standard', 'gram' or 'auto', got 'fast'")
  end)

  it("is what the plan balances owners by and what muon check totals", function()
    local auto = ns.resolve({ method = "auto" })
    local mesh = D.mesh({ { "s", 2 } }, 2)
    local function rec(name, shape, opts)
      return { name = name, shape = shape, placement = D.placement({ "R" }, mesh, #shape), group = 1, dtype = "float32",
        ns = true, nd_mode = "batch", ns_opts = opts, state_count = 1 }
    end
    -- with auto, the 256x64 matrix runs the Gram iteration: cheaper than
    -- its standard flops, so the square one is the largest and goes first
    local recs = { rec("wide", { 256, 64 }, auto), rec("square", { 96, 96 }, auto), rec("small", { 8, 8 }, auto) }
    local plan = D.plan(recs, mesh, { rank = 0 })
    local w, s, t = ns.cost(256, 64, auto), ns.cost(96, 96, auto), ns.cost(8, 8, auto)
    assert.is_true(s > w and select(3, ns.cost(256, 64, auto)) == "gram")
    assert.are.same({ [0] = s, [1] = w + t }, plan.ns_load)
    -- muon check: flops per step with the group's options
    local rows = require("muon.engine").check({ groups = { { optimizer = "muon", ns_method = "auto", ns_dtype = "bfloat16",
      ns_steps = 5 } } }, { { name = "w", shape = { 256, 64 } } })
    local tot = require("muon.check").totals(rows)
    assert.are.equal(ns.cost(256, 64, { method = "auto", dtype = "bfloat16" }), tot[1].flops)
  end)
end)
