-- Split Newton-Schulz (src/ns_split.c): the blocked iteration run by g
-- virtual ranks in one process (tests/split_virtual.lua: the machines of
-- mu__split_* with in-memory exchanges) gives the bits of one process
-- (mu_ns_zeropower, which runs the same blocked iteration for shapes of
-- more than one block) for every g = 1..64; one process is close to the
-- float64 iteration; the exchanges' bytes match the machines' formula; a
-- bad argument or NaN on one rank fails every rank.
local H = require("helpers")
local SV = require("split_virtual")
local T = H.T
local ns = require("muon.ns")
local core = require("muon.core")
local C = core.C
local ffi = require("ffi")

pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

local function same_bits(a, b, what)
  assert.are.same(a:size(), b:size(), what)
  local es = a:dtype() == "float32" and 4 or 8
  assert(ffi.C.memcmp(a.data, b.data, a:numel() * es) == 0, what .. ": the bits differ")
end

local with_env = H.with_env

local function plan(rows, cols, opts)
  local k, w = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  core.check(C.mu__split_plan(rows, cols, ns.resolve(opts).copts, k, w), "split_plan")
  return tonumber(k[0]), tonumber(w[0])
end

-- The test plan: blocks of 16 from a long side of 64, stripes of 16 rows
-- (MU_NS_SPLIT_PLAN, the documented knob), so that small matrices have
-- several blocks and stripes; one worker per machine (the worker count
-- does not change the bits: checked below), which keeps 64 machines quick.
local SMALL = { MU_NS_SPLIT_PLAN = "64,16,16", MU_NS_THREADS = "1" }

describe("ns split: the plan", function()
  it("blocks along the long side from 8192, of 2048, the shape alone", function()
    with_env({ MU_NS_SPLIT_PLAN = false }, function()
      -- the bench shapes (and everything below 8192) keep one block: today's bits
      for _, s in ipairs({ { 768, 3072 }, { 1024, 4096 }, { 2048, 2048 }, { 4096, 8191 }, { 8191, 300 } }) do
        assert.are.same({ 1, math.max(s[1], s[2]) }, { plan(s[1], s[2]) }, table.concat(s, "x"))
      end
      assert.are.same({ 4, 2048 }, { plan(2048, 8192) })
      assert.are.same({ 4, 2048 }, { plan(8192, 2048) })
      assert.are.same({ 5, 2048 }, { plan(16, 8193) })
      assert.are.same({ 4, 2048 }, { plan(8192, 8192, { dtype = "bfloat16" }) })
      -- the plain path and the AOL preconditioning keep the unblocked iteration
      assert.are.same({ 1, 8192 }, { plan(16, 8192, { path = "plain" }) })
      assert.are.same({ 1, 8192 }, { plan(16, 8192, { variant = "aol" }) })
    end)
    with_env({ MU_NS_SPLIT_PLAN = "off" }, function() assert.are.same({ 1, 9000 }, { plan(16, 9000) }) end)
    with_env({ MU_NS_SPLIT_PLAN = "64,16,16" }, function() assert.are.same({ 6, 16 }, { plan(96, 96) }) end)
  end)

  it("deals blocks in rank order and stripes by cost; the piece is the blocks' columns (rows when tall)", function()
    with_env(SMALL, function()
      local r = ns.resolve({})
      local x = T.randn({ 40, 100 }, 1)
      local covered = 0
      for q = 0, 9 do -- 7 blocks, 3 stripes over 10 ranks: some ranks hold neither
        local m = SV.machine(x, r, 10, q)
        local i = m.info
        assert.are.equal(7, tonumber(i.blocks))
        assert.are.equal(16, tonumber(i.width))
        assert.are.equal(3, tonumber(i.stripes))
        assert.are.equal(1, tonumber(i.dim))
        assert.are.equal(covered, m.start)
        assert.are.equal(math.floor(q * 7 / 10), tonumber(i.first_block))
        covered = covered + m.length
      end
      assert.are.equal(100, covered)
      local t = SV.machine(T.randn({ 100, 40 }, 1), r, 3, 2)
      assert.are.equal(0, tonumber(t.info.dim))
      assert.are.equal(4 * 16, t.start) -- blocks 4..6: rows 64..99
      assert.are.equal(36, t.length)
    end)
  end)

  it("gives a rank's info without its machine (mu__split_info_of), and its share of the cost model's flops", function()
    with_env(SMALL, function()
      local info = ffi.new("mu__split_info[1]")
      for _, c in ipairs({ { 40, 100, {} }, { 100, 40, {} }, { 96, 96, { method = "gram" } },
        { 40, 100, { dtype = "bfloat16" } }, { 40, 100, { variant = "legacy", steps = 3 } } }) do
        local r = ns.resolve(c[3])
        local x = T.randn({ c[1], c[2] }, 1)
        local whole = ns.cost(c[1], c[2], c[3])
        for _, g in ipairs({ 1, 2, 3, 7, 10 }) do
          local sum = 0
          for q = 0, g - 1 do
            local what = ("%dx%d %s g %d rank %d"):format(c[1], c[2], c[3].method or c[3].dtype or "", g, q)
            local m = SV.machine(x, r, g, q)
            core.check(C.mu__split_info_of(C.MU_F32, c[1], c[2], r.copts, g, q, info), "split_info_of")
            for _, f in ipairs({ "blocks", "width", "stripes", "first_block", "nblocks", "start", "length",
              "exchanges", "bytes_sent", "bytes_recv", "call_bytes_sent", "workspace_bytes" }) do
              assert.are.equal(tonumber(m.info[f]), tonumber(info[0][f]), what .. " " .. f)
            end
            assert.are.equal(m.info.flops, info[0].flops, what)
            local sc = ns.split_cost(c[1], c[2], c[3], g, q)
            assert.are.equal(info[0].flops, sc.flops, what)
            sum = sum + info[0].flops
          end
          -- the shares add up to one process's flops (integers: exact)
          assert.are.equal(whole, sum, ("%dx%d g %d"):format(c[1], c[2], g))
        end
      end
      -- by hand: 40 x 100, 5 steps of asym5 (c != 0 in each), g = 7: one
      -- block of 16 per rank (the last 4), stripes of 16 rows (0, 16, 32)
      -- dealt by cost 16*40, 16*24, 8*8 to ranks 0, 1, 2: rank 0 computes
      -- 5 (3 40^2 16 + 2 16 40 40) flops, rank 6 (4 columns, no stripe)
      -- 5 (3 40^2 4)
      assert.are.equal(5 * (3 * 1600 * 16 + 2 * 16 * 40 * 40), ns.split_cost(40, 100, {}, 7, 0).flops)
      assert.are.equal(5 * (3 * 1600 * 4), ns.split_cost(40, 100, {}, 7, 6).flops)
      assert.is_nil(ns.split_cost(60, 60, {}, 2, 0)) -- one block: nothing to split
      assert.has_error(function() ns.split_cost(40, 100, {}, 2, 2) end,
        "split_cost: split ns: rank 2 of a group of 2 (0 <= rank < group)")
    end)
  end)

  it("keeps the Gram iteration in bfloat16 whole at every size: the method decides, from shape and options", function()
    with_env({ MU_NS_SPLIT_PLAN = false }, function()
      local g16 = { dtype = "bfloat16", method = "gram" }
      assert.are.same({ 1, 8192 }, { plan(2048, 8192, g16) })
      assert.are.same({ 1, 8192 }, { plan(8192, 16, g16) })
      assert.are.same({ 4, 2048 }, { plan(2048, 8192, { method = "gram" }) }) -- float32 Gram: blocked
      -- auto in bfloat16: blocked exactly where it resolves to the standard iteration
      local seen = {}
      for _, sh in ipairs({ { 16, 8192 }, { 2048, 8192 }, { 4096, 8192 }, { 8192, 8192 }, { 8192, 1024 } }) do
        local auto = { dtype = "bfloat16", method = "auto" }
        local method = ns.method_for(sh[1], sh[2], auto)
        seen[method] = true
        assert.are.equal(method == "gram" and 1 or 4, (plan(sh[1], sh[2], auto)), table.concat(sh, "x") .. " " .. method)
      end
      assert.is_true(seen.gram and seen.standard)
      local box = ffi.new("mu__split *[1]")
      assert.are.equal(C.MU_EINVAL, C.mu__split_new(C.MU_F32, 2048, 8192, ns.resolve(g16).copts, 2, 0, box))
      H.has(ffi.string(C.mu_last_error()), "the bfloat16 Gram iteration")
    end)
  end)

  it("refuses a shape of one block, a bad rank, a bad dtype", function()
    with_env({ MU_NS_SPLIT_PLAN = false }, function()
      local r = ns.resolve({})
      local box = ffi.new("mu__split *[1]")
      assert.are.equal(C.MU_EINVAL, C.mu__split_new(C.MU_F32, 1024, 4096, r.copts, 2, 0, box))
      assert.truthy(ffi.string(C.mu_last_error()):find("one block", 1, true))
      assert.are.equal(C.MU_EINVAL, C.mu__split_new(C.MU_F32, 16, 8192, r.copts, 2, 2, box))
      assert.are.equal(C.MU_EDTYPE, C.mu__split_new(C.MU_BF16, 16, 8192, r.copts, 2, 0, box))
      assert.are.equal(C.MU_EDTYPE, C.mu__split_new(C.MU_F64, 16, 8192,
        ns.resolve({ dtype = "bfloat16" }).copts, 2, 0, box))
    end)
  end)
end)

describe("ns split: g virtual ranks give one process's bits", function()
  local shapes = {
    { "square", { 64, 64 } }, { "wide", { 40, 100 } }, { "tall", { 100, 40 } }, { "batched", { 3, 40, 100 } },
  }
  local iterations = {
    { "float32 standard", {} }, { "float32 gram", { method = "gram" } },
    { "bfloat16", { dtype = "bfloat16" } }, { "float64 standard", {}, "float64" },
    -- c = 0 (no A A); coefficients applied in float32 (a preset not the seed's)
    { "float32 cubic5", { variant = "cubic5" } }, { "bfloat16 cubic5", { dtype = "bfloat16", variant = "cubic5" } },
    { "bfloat16 polar_express", { dtype = "bfloat16", variant = "polar_express" } },
  }
  for _, it_ in ipairs(iterations) do
    for _, shape in ipairs(shapes) do
      it(("%s, %s %s: g = 1..64"):format(it_[1], shape[1], table.concat(shape[2], "x")), function()
        with_env(SMALL, function()
          local x = T.randn(shape[2], 11, it_[3] or "float32")
          local r = ns.resolve(it_[2])
          local one = ns.zeropower(x, it_[2])
          for g = 1, 64 do
            local y, exchanges = SV.run(x, r, g)
            same_bits(y, one, "g = " .. g)
            if g == 1 then assert.are.equal(0, exchanges) end
          end
        end)
      end)
    end
  end

  it("the real plan: 16 x 8200, 8200 x 24 and 2 x 24 x 8200 (5 blocks of 2048, the last of 8)", function()
    with_env({ MU_NS_SPLIT_PLAN = false, MU_NS_THREADS = "1" }, function()
      for _, c in ipairs({ { { 16, 8200 }, {} }, { { 8200, 24 }, { method = "gram" } },
                           { { 2, 24, 8200 }, { dtype = "bfloat16" } } }) do
        local x = T.randn(c[1], 3)
        local one = ns.zeropower(x, c[2])
        for _, g in ipairs({ 1, 2, 3, 5, 7 }) do
          same_bits(SV.run(x, ns.resolve(c[2]), g), one, table.concat(c[1], "x") .. " g = " .. g)
        end
      end
    end)
  end)

  it("one process: the same bits on 1 and 2 workers, in place, in a call of several tensors", function()
    with_env({ MU_NS_SPLIT_PLAN = "64,16,16" }, function()
      for _, opts in ipairs({ {}, { method = "gram" }, { dtype = "bfloat16" } }) do
        local x = T.randn({ 96, 200 }, 21)
        local r = ns.resolve(opts)
        local ref = with_env({ MU_NS_THREADS = "1" }, function() return ns.zeropower(x, opts) end)
        same_bits(with_env({ MU_NS_THREADS = "2" }, function() return ns.zeropower(x, opts) end), ref, "2 workers")
        local inplace = x:clone()
        ns.zeropower_into(inplace, inplace, r)
        same_bits(inplace, ref, "in place")
        local small = T.randn({ 8, 12 }, 22) -- one block: the unblocked iteration beside it
        local outs = ns.zeropower_many({ T.zeros({ 8, 12 }), T.zeros({ 96, 200 }) }, { small, x }, r)
        same_bits(outs[2], ref, "zeropower_many")
        same_bits(outs[1], ns.zeropower(small, opts), "zeropower_many, the small one")
      end
    end)
  end)

  it("the Gram guard's fallback: the standard iteration's bits, on every g", function()
    with_env({ MU_NS_SPLIT_PLAN = "64,16,16", MU_NS_THREADS = "1", MU_NS_GRAM_GUARD = "fail" }, function()
      local x = T.randn({ 40, 100 }, 23)
      local want = ns.zeropower(x)
      same_bits(ns.zeropower(x, { method = "gram" }), want, "one process")
      local inplace = x:clone()
      ns.zeropower_into(inplace, inplace, ns.resolve({ method = "gram" }))
      same_bits(inplace, want, "one process, in place")
      for _, g in ipairs({ 2, 3, 7, 9 }) do
        same_bits(SV.run(x, ns.resolve({ method = "gram" }), g), want, "g = " .. g)
      end
    end)
  end)
end)

describe("ns split: what the blocked iteration takes from the unblocked ones", function()
  it("the Gram iteration in bfloat16 runs unblocked where the others are blocked, its guard's fallback too", function()
    local x = T.randn({ 40, 100 }, 24)
    local g16 = { dtype = "bfloat16", method = "gram" }
    local function run(plan_env, opts, guard)
      return with_env({ MU_NS_SPLIT_PLAN = plan_env, MU_NS_GRAM_GUARD = guard or false },
        function() return ns.zeropower(x, opts) end)
    end
    same_bits(run("64,16,16", g16), run("off", g16), "one process")
    assert.is_true(H.max_abs_diff(run("64,16,16", g16), run("64,16,16", { dtype = "bfloat16" })) > 0,
      "not the blocked standard iteration")
    -- its guard's fallback (the standard bfloat16 iteration from its
    -- normalized input) stays unblocked too
    same_bits(run("64,16,16", g16, "fail"), run("off", g16, "fail"), "the guard's fallback")
    assert.is_true(H.max_abs_diff(run("off", g16, "fail"), run("off", g16)) > 0, "the guard failed")
  end)

  it("bfloat16 applies a preset's coefficients in float32 and the seed's rounded, as unblocked", function()
    -- polar_express's triples as "custom" (a seed variant: rounded to
    -- bfloat16) against the preset (kept in float32): the blocked results
    -- differ as the unblocked ones do
    local triples, norm_scale = ns.coefficients("polar_express")
    local rounded = { dtype = "bfloat16", variant = "custom", coefficients = triples, norm_scale = norm_scale }
    local kept = { dtype = "bfloat16", variant = "polar_express" }
    local x = T.randn({ 40, 100 }, 25)
    local function diff(plan_env)
      return with_env({ MU_NS_SPLIT_PLAN = plan_env }, function()
        return H.max_abs_diff(ns.zeropower(x, rounded), ns.zeropower(x, kept))
      end)
    end
    local blocked, whole = diff("64,16,16"), diff("off")
    assert.is_true(whole > 1e-3 and blocked > 0.25 * whole, ("blocked %g, unblocked %g"):format(blocked, whole))
  end)
end)

describe("ns split: every scale", function()
  -- The blocked iteration's normalization is the seed's X / (norm_scale
  -- ||X|| + eps) from float32's smallest subnormal to 3e38 (bfloat16: on
  -- c x for a power of two c outside [2^-60, 2^60], as unblocked), within
  -- its own error at scale 1 of the unblocked float64 iteration; and g
  -- ranks give one process's bits at the extremes.
  local configs = { { "float32", {} }, { "float32 gram", { method = "gram" } }, { "bfloat16", { dtype = "bfloat16" } },
    { "bfloat16 polar_express", { dtype = "bfloat16", variant = "polar_express" } } }
  for _, c in ipairs(configs) do
    it(c[1] .. ": 40x100 and 100x40 in 7 blocks, 1e-45 to 3e38", function()
      with_env(SMALL, function()
        local ref_opts = { variant = c[2].variant }
        local function ref(x)
          return with_env({ MU_NS_SPLIT_PLAN = "off" }, function() return ns.zeropower(x:clone("float64"), ref_opts) end)
        end
        for k, shape in ipairs({ { 40, 100 }, { 100, 40 } }) do
          local x1 = H.scaled_randn(shape, 80 + k, 1)
          local tol = 4 * H.max_abs_diff(ns.zeropower(x1, c[2]), ref(x1)) + 1e-5
          for _, sc in ipairs(H.NS_SCALES) do
            local x = H.scaled_randn(shape, 80 + k, sc)
            local got, want = ns.zeropower(x, c[2]), ref(x)
            local d = H.max_abs_diff(got, want)
            assert.is_true(d <= tol, ("%dx%d at %g: max |got - float64| = %g > %g; |got| %g, |float64| %g"):format(
              shape[1], shape[2], sc, d, tol, got:abs():amax(), want:abs():amax()))
            if sc == 1e-45 or sc == 3e38 then
              same_bits(SV.run(x, ns.resolve(c[2]), 3), got, ("g = 3 at %g"):format(sc))
            end
          end
        end
      end)
    end)
  end
end)

describe("ns split: accuracy of one process against the float64 iteration", function()
  -- The reference: the unblocked float64 standard iteration (ns_spec checks
  -- it against the seed's golden outputs). Measured (SkylakeX): float32
  -- standard 2.8e-8 to 3.1e-7 (the unblocked iteration 3.8e-8 to 4.7e-7),
  -- gram 3.8e-8 to 8.7e-7, float64 below 1e-15, bfloat16 the unblocked
  -- bfloat16 iteration's error to 3 digits (1.9e-3 to 1.7e-2).
  local function ref(x)
    return with_env({ MU_NS_SPLIT_PLAN = "off" }, function() return ns.zeropower(x:to("float64")) end)
  end
  for _, c in ipairs({ { "64,16,16", { 96, 96 } }, { "64,16,16", { 3, 40, 100 } }, { false, { 24, 8200 } },
                       { false, { 8200, 16 } } }) do
    it(table.concat(c[2], "x"), function()
      with_env({ MU_NS_SPLIT_PLAN = c[1] }, function()
        local x = T.randn(c[2], 31)
        local want = ref(x)
        assert(H.max_abs_diff(ns.zeropower(x), want) < 1e-6, "float32 standard")
        assert(H.max_abs_diff(ns.zeropower(x, { method = "gram" }), want) < 2e-6, "float32 gram")
        assert(H.max_abs_diff(ns.zeropower(x:to("float64")), want) < 1e-13, "float64")
        local e_split = H.max_abs_diff(ns.zeropower(x, { dtype = "bfloat16" }), want)
        local e_whole = with_env({ MU_NS_SPLIT_PLAN = "off" }, function()
          return H.max_abs_diff(ns.zeropower(x, { dtype = "bfloat16" }), want)
        end)
        assert(e_split < 1.25 * e_whole, ("bfloat16: %.3g, unblocked %.3g"):format(e_split, e_whole))
      end)
    end)
  end
end)

describe("ns split: exchanges and failures", function()
  it("the exchanges move the bytes of the machines' formula", function()
    with_env(SMALL, function()
      for _, c in ipairs({ { {}, "float32" }, { { method = "gram" }, "float32" }, { { dtype = "bfloat16" }, "float32" },
                           { {}, "float64" } }) do
        local x = T.randn({ 2, 40, 100 }, 41, c[2])
        local r = ns.resolve(c[1])
        for _, g in ipairs({ 2, 3, 8, 11 }) do
          local ms, pieces, xs = {}, {}, {}
          local sent, recv = {}, {}
          for q = 0, g - 1 do
            ms[q] = SV.machine(x, r, g, q)
            pieces[q] = SV.piece(x, ms[q])
            C.mu__split_begin(ms[q].ptr, pieces[q], pieces[q])
            xs[q], sent[q], recv[q] = ffi.new("mu__split_xfer"), 0, 0
          end
          local ES = { [tonumber(C.MU_F32)] = 4, [tonumber(C.MU_F64)] = 8, [tonumber(C.MU_BF16)] = 2 }
          local calls = 0
          while C.mu__split_next(ms[0].ptr, xs[0]) == 1 do
            for q = 1, g - 1 do assert.are.equal(1, C.mu__split_next(ms[q].ptr, xs[q])) end
            calls = calls + 1
            for q = 0, g - 1 do
              local xq, es = xs[q], ES[tonumber(xs[q].dtype)]
              for p = 0, g - 1 do
                if p ~= q then
                  local s = xq.op == C.MU__SPLIT_ALLTOALLV and xq.sendcounts[p] or xq.sendcount
                  sent[q] = sent[q] + tonumber(s) * es
                  recv[q] = recv[q] + tonumber(xq.recvcounts[p]) * es
                end
              end
            end
            SV.exchange(xs, g)
          end
          for q = 1, g - 1 do assert.are.equal(0, C.mu__split_next(ms[q].ptr, xs[q])) end
          for q = 0, g - 1 do
            local i = ms[q].info
            local what = ("%s g %d rank %d"):format(c[1].method or c[1].dtype or c[2], g, q)
            assert.are.equal(tonumber(i.call_exchanges + 2 * i.exchanges), calls, what)
            assert.are.equal(tonumber(i.call_bytes_sent + 2 * i.bytes_sent), sent[q], what .. " sent")
            assert.are.equal(tonumber(i.call_bytes_recv + 2 * i.bytes_recv), recv[q], what .. " received")
          end
        end
      end
    end)
  end)

  it("a bad piece or a NaN on one rank fails every rank; nothing is written", function()
    with_env(SMALL, function()
      local x = T.randn({ 40, 100 }, 51)
      local r = ns.resolve({})
      local g = 3
      local function pieces()
        local ps = {}
        for q = 0, g - 1 do ps[q] = SV.piece(x, SV.machine(x, r, g, q)) end
        return ps
      end
      -- rank 1's piece has the wrong width: every rank fails with its status
      local ps = pieces()
      ps[1] = T.zeros({ 40, 7 })
      local ok, err = pcall(SV.run, x, r, g, ps)
      assert.is_false(ok)
      assert.are.equal(C.MU_ESHAPE, err.code)
      -- a NaN in rank 2's piece: MU_ENONFINITE everywhere, the pieces unchanged
      ps = pieces()
      ps[2]:set(0 / 0, 3, 5)
      local before = {}
      for q = 0, g - 1 do before[q] = ps[q]:clone() end
      ok, err = pcall(SV.run, x, r, g, ps)
      assert.is_false(ok)
      assert.are.equal(C.MU_ENONFINITE, err.code)
      assert.truthy(tostring(err):find("input matrix 0", 1, true))
      for q = 0, 1 do same_bits(ps[q], before[q], "rank " .. q .. " unchanged") end
    end)
  end)

  it("one process: a zero matrix gives zeros, 0 steps only normalize, a NaN fails before any write", function()
    with_env({ MU_NS_SPLIT_PLAN = "64,16,16" }, function()
      local z = ns.zeropower(T.zeros({ 2, 40, 100 }))
      assert.are.equal(0, z:abs():amax())
      local x = T.randn({ 40, 100 }, 61)
      local y0 = ns.zeropower(x, { steps = 0 })
      assert(H.max_abs_diff(y0, x:to("float64") / x:to("float64"):norm()) < 1e-6, "0 steps")
      local b = T.randn({ 2, 40, 100 }, 62)
      local out = T.zeros({ 2, 40, 100 })
      b:set(1 / 0, 2, 1, 1)
      local ok, err = pcall(ns.zeropower_into, out, b, ns.resolve({}))
      assert.is_false(ok)
      assert.are.equal(C.MU_ENONFINITE, err.code)
      assert.are.equal(0, out:abs():amax())
    end)
  end)

  it("the workspace counts the blocked iteration's buffers", function()
    with_env({ MU_NS_SPLIT_PLAN = "64,16,16" }, function()
      local ws = ns.workspace("float32", 40, 100)
      local bytes = ffi.new("int64_t[1]")
      C.mu_ns_workspace_bytes(ws, bytes)
      local before = tonumber(bytes[0])
      ns.zeropower(T.randn({ 40, 100 }, 71), { workspace = ws })
      C.mu_ns_workspace_bytes(ws, bytes)
      assert(tonumber(bytes[0]) > before, "grown")
      local after = tonumber(bytes[0])
      ns.zeropower(T.randn({ 40, 100 }, 72), { workspace = ws })
      C.mu_ns_workspace_bytes(ws, bytes)
      assert.are.equal(after, tonumber(bytes[0]))
    end)
  end)
end)
