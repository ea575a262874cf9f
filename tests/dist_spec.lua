-- Distributed planning (muon.dist) and the single-process communicator
-- backend: chunk sizes, mesh coordinates, placements, local boxes, NS
-- owners, the byte formula, against hand-computed values.
local T = require("muon.tensor")
local D = require("muon.dist")
local comm = require("muon.comm")
local H = require("helpers")

local function chunks(n, k)
  local r = {}
  for i = 0, k - 1 do
    local s, l = D.chunk(n, k, i)
    r[#r + 1] = s .. "+" .. l
  end
  return table.concat(r, " ")
end

describe("dist.chunk (torch.chunk sizes)", function()
  it("splits evenly and unevenly, last pieces smaller or empty", function()
    assert.are.equal("0+3 3+3 6+3 9+1", chunks(10, 4))
    assert.are.equal("0+3 3+3 6+1", chunks(7, 3))
    assert.are.equal("0+1 1+1 2+0 2+0", chunks(2, 4))
    assert.are.equal("0+2 2+2 4+1 5+0", chunks(5, 4)) -- ceil(5/4)=2: 2,2,1,0
    assert.are.equal("0+0 0+0", chunks(0, 2))
    assert.are.equal("0+5", chunks(5, 1))
  end)
end)

describe("dist.mesh", function()
  it("maps ranks row-major, last axis fastest", function()
    local m = D.mesh({ { "r", 2 }, { "s", 3 } }, 6)
    assert.are.same({ 1, 1 }, m:coords(4))
    assert.are.same({ 1, 2 }, m:coords(5))
    assert.are.same({ 0, 2 }, m:coords(2))
    assert.are.equal(3, m:rank_of({ 1, 0 }))
    assert.are.equal("(r=2, s=3)", m:describe())
  end)
  it("has at most 2^31 - 1 ranks (MPI numbers them with C ints), and says so", function()
    assert.are.equal(2147483647, D.MAX_RANKS)
    assert.are.equal(2147483647, D.mesh({ { "world", 2147483647 } }, 2147483647).size)
    for _, spec in ipairs({ { { "world", 2147483648 } }, { { "r", 65536 }, { "s", 65536 } }, { { "w", math.huge } } }) do
      local ok, err = pcall(D.mesh, spec)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("more than the 2147483647 MPI can number (its ranks are C ints)", 1, true),
        tostring(err))
    end
  end)
  it("rejects a size product different from the world and bad axes", function()
    assert.has_error(function() D.mesh({ { "r", 2 }, { "s", 2 } }, 6) end,
      "dist.mesh: axis sizes (r=2, s=2) multiply to 4 but the world has 6 ranks")
    assert.has_error(function() D.mesh({ { "r", 0 } }, 1) end)
    assert.has_error(function() D.mesh({ { "r", 1 }, { "r", 1 } }, 1) end, "dist.mesh: axis name 'r' appears twice")
  end)
end)

describe("dist.placement and local_box", function()
  local m = D.mesh({ { "a", 2 }, { "b", 2 } }, 4)
  it("parses the accepted spellings", function()
    local pl = D.placement({ "replicate", { "shard", 2 } }, m, 2)
    assert.are.equal("(R,S(2))", D.placement_string(pl))
    assert.are.equal("(S(1),R)", D.placement_string(D.placement({ "S(1)", "R" }, m, 2)))
    assert.are.equal("(R,S(1))", D.placement_string(D.placement({ b = "shard(1)" }, m, 2)))
    assert.are.equal("(R,R)", D.placement_string(D.placement(nil, m, 2)))
  end)
  it("rejects bad placements naming the problem", function()
    assert.has_error(function() D.placement({ "R" }, m, 2) end, "placement has 1 entries but the mesh (a=2, b=2) has 2 axes")
    assert.has_error(function() D.placement({ "R", "S(3)" }, m, 2) end, "placement[2] shards dim 3 of a 2-D tensor")
    assert.has_error(function() D.placement({ c = "R" }, m, 2) end, "placement names axis 'c', which the mesh (a=2, b=2) does not have")
    assert.has_error(function() D.placement({ "R", "split" }, m, 2) end)
  end)
  it("shards two dims over two axes", function()
    local pl = D.placement({ "S(1)", "S(2)" }, m, 2)
    local b = D.local_box({ 9, 7 }, pl, m, 3) -- coords (1,1)
    assert.are.same({ 5, 4 }, b.start)
    assert.are.same({ 4, 3 }, b.len)
    b = D.local_box({ 9, 7 }, pl, m, 1) -- coords (0,1)
    assert.are.same({ 0, 4 }, b.start)
    assert.are.same({ 5, 3 }, b.len)
  end)
  it("nests two axes sharding the same dim in mesh order", function()
    local pl = D.placement({ "S(1)", "S(1)" }, m, 2)
    local want = { { 0, 4 }, { 4, 3 }, { 7, 3 }, { 10, 3 } } -- 13 -> 7 | 6 -> 4,3 | 3,3
    for r = 0, 3 do
      local b = D.local_box({ 13, 3 }, pl, m, r)
      assert.are.same({ want[r + 1][1], 0 }, b.start)
      assert.are.same({ want[r + 1][2], 3 }, b.len)
    end
  end)
  it("gives empty local shards", function()
    local m4 = D.mesh({ { "s", 4 } }, 4)
    local pl = D.placement({ "S(1)" }, m4, 2)
    assert.are.same({ 0, 9 }, D.local_shape({ 2, 9 }, pl, m4, 3))
    assert.are.same({ 1, 9 }, D.local_shape({ 2, 9 }, pl, m4, 1))
  end)
end)

describe("dist NS cost and owners", function()
  it("core shapes and flops: one rule (muon.ns), honouring nd_mode", function()
    local ns = require("muon.ns")
    local function core(shape, mode) local a, b, k = ns.core(shape, mode) return { a, b, k } end
    assert.are.same({ 6, 5, 1 }, core({ 6, 1, 5 }))
    assert.are.same({ 6, 4, 3 }, core({ 3, 6, 4 }))
    assert.are.same({ 3, 24, 1 }, core({ 3, 6, 4 }, "flatten"))
    assert.are.same({ 8, 27, 1 }, core({ 8, 3, 3, 3 }, "flatten"))
    assert.are.same({ 3, 3, 24 }, core({ 8, 3, 3, 3 }, "batch"))
    assert.is_nil(ns.core({ 7 }))
    -- the default iteration, 5 symmetric steps: 5 (3 m^2 n + m^3), m the
    -- smaller side; m=4, n=6: 5 (288 + 64) = 1760 per matrix
    local function flops(shape, mode) return (ns.shape_cost(shape, mode)) end
    assert.are.equal(3 * 1760, flops({ 3, 6, 4 }))
    assert.are.equal(1760, flops({ 4, 6 }))
    -- flatten: the cost of the flattened (out, in*kh*kw) matrix, by hand:
    -- m=8, n=27: 5 (3*64*27 + 512) = 28480 (the batch reading costs 24 3x3s)
    assert.are.equal(28480, flops({ 8, 3, 3, 3 }, "flatten"))
    assert.are.equal(flops({ 8, 27 }), flops({ 8, 3, 3, 3 }, "flatten"))
    assert.are.equal(24 * 5 * (3 * 27 + 27), flops({ 8, 3, 3, 3 }, "batch"))
    assert.are.equal(0, flops({ 5 }))
  end)
  it("assigns largest first to the least loaded, ties to the smallest coordinate", function()
    local owners, load = D.build_owner_by_size({ 5, 9, 9, 3, 7 }, 2)
    assert.are.same({ 1, 0, 1, 1, 0 }, owners)
    assert.are.same({ [0] = 16, [1] = 17 }, load)
    owners = D.build_owner_by_size({ 4, 4, 4, 4 }, 3)
    assert.are.same({ 0, 1, 2, 0 }, owners)
    owners = D.build_owner_by_size({ 1 }, 4)
    assert.are.same({ 0 }, owners)
  end)
  it("plans state holders, owners and batches per group and shard count", function()
    local m = D.mesh({ { "s", 2 } }, 2)
    local function recs_of()
      local function rec(name, shape, pl, group, ns)
        return { name = name, shape = shape, placement = D.placement(pl, m, #shape), group = group, ns = ns,
          dtype = "float32", state_count = ns and 1 or 2 }
      end
      return {
        rec("a", { 4, 4 }, { "S(1)" }, 1, true),
        rec("b", { 8, 8 }, { "S(1)" }, 2, true),
        rec("c", { 8, 8 }, { "S(1)" }, 1, true),
        rec("d", { 8 }, { "S(1)" }, 3, false),
        rec("e", { 2, 2 }, { "R" }, 1, true),
      }
    end
    local recs = recs_of()
    local plan = D.plan(recs, m, { max_batch_numel = 16, rank = 0 })
    -- Owners largest first by flops (the cost model, default options: 5 (3
    -- m^2 n + m^3) = 20 n^3 for n x n) onto the least loaded rank, ties to
    -- the smaller: b (10240) to rank 0, c (10240) to rank 1, a (1280) to
    -- rank 0, then e (160) to rank 1.
    assert.are.equal(0, recs[2].owner)
    assert.are.equal(1, recs[3].owner)
    assert.are.equal(0, recs[1].owner)
    assert.are.equal(1, recs[5].owner)
    assert.are.same({ [0] = 10240 + 1280, [1] = 10240 + 160 }, plan.ns_load)
    -- Sharded boxes: every rank holds its own (one class); e: its owner.
    assert.is_true(recs[1].holds)
    assert.is_false(recs[5].holds)
    local p1 = D.plan(recs_of(), m, { max_batch_numel = 16, rank = 1 })
    assert.is_true(p1.records[5].holds)
    assert.is_true(p1.records[4].holds)
    -- AdamW: one item per box, computed by its holder.
    assert.are.equal(1, #recs[4].items)
    assert.are.equal(0, recs[4].items[1].owner)
    assert.are.equal(1, p1.records[4].items[1].owner)
    -- Batches: per (group, shard count), 16 / 2 elements but at least 2
    -- records per sharded batch, interleaved.
    local got = {}
    for i, b in ipairs(plan.batches) do
      local names = {}
      for j, r in ipairs(b.records) do names[j] = r.name end
      got[i] = table.concat(names, ",")
    end
    assert.are.same({ "e", "a,c", "b", "d" }, got)
    -- e moves only its update (to the other replica); a moves in and out.
    assert.are.same({ false, true, true, true }, { recs[5].moves_in, recs[5].moves_out, recs[1].moves_in, recs[1].moves_out })
  end)
  it("splits the largest matrices' Newton-Schulz over groups of ranks (split_ns), the same on every rank", function()
    local ns = require("muon.ns")
    H.with_env({ MU_NS_SPLIT_PLAN = "64,16,16" }, function()
      local m = D.mesh({ { "r", 2 }, { "s", 2 } }, 4)
      local function recs_of()
        local function rec(name, shape)
          return { name = name, shape = shape, placement = D.placement({ "R", "S(1)" }, m, #shape), group = 1,
            ns = true, dtype = "float32", state_count = 1 }
        end
        -- 40 x 100: 7 blocks; 20 x 60 has a long side below 64: one block
        return { rec("big", { 40, 100 }), rec("small", { 20, 60 }), rec("tiny", { 8, 8 }) }
      end
      local big, small = ns.cost(40, 100), ns.cost(20, 60)
      local function plan(rank, split_ns)
        return D.plan(recs_of(), m, { rank = rank, split_ns = split_ns })
      end
      -- off: one owner per matrix; the largest rank holds all of big
      local p = plan(0, "off")
      assert.is_nil(p.records[1].ns_group)
      assert.are.equal(big, p.ns_load[p.records[1].owner])
      -- auto: big (above 1.05 x the mean by itself) splits; small cannot
      -- (one block) and keeps one owner; every rank plans the same groups
      local groups
      for q = 0, 3 do
        p = plan(q)
        local g = p.records[1].ns_group
        assert.truthy(g, "big split")
        assert.is_nil(p.records[2].ns_group)
        assert.are.equal(7, g.blocks)
        groups = groups or g.ranks
        assert.are.same(groups, g.ranks, "rank " .. q)
        assert.are.equal(p.records[1].owner, g.ranks[1])
      end
      -- distinct ranks; the shares (ns.split_cost) add up to big's cost
      local seen, sum = {}, 0
      for gq, q in ipairs(groups) do
        assert.is_nil(seen[q])
        seen[q] = true
        sum = sum + ns.split_cost(40, 100, {}, #groups, gq - 1).flops
      end
      assert.are.equal(big, sum)
      local total = 0
      for q = 0, 3 do total = total + p.ns_load[q] end
      assert.are.equal(big + small + ns.cost(8, 8), total)
      assert.is_true(D.imbalance(p) < D.imbalance(plan(0, "off")))
      -- max_group caps the group
      p = plan(0, { max_group = 2 })
      assert.are.equal(2, p.records[1].ns_group.size)
      assert.is_nil(plan(0, { max_group = 1 }).records[1].ns_group)
      -- a loose bound leaves big whole
      assert.is_nil(plan(0, { imbalance = 100 }).records[1].ns_group)
    end)
    -- the moves of a split record's pieces (D.split_moves), as every rank
    -- sees them on a 2 x 2 mesh: what p sends q is what q receives from p
    -- (the same boxes, in the same order), every element of the matrix
    -- reaches the one member whose piece holds it (in), and every rank
    -- holding a box gets each of its elements once (out)
    H.with_env({ MU_NS_SPLIT_PLAN = "64,16,16" }, function()
      local m2 = D.mesh({ { "r", 2 }, { "s", 2 } }, 4)
      for _, pl in ipairs({ { "R", "S(1)" }, { "R", "S(2)" }, { "S(2)", "S(1)" } }) do
        local plans = {}
        for q = 0, 3 do
          local rec = { name = "big", shape = { 40, 100 }, placement = D.placement(pl, m2, 2), group = 1, ns = true,
            dtype = "float32", state_count = 1 }
          plans[q] = D.plan({ rec, { name = "x", shape = { 8, 8 }, placement = D.placement({ "R", "R" }, m2, 2),
            group = 1, ns = true, dtype = "float32", state_count = 1 } }, m2, { rank = q }).records[1]
        end
        assert.truthy(plans[0].ns_group, table.concat(pl, ","))
        for _, out in ipairs({ false, true }) do
          local sent, got, covered = {}, {}, {}
          for q = 0, 3 do
            D.split_moves(plans[q], m2, q, out, function(peer, box, send)
              local key = send and (q .. ">" .. peer) or (peer .. ">" .. q)
              local t = send and sent or got
              t[key] = t[key] or {}
              table.insert(t[key], table.concat(box.start, ",") .. "+" .. table.concat(box.len, ","))
              if not send then
                for i = box.start[1], box.start[1] + box.len[1] - 1 do
                  for j = box.start[2], box.start[2] + box.len[2] - 1 do
                    local e = q .. ":" .. i .. "," .. j
                    assert.is_nil(covered[e], "twice: " .. e)
                    covered[e] = true
                  end
                end
              end
            end)
          end
          assert.are.same(sent, got)
          local n = 0
          for _ in pairs(covered) do n = n + 1 end
          -- in: each element once (to its piece's member); out: once per holder of it
          local holders = 0
          for q = 0, 3 do holders = holders + plans[q].mine_n end
          assert.are.equal(out and holders or 4000, n, table.concat(pl, ",") .. (out and " out" or " in"))
        end
      end
    end)
    -- the options, checked
    for _, c in ipairs({
      { "on", "dist.split_ns must be 'auto', 'off' or a table { max_group = n, imbalance = x }, got the string \"on\"" },
      { { max_group = "2" }, "dist.split_ns.max_group must be an integer >= 1 (ranks per matrix; 1: never split), "
        .. "got the string \"2\"" },
      { { max_group = 0 }, "dist.split_ns.max_group must be an integer >= 1 (ranks per matrix; 1: never split), got 0" },
      { { max_group = 1.5 }, "dist.split_ns.max_group must be an integer >= 1 (ranks per matrix; 1: never split), got 1.5" },
      { { max_group = math.huge }, "dist.split_ns.max_group must be an integer >= 1 (ranks per matrix; 1: never split), "
        .. "got inf" },
      { { imbalance = 0.5 }, "dist.split_ns.imbalance must be a finite number >= 1 (largest rank / mean), got 0.5" },
      { { imbalance = 0 / 0 }, "dist.split_ns.imbalance must be a finite number >= 1 (largest rank / mean), got nan" },
      { { imbalance = math.huge }, "dist.split_ns.imbalance must be a finite number >= 1 (largest rank / mean), got inf" },
      { { imbalance = "1.2" }, "dist.split_ns.imbalance must be a finite number >= 1 (largest rank / mean), "
        .. "got the string \"1.2\"" },
      { { groups = 2 }, "dist.split_ns: unknown key 'groups'; valid keys: imbalance, max_group" },
    }) do
      assert.has_error(function() D.split_options(c[1]) end, c[2])
    end
  end)
  it("keeps batch-sharded parameters where their shards live", function()
    local m = D.mesh({ { "s", 4 } }, 4)
    local function rec(whole)
      return { name = "experts", shape = { 4, 32, 48 }, placement = D.placement({ "S(1)" }, m, 3), group = 1, ns = true,
        dtype = "float32", state_count = 1, whole = whole }
    end
    for q = 0, 3 do
      local r = rec(false)
      local plan = D.plan({ r }, m, { rank = q })
      assert.are.equal(1, #r.items)
      assert.are.equal(q, r.items[1].owner)
      assert.are.same({ 0, 0 }, { D.step_elements(plan, q) })
    end
    -- With a hook that sees the whole parameter it is gathered instead.
    local r = rec(true)
    D.plan({ r }, m, { rank = 0 })
    local o = r.owner
    local plan = D.plan({ rec(true) }, m, { rank = o })
    assert.are.same({ 3 * 32 * 48, 3 * 32 * 48 }, { D.step_elements(plan, o) })
  end)
end)

describe("dist per-rank plan against the brute-force global planner", function()
  local Gp = dofile("tests/fixtures/dist/global_plan.lua")
  -- A small deterministic generator (the same cases on every machine).
  local seed = 12345
  local function rnd(n)
    seed = (seed * 1103515245 + 12345) % 2147483648
    return math.floor(seed / 65536) % n
  end
  local function case()
    local naxes = 1 + rnd(3)
    local spec, W = {}, 1
    for a = 1, naxes do
      spec[a] = { "a" .. a, 1 + rnd(4) }
      W = W * spec[a][2]
    end
    local mesh = D.mesh(spec, W)
    local function records()
      seed = seed -- the same records for every rank: regenerated from a saved seed
      local recs = {}
      for i = 1, 1 + rnd(8) do
        local nd = 1 + rnd(3)
        local shape = {}
        for d = 1, nd do shape[d] = rnd(7) == 0 and 0 or 1 + rnd(9) end
        local pl = {}
        for a = 1, naxes do pl[a] = rnd(2) == 0 and "R" or ("S(" .. (1 + rnd(nd)) .. ")") end
        local isns = nd >= 2 and rnd(3) > 0
        local r = { name = "p" .. i, shape = shape, placement = D.placement(pl, mesh, nd), group = 1 + rnd(2),
          ns = isns, whole = isns and rnd(4) == 0, nd_mode = rnd(2) == 0 and "flatten" or "batch",
          dtype = rnd(3) == 0 and "float64" or "float32", state_count = isns and 1 or 2 }
        if isns and rnd(3) == 0 then
          local hs = {}
          for d = 1, nd do hs[d] = d == nd and 1 or shape[d] end
          r.hooks = { { key = "hook.v", shape = hs } }
        end
        recs[i] = r
      end
      return recs
    end
    return mesh, records
  end
  it("gives every rank the boxes, holders, owners, sources and destinations of the global plan", function()
    local checked = 0
    for _ = 1, 200 do
      local mesh, records = case()
      local s0 = seed
      local balance = rnd(2) == 0 and "numel" or "flops"
      s0 = seed
      local g = Gp.plan(records(), mesh, balance)
      for q = 0, mesh.size - 1 do
        seed = s0
        local plan = D.plan(records(), mesh, { rank = q, balance = balance })
        assert.are.same(Gp.view(g, q), Gp.view_of(plan))
        for r = 0, mesh.size - 1 do assert.equal(g.ns_load[r], plan.ns_load[r]) end
        checked = checked + 1
      end
      seed = s0
      records()
    end
    assert.is_true(checked > 400, checked) -- ranks compared
  end)

  -- (The owner's dests are made on first use: a plan only looked at, as
  -- muon check --world's, counts its bytes without them.)
  it("counts the bytes of a step without listing the owner's dests, as with them; sends match receives", function()
    for _ = 1, 100 do
      local mesh, records = case()
      local s0 = seed
      local sent_all, recv_all = 0, 0
      for q = 0, mesh.size - 1 do
        seed = s0
        local plan = D.plan(records(), mesh, { rank = q })
        local lazy = { D.step_elements(plan, q) }
        for _, r in ipairs(plan.records) do
          for _, it in ipairs(r.items) do D.dests(it) end
        end
        assert.are.same({ D.step_elements(plan, q) }, lazy)
        sent_all, recv_all = sent_all + lazy[1], recv_all + lazy[2]
      end
      assert.are.equal(sent_all, recv_all)
      seed = s0
      records()
    end
  end)

  it("each_box visits the non-empty boxes each_coords would, in its order, and no empty one", function()
    for _ = 1, 100 do
      local mesh, records = case()
      for _, r in ipairs(records()) do
        local axes = {}
        for a, p in ipairs(r.placement) do if p.kind == "S" then axes[#axes + 1] = a end end
        local want, got, zeros = {}, {}, {}
        for a = 1, #mesh.sizes do zeros[a] = 0 end
        D.each_coords(mesh, axes, zeros, function(x)
          local b = D.local_box(r.shape, r.placement, mesh, mesh:rank_of(x))
          if D.numel(b.len) > 0 then want[#want + 1] = mesh:rank_of(x) end
        end)
        D.each_box(r.shape, r.placement, mesh, axes, zeros, function(x, b)
          assert.is_true(D.numel(b.len) > 0)
          got[#got + 1] = mesh:rank_of(x)
        end)
        assert.are.same(want, got)
      end
    end
  end)
end)

describe("dist byte formula", function()
  local function plan_of(m, shape, spec, q)
    local r = { name = "x", shape = shape, placement = D.placement(spec, m, #shape), group = 1, ns = true,
      dtype = "float32", state_count = 1 }
    return D.plan({ r }, m, { rank = q or 0 }), r
  end
  it("moves only what the owner lacks and the slices others hold (2x2 mesh)", function()
    local m = D.mesh({ { "r", 2 }, { "s", 2 } }, 4)
    -- rows 1..2 are held by ranks 0 and 2, rows 3..4 by ranks 1 and 3; the
    -- owner is rank 0, so class 0 holds the state (ranks 0 and 1): rank 1
    -- sends it rows 3..4 (12 elements), it returns 12-element slices to
    -- ranks 1, 2, 3.
    local want = { [0] = { 36, 12 }, [1] = { 12, 12 }, [2] = { 0, 12 }, [3] = { 0, 12 } }
    for q = 0, 3 do
      local plan, r = plan_of(m, { 4, 6 }, { "R", "S(1)" }, q)
      assert.are.equal(0, r.owner)
      assert.are.same(want[q], { D.step_elements(plan, q) })
      -- The seed's all-gather + full broadcast + replica broadcast for the same owner.
      local seed = { [0] = 12, [1] = 12 + 24, [2] = 12, [3] = 12 }
      assert.are.equal(seed[q], D.seed_step_elements(plan, q))
    end
  end)
  it("replicated params move only the update, from the state holder", function()
    local m = D.mesh({ { "r", 2 } }, 2)
    assert.are.same({ 9, 0 }, { D.step_elements(plan_of(m, { 3, 3 }, { "R" }, 0), 0) })
    assert.are.same({ 0, 9 }, { D.step_elements(plan_of(m, { 3, 3 }, { "R" }, 1), 1) })
  end)
  it("empty shards move nothing", function()
    local m = D.mesh({ { "s", 4 } }, 4)
    -- rows on ranks 0 and 1; owner rank 0 gets row 2 from rank 1 and returns it.
    local want = { [0] = { 9, 9 }, [1] = { 9, 9 }, [2] = { 0, 0 }, [3] = { 0, 0 } }
    for q = 0, 3 do
      local plan, r = plan_of(m, { 2, 9 }, { "S(1)" }, q)
      assert.are.equal(0, r.owner)
      assert.are.same(want[q], { D.step_elements(plan, q) })
    end
  end)
end)

describe("dist agreement (one process)", function()
  it("agrees with itself and hashes deterministically", function()
    local m = D.mesh({ { "s", 1 } }, 1)
    local recs = { { name = "w", shape = { 2, 3 }, placement = D.placement(nil, m, 2), group = 1, muon = true, has_grad = true } }
    assert.is_nil(D.agree(comm.self(), recs, "x"))
    assert.are.equal(D.hash("abc"), D.hash("abc"))
    assert.are_not.equal(D.hash("abc"), D.hash("abd"))
    -- FNV-1a 32-bit of "a" is 0xe40c292c; we keep the low 31 bits.
    assert.are.equal(0x640c292c, D.hash("a"))
  end)
end)

describe("comm single-process backend", function()
  it("copies in all-to-all-v and all-gather-v, counts calls, moves no bytes", function()
    local c = comm.self()
    assert.are.equal(0, c:rank())
    assert.are.equal(1, c:size())
    local s = T.from({ 1, 2, 3 }, { 3 })
    local r = T.zeros({ 3 })
    c:alltoallv(s, { 3 }, r, { 3 })
    assert.are.same({ 1, 2, 3 }, r:flat())
    local g = T.zeros({ 3 })
    c:allgatherv(s, g, { 3 })
    assert.are.same({ 1, 2, 3 }, g:flat())
    assert.are.same({ 6 }, c:allreduce({ 6 }, "sum"))
    assert.are.equal("hi", c:bcast_string("hi", 0))
    c:ibcast(r, 0):wait()
    local st = c:stats()
    assert.are.equal(0, st.bytes_sent)
    assert.are.equal(0, st.bytes_recv)
    assert.is_true(st.calls >= 5)
    assert.has_error(function() c:alltoallv(s, { 3 }, r, { 2 }) end)
    assert.has_error(function() c:bcast(r, 1) end)
    local sub = c:split(0)
    assert.are.equal(1, sub:size())
  end)
end)

describe("engine with dist: registration checks (one process)", function()
  local engine = require("muon.engine")
  it("checks local shards and placements", function()
    local e = engine.new({ groups = { { optimizer = "muon", match = "^w" }, { optimizer = "adamw" } },
      dist = { mesh = { { "s", 1 } }, comm = comm.self() } })
    assert.has_error(function() e:add_param("w", T.zeros({ 3, 4 }), nil, { shape = { 3, 5 } }) end,
      "add_param 'w': rank 0 holds a local shard of shape [3, 4], but global shape [3, 5] with placement (R) on mesh (s=1) gives [3, 5]")
    assert.has_error(function() e:add_param("w", T.zeros({ 3 }), nil, { "R" }) end,
      "parameter 'w' is 1-D but matched Muon group 1: 1D parameters are not supported in Muon (route them to an AdamW group)")
    assert.has_error(function() e:add_param("w", T.zeros({ 3, 4 }), nil, { placement = { "R", "R" } }) end,
      "add_param 'w': placement has 2 entries but the mesh (s=1) has 1 axes")
    local plain = engine.new({ groups = { { optimizer = "adamw" } } })
    assert.has_error(function() plain:add_param("w", T.zeros({ 3, 4 }), nil, { "R" }) end,
      "add_param 'w': a placement needs a config with a dist section")
  end)
end)

describe("engine with dist (one process)", function()
  local engine = require("muon.engine")
  local function cfg(with_dist)
    local c = {
      groups = {
        { optimizer = "muon", match = "^w", lr = 0.02, weight_decay = 0.1 },
        { optimizer = "adamw", match = ".*", lr = 1e-3 },
      },
    }
    if with_dist then c.dist = { mesh = { { "shard", 1 } }, comm = comm.self() } end
    return c
  end
  it("steps bitwise like the engine without dist", function()
    local a, b = engine.new(cfg(false)), engine.new(cfg(true))
    local shapes = { w1 = { 6, 4 }, w2 = { 3, 1, 5 }, e = { 7, 3 } }
    local names = { "w1", "w2", "e" }
    for i, n in ipairs(names) do
      a:add_param(n, T.randn(shapes[n], i), T.zeros(shapes[n]))
      b:add_param(n, T.randn(shapes[n], i), T.zeros(shapes[n]), { "S(1)", shape = shapes[n] })
    end
    for step = 1, 3 do
      for i, n in ipairs(names) do
        local g = T.randn(shapes[n], 100 * step + i)
        a:param(n).grad:copy(g)
        b:param(n).grad:copy(g)
      end
      a:step()
      b:step()
    end
    for _, n in ipairs(names) do
      assert.are.same(a:param(n).value:flat(), b:param(n).value:flat())
    end
    assert.are.equal(3, b:get("step"))
    assert.is_table(b:comm_stats().data)
    -- A distributed checkpoint (full tensors) loads into the plain engine.
    local path = os.tmpname()
    b:save(path)
    local c = engine.new(cfg(false))
    for i, n in ipairs(names) do c:add_param(n, T.randn(shapes[n], i), T.zeros(shapes[n])) end
    c:load(path)
    os.remove(path)
    assert.are.equal(3, c:get("step"))
    local ma = a:state("w1").momentum_buffer
    local mc = c:state("w1").momentum_buffer
    assert.are.same(ma:flat(), mc:flat())
    local ea = a:state("e").exp_avg_sq
    local ec = c:state("e").exp_avg_sq
    assert.are.same(ea:flat(), ec:flat())
  end)
  it("rejects unknown dist keys and bad meshes", function()
    local c = cfg(false)
    c.dist = { mesh = { { "s", 1 } }, meshes = 1 }
    assert.has_error(function() engine.new(c) end, "config (table): dist: unknown dist key 'meshes' (did you mean 'mesh'?); valid dist keys: balance, check_replicas, comm, independent, max_batch_numel, mesh, split_ns")
    c.dist = { mesh = { { "s", 1 } }, split_ns = "on" }
    assert.has_error(function() engine.new(c) end,
      "config (table): dist: dist.split_ns must be 'auto', 'off' or a table { max_group = n, imbalance = x }, got the string \"on\"")
    c.dist = { mesh = { { "s", 0 } } }
    assert.has_error(function() engine.new(c) end,
      "config (table): dist: dist.mesh[1] must be {name, size} with a string name and an integer size >= 1")
    c.dist = { mesh = { { "s", 1 } }, comm = comm.self() }
    local e = engine.new(c)
    -- sharded on a size-1 axis: the local shard is the whole tensor, no shape needed
    e:add_param("w", T.zeros({ 4, 4 }), nil, { "S(1)" })
    assert.are.same({ 4, 4 }, e:describe()[1].shape)
  end)
end)

describe("the world a config sees, and ranks independent on purpose", function()
  local engine = require("muon.engine")
  local muon = require("muon")

  it("muon.world() is { size = 1, rank = 0 } in one process, read-only; muon.clock() is monotonic seconds", function()
    local w = muon.world()
    assert.are.equal(1, w.size)
    assert.are.equal(0, w.rank)
    local ok, err = pcall(function() w.size = 2 end)
    assert.is_false(ok)
    H.has(err, "muon.world() is read-only")
    local t0 = muon.clock()
    local x = 0
    for i = 1, 1e6 do x = x + i end
    local t1 = muon.clock()
    assert.truthy(t1 >= t0 and t1 - t0 < 10, x)
  end)

  it("a dry run's config sees the world it stands for (muon check --world N --rank R), sandboxed or not", function()
    local path = H.config_file("local w = require('muon').world()\nreturn { name = w.size .. '/' .. w.rank, "
      .. "groups = { {} }, dist = { mesh = { { 'replicate', w.size } } } }\n")
    for _, trusted in ipairs({ false, true }) do
      local _, problems, eng = engine.check(path, { { name = "w", shape = { 4, 4 } } },
        { dry_run = { world = 8, rank = 5 }, trusted = trusted or nil })
      assert.are.same({}, problems)
      assert.are.equal("8/5", eng.config.name)
      assert.are.equal(8, eng:plan().mesh.size)
    end
    assert.are.equal(1, muon.world().size) -- (only while the config loads)
    os.remove(path)
  end)

  it("dist = { independent = true } takes no other key; in one process it is the plain engine", function()
    local ok, err = pcall(engine.new, { groups = { {} }, dist = { independent = true, mesh = { { "r", 1 } } } })
    assert.is_false(ok)
    H.has(err, "dist: independent ranks take no other dist key (got mesh): a mesh makes the ranks one run")
    ok, err = pcall(engine.new, { groups = { {} }, dist = { independent = "yes" } })
    assert.is_false(ok)
    H.has(err, "dist: independent must be true (or left out), got the string \"yes\"")
    local e = engine.new({ groups = { {} }, dist = { independent = true } })
    local w = T.randn({ 4, 4 }, 1)
    e:add_param("w", w, T.randn({ 4, 4 }, 2))
    e:step()
    assert.are.equal(1, e:get("step"))
    assert.is_nil(e.dist)
    assert.are.equal(0, e:reduce_grads())
  end)
end)
