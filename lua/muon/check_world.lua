-- `muon check CONFIG --params SHAPES --world N --rank R [--mesh SPEC]`:
-- rank R's plan at world size N, without MPI, by the plan code a real
-- mpirun runs: muon check's own dry run (muon.engine.check: a dry-run
-- engine as rank R of N on a virtual communicator, the parameters
-- registered as stand-ins, their default placements) and its eng:plan().
--
--   local CW = require("muon.check_world")
--   local text, problems = CW.run(config_path, shapes, { world = 4096, rank = 7,
--     mesh = "replicate:2,shard:2048", trusted = false })
--   CW.figures(plan)   --> this rank's figures of a plan (also of a real run's)
--   CW.parse_mesh("replicate:2,shard:2048")   --> { {"replicate", 2}, {"shard", 2048} } or nil, err
local D = require("muon.dist")
local ns = require("muon.ns")
local K = require("muon.optim.kind")
local ESIZE = require("muon.tensor").DTYPE_SIZES

local CW = {}

-- "replicate:2,shard:2048" -> list of {name, size}, or nil and a message.
function CW.parse_mesh(spec)
  local axes = {}
  for part in tostring(spec):gmatch("[^,]+") do
    local name, size = part:match("^%s*([%a_][%w_]*):(%d+)%s*$")
    if not name then return nil, ("--mesh: '%s' is not axis:size (e.g. replicate:2,shard:2048)"):format(part) end
    axes[#axes + 1] = { name, tonumber(size) }
  end
  if #axes == 0 then return nil, "--mesh: no axes (e.g. replicate:2,shard:2048)" end
  return axes
end

-- Rank gq (0-based) of record r's split group: its share of one step's
-- Newton-Schulz (the cost model's flops and the bytes it sends and
-- receives, times the batch), its blocks.
local function split_figures(r, gq)
  local rows, cols, batch = ns.core(r.shape, r.nd_mode)
  local c = ns.split_cost(rows, cols, r.ns_opts, r.ns_group.size, gq, r.dtype == "float64" and "float64" or "float32")
  return { name = r.name, group = r.ns_group.size, rank = gq, blocks = c.blocks, first_block = c.first_block,
    nblocks = c.nblocks, flops = c.flops * batch, bytes_sent = c.bytes_sent * batch, bytes_recv = c.bytes_recv * batch }
end

-- Rank plan.rank's figures: parameters it holds a piece of and holds the
-- state of, items it owns (Newton-Schulz and elementwise), its state bytes,
-- Newton-Schulz flops per step (the cost model), bytes sent and received per step (every
-- parameter stepping), and the job's NS imbalance.
function CW.figures(plan)
  local me = plan.rank
  local f = { held = 0, state_held = 0, owned_ns = 0, owned_elementwise = 0, state_bytes = 0, ns_flops = 0,
    bytes_sent = 0, bytes_recv = 0, owned_names = {}, split_groups = {}, split_sent = 0, split_recv = 0,
    split_records = 0, split_ranks = 0 }
  for _, r in ipairs(plan.records) do
    if r.mine_n > 0 then f.held = f.held + 1 end
    if r.holds then
      f.state_held = f.state_held + 1
      f.state_bytes = f.state_bytes + r.mine_n * ESIZE[r.state_dtype or r.dtype] * (r.state_count or 1)
      for _, hr in pairs(r.hook_records) do f.state_bytes = f.state_bytes + D.numel(hr.mine.len) * ESIZE[r.dtype] end
    end
    local grp = r.ns_group
    if grp then
      for gq, q in ipairs(grp.ranks) do
        if q == me then f.split_groups[#f.split_groups + 1] = split_figures(r, gq - 1) end
      end
    end
    for _, it in ipairs(r.items) do
      if it.owner == me and not grp then
        if it.ns then
          f.owned_ns = f.owned_ns + 1
          f.ns_flops = f.ns_flops + ns.shape_cost(it.region.len, r.nd_mode, r.ns_opts)
          f.owned_names[#f.owned_names + 1] = r.name
        else
          f.owned_elementwise = f.owned_elementwise + 1
        end
      end
    end
    local s, v = D.step_elements({ records = { r }, mesh = plan.mesh }, me)
    f.bytes_sent, f.bytes_recv = f.bytes_sent + s * ESIZE[r.dtype], f.bytes_recv + v * ESIZE[r.dtype]
  end
  for _, sg in ipairs(f.split_groups) do
    f.ns_flops = f.ns_flops + sg.flops
    f.split_sent, f.split_recv = f.split_sent + sg.bytes_sent, f.split_recv + sg.bytes_recv
  end
  for _, r in ipairs(plan.records) do
    if r.ns_group then f.split_records, f.split_ranks = f.split_records + 1, f.split_ranks + r.ns_group.size end
  end
  f.imbalance = D.imbalance(plan)
  return f
end

-- The matrices a split could take (2-D float32 or float64, more than one
-- block: ns.split_blocks) that never split because a hook of their group
-- needs each whole (zeropower_fn, and the hooks K.whole names): "name
-- (hook, ...)", from eng:describe()'s rows. None when split_ns is off.
local function kept_whole(plan, eng)
  local out, recs = {}, {}
  if not plan.split_ns then return out end
  for _, r in ipairs(plan.records) do
    if r.ns and r.split_ok == false and #r.shape == 2 and (r.dtype == "float32" or r.dtype == "float64")
      and ns.split_blocks(r.shape[1], r.shape[2], r.ns_opts) >= 2 then recs[#recs + 1] = r end
  end
  if #recs == 0 then return out end
  local hooks_of = {}
  for _, row in ipairs(eng:describe()) do hooks_of[row.name] = row.hooks end
  for _, r in ipairs(recs) do
    local whole = {}
    for _, h in ipairs(hooks_of[r.name] or {}) do
      if h == "zeropower_fn" or K.HOOK_NAMES[h].whole then whole[#whole + 1] = h end
    end
    out[#out + 1] = ("%s (%s)"):format(r.name, table.concat(whole, ", "))
  end
  return out
end

local function peak_rss_mb()
  local fh = io.open("/proc/self/status", "r")
  if not fh then return nil end
  local t = fh:read("*a")
  fh:close()
  local kb = t:match("VmHWM:%s*(%d+)")
  return kb and tonumber(kb) / 1024 or nil
end

-- Plans rank opts.rank of opts.world for the config and shapes ({ name,
-- shape, placement = list or nil }); returns the text, a list of
-- problems, the plan's figures and the routing's warnings.
function CW.run(config_path, shapes, opts)
  local W, me = opts.world, opts.rank
  local mesh
  if opts.mesh then
    local axes, err = CW.parse_mesh(opts.mesh)
    if not axes then return "", { err } end
    mesh = axes
  end
  local _, problems, eng = require("muon.engine").check(config_path, shapes, { trusted = opts.trusted or nil,
    dry_run = { world = W, rank = me, mesh = mesh } })
  if #problems > 0 then return "", problems end
  local route_errors, route_warnings = eng:check_routes()
  if #route_errors > 0 then return "", route_errors, nil, route_warnings end
  collectgarbage()
  local m0, t0 = collectgarbage("count"), os.clock()
  local plan = eng:plan()
  local secs, mem = os.clock() - t0, (collectgarbage("count") - m0) / 1024
  local records = plan.records
  local f = CW.figures(plan)
  local out = {}
  local function line(fmt, ...) out[#out + 1] = fmt:format(...) end
  line("plan of rank %d of %d, mesh %s, owners by %s", me, W, plan.mesh:describe(), plan.balance)
  line("  parameters: %d, rank %d holds a piece of %d and the optimizer state of %d", #records, me, f.held, f.state_held)
  local names = f.owned_names
  line("  owns: %d Newton-Schulz matri%s%s, %d elementwise piece%s", f.owned_ns, f.owned_ns == 1 and "x" or "ces",
    #names > 0 and (" (" .. table.concat(names, ", ", 1, math.min(#names, 8)) .. (#names > 8 and ", ..." or "") .. ")") or "",
    f.owned_elementwise, f.owned_elementwise == 1 and "" or "s")
  local sg = f.split_groups
  local descr = {}
  for i = 1, math.min(#sg, 4) do
    local x = sg[i]
    descr[i] = ("%s: rank %d of %d, %s"):format(x.name, x.rank, x.group, x.nblocks == 0 and "stripes only"
      or x.nblocks == 1 and ("block %d of %d"):format(x.first_block + 1, x.blocks)
      or ("blocks %d-%d of %d"):format(x.first_block + 1, x.first_block + x.nblocks, x.blocks))
  end
  line("  split Newton-Schulz: %d matri%s over %d group ranks; rank %d is in %d group%s%s", f.split_records,
    f.split_records == 1 and "x" or "ces", f.split_ranks, me, #sg, #sg == 1 and "" or "s",
    #sg > 0 and (" (" .. table.concat(descr, "; ") .. (#sg > 4 and "; ..." or "") .. ")") or "")
  if #sg > 0 then line("  split Newton-Schulz bytes per step: sent %d, received %d", f.split_sent, f.split_recv) end
  local kept = kept_whole(plan, eng)
  if #kept > 0 then
    line("  not split (a hook of the group needs the whole matrix): %d matri%s: %s", #kept, #kept == 1 and "x" or "ces",
      table.concat(kept, ", ", 1, math.min(#kept, 4)) .. (#kept > 4 and ", ..." or ""))
  end
  line("  state bytes: %d", f.state_bytes)
  line("  Newton-Schulz flops per step: %.6g", f.ns_flops)
  line("  bytes per step: sent %d, received %d", f.bytes_sent, f.bytes_recv)
  line("  job NS imbalance (largest rank / mean, by %s): %.4f", plan.balance, f.imbalance)
  local rss = peak_rss_mb()
  line("  plan time %.3f s, plan memory %.1f MB%s", secs, mem, rss and (", process peak RSS %.1f MB"):format(rss) or "")
  return table.concat(out, "\n") .. "\n", problems, f, route_warnings
end

return CW
