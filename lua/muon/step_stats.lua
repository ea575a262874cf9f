-- The measurements of one step (muon.step calls these around its body;
-- eng:stats() and the config's log read them):
--
--   local SS = require("muon.step_stats")
--   local m = SS.begin(st)            -- before the step: clocks, counters
--   st.last = SS.finish(st, run, m)   -- after its commit (collective on a mesh)
--
-- What finish returns:
--   step_seconds   wall time of the step (this rank)
--   ns_seconds     of it, inside Newton-Schulz calls (this rank's workspaces,
--                  and its split groups' machines: muon.split_phase)
--   hook_seconds   of it, inside the config's functions (hooks, match functions)
--   grad_norm      sqrt of the sum of g^2 over every stepping parameter's
--                  gradient (the whole parameters: each piece counted once, by
--                  the rank that keeps its state)
--   update_rms     per group index: sqrt(mean (s u)^2) over the group's
--                  stepping parameters' updates u (the commit does p = p *
--                  decay + alpha * u * s, alpha = -lr unless
--                  apply_lr_in_update, s the kind's apply_scale: Muon's
--                  per-slice scale, else 1); nil for a group that did not step
--   ns_matrices    matrices orthogonalized (every rank's; a split matrix once)
--   ns_residual    the largest Newton-Schulz residual (muon.ns.workspace_stats:
--                  ||A - I||_F / sqrt(n) of each matrix's last Gram matrix),
--   ns_residual_rms  and the RMS over the matrices; nil without any
--   bytes_sent, bytes_recv  this rank's traffic on the step's communicators
--                  (its split groups' too)
-- Sums of squares in double (muon.foreach.sumsq); on a mesh they, the
-- residuals and the matrix counts are reduced over the ranks (two small
-- all-reduces on the control communicator).
local E = require("muon.errors")
local foreach = require("muon.foreach")
local commlib = require("muon.comm")
local C = require("muon.core").C

local SS = {}

local function traffic(st)
  local sent, recv = 0, 0
  if st.W > 1 then
    for _, s in ipairs({ commlib.stats(st.data), commlib.stats(st.ctrl), st.split_phase:stats() }) do
      sent, recv = sent + s.bytes_sent, recv + s.bytes_recv
    end
  end
  return sent, recv
end

function SS.begin(st)
  st.scratch:ns_stats(true)
  st.split_phase:ns_stats(true)
  local sent, recv = traffic(st)
  return { t0 = C.mu_clock(), hooks = E.hook_seconds(), sent = sent, recv = recv }
end

-- The sum of the tensors' squares, each times its weight (weights nil: 1).
local function sum(list, weights)
  local s = 0
  foreach.per_dtype(function(part, w)
    for i, x in ipairs(foreach.sumsq(part)) do s = s + x * (w and w[i] or 1) end
  end, { list, weights })
  return s
end

local function contiguous(t) return t:is_contiguous() and t or t:contiguous() end

function SS.finish(st, run, m)
  -- this rank's sums: the grads and updates of the pieces it keeps state for
  local grads, sums = {}, { 0 }
  for gi = 1, #st.groups do
    local gr, G = run.g[gi], st.groups[gi]
    local scale_of = G.kind.apply_scale
    local us, w, n = {}, {}, 0
    for _, p in ipairs(gr.params) do
      local r = st.rec[p]
      if r.mine_n > 0 and (st.W == 1 or r.holds) then
        grads[#grads + 1] = contiguous(p.grad)
        if not (gr.skip or gr.skip_derived) then
          us[#us + 1] = st.scratch:update_of(p)
          w[#us] = scale_of and scale_of(G.options, gr.hp, p.logical_shape) ^ 2 or 1
          n = n + r.mine_n
        end
      end
    end
    sums[2 * gi], sums[2 * gi + 1] = #us > 0 and sum(us, w) or 0, n
  end
  sums[1] = sum(grads)
  local ns, split = st.scratch:ns_stats(false), st.split_phase:ns_stats(false)
  local seconds = C.mu_clock() - m.t0
  local sent, recv = traffic(st) -- (the step's own, before the reductions below)
  local k = #sums
  sums[k + 1], sums[k + 2], sums[k + 3] = ns.residual_sumsq, ns.residuals, ns.matrices + split.matrices
  local rmax = ns.residual_max or -1
  if st.W > 1 then
    sums = st.ctrl:allreduce(sums, "sum", "f64")
    rmax = st.ctrl:allreduce({ rmax }, "max", "f64")[1]
  end
  local out = { step_seconds = seconds, ns_seconds = ns.seconds + split.seconds, hook_seconds = E.hook_seconds() - m.hooks,
    grad_norm = math.sqrt(sums[1]), update_rms = {}, ns_matrices = sums[k + 3] }
  for gi = 1, #st.groups do
    local n = sums[2 * gi + 1]
    if n > 0 then out.update_rms[gi] = math.sqrt(sums[2 * gi] / n) end
  end
  if sums[k + 2] > 0 then
    out.ns_residual, out.ns_residual_rms = rmax, math.sqrt(sums[k + 1] / sums[k + 2])
  end
  out.bytes_sent, out.bytes_recv = sent - m.sent, recv - m.recv
  return out
end

return SS
