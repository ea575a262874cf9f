-- Distributed planning (muon.dist) and the single-process communicator
-- backend: chunk sizes, mesh coordinates, placements, local boxes, NS
-- owners, the byte formula, against hand-computed values.
local T = require("muon.tensor")
local D = require("muon.dist")
local comm = require("muon.comm")

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
    -- m=4, n=6: 4*16*6 + 2*64 = 512 per matrix
    assert.are.equal(3 * 512, ns.flops({ 3, 6, 4 }))
    assert.are.equal(512, ns.flops({ 4, 6 }))
    -- flatten: the cost of the flattened (out, in*kh*kw) matrix, by hand:
    -- m=8, n=27: 4*64*27 + 2*512 = 7936 (the batch reading costs 24 3x3s)
    assert.are.equal(7936, ns.flops({ 8, 3, 3, 3 }, "flatten"))
    assert.are.equal(ns.flops({ 8, 27 }), ns.flops({ 8, 3, 3, 3 }, "flatten"))
    assert.are.equal(24 * (4 * 27 + 2 * 27), ns.flops({ 8, 3, 3, 3 }, "batch"))
    assert.are.equal(0, ns.flops({ 5 }))
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
    local function rec(name, shape, pl, group, ns)
      return { name = name, shape = shape, placement = D.placement(pl, m, #shape), group = group, ns = ns,
        dtype = "float32", state_count = ns and 1 or 2 }
    end
    local recs = {
      rec("a", { 4, 4 }, { "S(1)" }, 1, true),
      rec("b", { 8, 8 }, { "S(1)" }, 2, true),
      rec("c", { 8, 8 }, { "S(1)" }, 1, true),
      rec("d", { 8 }, { "S(1)" }, 3, false),
      rec("e", { 2, 2 }, { "R" }, 1, true),
    }
    local plan = D.plan(recs, m, { max_batch_numel = 16 })
    -- Sharded boxes have one holder each; the replicated e goes to the less
    -- loaded rank (tie: 320 bytes each -> rank 0) and is orthogonalized there.
    assert.are.same({ 0, 1 }, { recs[1].holder[recs[1].id_of[0]], recs[1].holder[recs[1].id_of[1]] })
    assert.are.equal(0, recs[5].holder[recs[5].id_of[0]])
    assert.are.equal(0, recs[5].items[1].owner)
    -- Owners largest first by flops onto the least loaded rank (e's 48 preloaded on rank 0).
    assert.are.equal(1, recs[2].items[1].owner)
    assert.are.equal(0, recs[3].items[1].owner)
    assert.are.equal(1, recs[1].items[1].owner)
    -- AdamW: one item per box, computed by its holder.
    assert.are.equal(2, #recs[4].items)
    -- Batches: per (group, shard count), 16 / 2 elements but at least 2 items
    -- per sharded batch, interleaved.
    local got = {}
    for i, b in ipairs(plan.batches) do
      local names = {}
      for j, it in ipairs(b) do names[j] = it.record.name end
      got[i] = table.concat(names, ",")
    end
    assert.are.same({ "e", "a,c", "b", "d,d" }, got)
  end)
  it("keeps batch-sharded parameters where their shards live", function()
    local m = D.mesh({ { "s", 4 } }, 4)
    local r = { name = "experts", shape = { 4, 32, 48 }, placement = D.placement({ "S(1)" }, m, 3), group = 1, ns = true,
      dtype = "float32", state_count = 1 }
    local plan = D.plan({ r }, m)
    assert.are.equal(4, #r.items)
    for q = 0, 3 do
      assert.are.equal(q, r.items[q + 1].owner)
      assert.are.same({ 0, 0 }, { D.step_elements(plan, q) })
    end
    -- With a hook that sees the whole parameter it is gathered instead.
    r.whole = true
    plan = D.plan({ r }, m)
    assert.are.equal(1, #r.items)
    local s, v = D.step_elements(plan, r.items[1].owner)
    assert.are.same({ 3 * 32 * 48, 3 * 32 * 48 }, { s, v })
  end)
end)

describe("dist byte formula", function()
  local function plan_of(m, shape, spec)
    local r = { name = "x", shape = shape, placement = D.placement(spec, m, #shape), group = 1, ns = true,
      dtype = "float32", state_count = 1 }
    return D.plan({ r }, m), r
  end
  it("moves only what the owner lacks and the slices others hold (2x2 mesh)", function()
    local m = D.mesh({ { "r", 2 }, { "s", 2 } }, 4)
    local plan, r = plan_of(m, { 4, 6 }, { "R", "S(1)" })
    -- rows 1..2 are held by ranks 0 and 2 (state on rank 0), rows 3..4 by
    -- ranks 1 and 3 (state on rank 1); the owner is rank 0: rank 1 sends it
    -- rows 3..4 (12 elements), it returns 12-element slices to ranks 1, 2, 3.
    assert.are.equal(0, r.items[1].owner)
    local want = { [0] = { 36, 12 }, [1] = { 12, 12 }, [2] = { 0, 12 }, [3] = { 0, 12 } }
    for q = 0, 3 do
      assert.are.same(want[q], { D.step_elements(plan, q) })
    end
    -- The seed's all-gather + full broadcast + replica broadcast for the same owner.
    local seed = { [0] = 12, [1] = 12 + 24, [2] = 12, [3] = 12 }
    for q = 0, 3 do assert.are.equal(seed[q], D.seed_step_elements(plan, q)) end
  end)
  it("replicated params move only the update, from the state holder", function()
    local m = D.mesh({ { "r", 2 } }, 2)
    local plan = plan_of(m, { 3, 3 }, { "R" })
    assert.are.same({ 9, 0 }, { D.step_elements(plan, 0) })
    assert.are.same({ 0, 9 }, { D.step_elements(plan, 1) })
  end)
  it("empty shards move nothing", function()
    local m = D.mesh({ { "s", 4 } }, 4)
    local plan, r = plan_of(m, { 2, 9 }, { "S(1)" })
    -- rows on ranks 0 and 1; owner rank 0 gets row 2 from rank 1 and returns it.
    assert.are.equal(0, r.items[1].owner)
    assert.are.same({ 9, 9 }, { D.step_elements(plan, 0) })
    assert.are.same({ 9, 9 }, { D.step_elements(plan, 1) })
    assert.are.same({ 0, 0 }, { D.step_elements(plan, 2) })
    assert.are.same({ 0, 0 }, { D.step_elements(plan, 3) })
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
      "add_param 'w': rank 0 holds a local shard of shape {3,4}, but global shape {3,5} with placement (R) on mesh (s=1) gives {3,5}")
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
    assert.has_error(function() engine.new(c) end, "config (table): dist: unknown dist key 'meshes' (did you mean 'mesh'?); valid dist keys: balance, comm, max_batch_numel, mesh")
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
