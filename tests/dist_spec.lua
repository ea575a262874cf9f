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
  it("core shapes and flops", function()
    assert.are.same({ 6, 5, 1 }, { D.core_shape({ 6, 1, 5 }) })
    assert.are.same({ 6, 4, 3 }, { D.core_shape({ 3, 6, 4 }) })
    -- m=4, n=6: 4*16*6 + 2*64 = 512 per matrix
    assert.are.equal(3 * 512, D.ns_flops({ 3, 6, 4 }))
    assert.are.equal(512, D.ns_flops({ 4, 6 }))
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
  it("plans owners only for Muon params with a grad and batches per group", function()
    local m = D.mesh({ { "s", 2 } }, 2)
    local recs = {
      { name = "a", shape = { 4, 4 }, placement = D.placement({ "S(1)" }, m, 2), group = 1, muon = true, has_grad = true },
      { name = "b", shape = { 8, 8 }, placement = D.placement({ "S(1)" }, m, 2), group = 2, muon = true, has_grad = true },
      { name = "c", shape = { 8, 8 }, placement = D.placement({ "S(1)" }, m, 2), group = 1, muon = true, has_grad = false },
      { name = "d", shape = { 8 }, placement = D.placement({ "S(1)" }, m, 1), group = 3, muon = false, has_grad = true },
      { name = "e", shape = { 2, 2 }, placement = D.placement({ "R" }, m, 2), group = 1, muon = true, has_grad = true },
    }
    local plan = D.plan(recs, m, { max_batch_numel = 16 })
    assert.are.equal(0, recs[2].owner) -- the largest first
    assert.are.equal(1, recs[1].owner)
    assert.are.equal(1, recs[5].owner) -- rank 1 (64 flops*...) is less loaded than rank 0
    assert.is_nil(recs[3].owner)
    assert.is_nil(recs[4].owner)
    assert.are.equal("local", recs[4].kind)
    -- group 1: a (16) | e (4) would exceed 16 -> two batches; group 2: b. Interleaved by index.
    assert.are.same({ { 1 }, { 2 }, { 5 } }, plan.batches)
  end)
end)

describe("dist byte formula", function()
  local function rec(shape, pl, owner)
    return { name = "x", shape = shape, placement = pl, kind = "owner", owner = owner, numel = D.numel(shape) }
  end
  it("moves only what the owner lacks and the slices others hold (2x2 mesh)", function()
    local m = D.mesh({ { "r", 2 }, { "s", 2 } }, 4)
    local plan = { mesh = m, records = { rec({ 4, 6 }, D.placement({ "R", "S(1)" }, m, 2), 3) } }
    -- owner 3 = (1,1) holds rows 3..4; rank 2 = (1,0) sends it rows 1..2 (12 elements);
    -- the owner returns 12-element slices to ranks 0, 1, 2.
    local want = { [0] = { 0, 12 }, [1] = { 0, 12 }, [2] = { 12, 12 }, [3] = { 36, 12 } }
    for r = 0, 3 do
      assert.are.same(want[r], { D.step_elements(plan, r) })
    end
    -- The seed's all-gather + full broadcast + replica broadcast for the same owner.
    local seed = { [0] = 12, [1] = 12, [2] = 12 + 24, [3] = 12 }
    for r = 0, 3 do assert.are.equal(seed[r], D.seed_step_elements(plan, r)) end
  end)
  it("replicated params move only the update, from the owner", function()
    local m = D.mesh({ { "r", 2 } }, 2)
    local plan = { mesh = m, records = { rec({ 3, 3 }, D.placement({ "R" }, m, 2), 0) } }
    assert.are.same({ 9, 0 }, { D.step_elements(plan, 0) })
    assert.are.same({ 0, 9 }, { D.step_elements(plan, 1) })
  end)
  it("empty shards move nothing", function()
    local m = D.mesh({ { "s", 4 } }, 4)
    local plan = { mesh = m, records = { rec({ 2, 9 }, D.placement({ "S(1)" }, m, 2), 3) } }
    -- owner 3 holds nothing: gets rows from ranks 0 and 1 (9 each), returns 9 to each.
    assert.are.same({ 18, 18 }, { D.step_elements(plan, 3) })
    assert.are.same({ 9, 9 }, { D.step_elements(plan, 0) })
    assert.are.same({ 0, 0 }, { D.step_elements(plan, 2) })
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

describe("dist_step (one process)", function()
  local DS = require("muon.optim.dist_step")
  it("checks local shards, placements and options", function()
    local ds = DS.new({ comm = comm.self(), mesh = { { "s", 1 } }, groups = { { optimizer = "muon" }, { optimizer = "adamw" } } })
    assert.has_error(function() ds:add_param("w", T.zeros({ 3, 4 }), nil, { shape = { 3, 5 } }) end,
      "add_param 'w': rank 0 holds a local shard of shape {3,4}, but global shape {3,5} with placement (R) on mesh (s=1) gives {3,5}")
    assert.has_error(function() ds:add_param("b", T.zeros({ 3 }), nil, { group = 1 }) end,
      "parameter 'b' is 1-D: 1D parameters are not supported in Muon (use AdamW)")
    assert.has_error(function() ds:add_param("w", T.zeros({ 3, 4 }), nil, { placement = { "R", "R" } }) end,
      "add_param 'w': placement has 2 entries but the mesh (s=1) has 1 axes")
    assert.has_error(function() ds:add_param("w", T.zeros({ 3, 4 }), nil, { shard = 1 }) end,
      "add_param 'w': unknown key 'shard' (shape, placement, group)")
    assert.has_error(function() DS.new({ comm = comm.self(), groups = {}, bogus = 1 }) end,
      "dist_step.new: unknown option 'bogus'")
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
    local ma = a.optimizers.muon.state[a:param("w1")].momentum_buffer
    local mc = c.optimizers.muon.state[c:param("w1")].momentum_buffer
    assert.are.same(ma:flat(), mc:flat())
    local ea = a.optimizers.adamw.state[a:param("e")].exp_avg_sq
    local ec = c.optimizers.adamw.state[c:param("e")].exp_avg_sq
    assert.are.same(ea:flat(), ec:flat())
  end)
  it("rejects unknown dist keys and bad meshes", function()
    local c = cfg(false)
    c.dist = { mesh = { { "s", 1 } }, meshes = 1 }
    assert.has_error(function() engine.new(c) end, "config: dist: unknown key 'meshes' (mesh, balance, max_batch_numel)")
    c.dist = { mesh = { { "s", 0 } } }
    assert.has_error(function() engine.new(c) end,
      "config: dist: dist.mesh[1] must be {name, size} with a string name and an integer size >= 1")
    c.dist = { mesh = { { "s", 1 } }, comm = comm.self() }
    local e = engine.new(c)
    -- sharded on a size-1 axis: the local shard is the whole tensor, no shape needed
    e:add_param("w", T.zeros({ 4, 4 }), nil, { "S(1)" })
    assert.are.same({ 4, 4 }, e:describe()[1].shape)
  end)
end)
