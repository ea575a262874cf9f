-- The checks of what a step's commit writes (muon.step): every tensor
-- that becomes state or a parameter's value is finite, or the group's
-- nonfinite policy applies: "error" fails the step naming the parameter
-- and the tensor (nothing changes), "skip" skips the group's step
-- (gr.skip_derived; on a mesh agreed with the failure flag). Nothing here
-- writes a parameter or the state.
--
--   local CC = require("muon.commit_checks")
--   CC.derived(run, G, gr, entries, bad, applies) -- what direction wrote (kind.checks: its own report)
--   CC.state(scratch, records, G, gr)        -- hook state (copied from the hooks' buffers) and hook-written state
--   CC.parts(G, gr, rec, scratch, copies)    -- values, updates, names, scales, checked of the parts this rank holds
--   CC.apply(G, gr, values, updates, names, scales, checked) -- value * decay + alpha * update * scale, computed
--                                            -- without writing --> the apply list of the commit
--   CC.write(applies)                        -- the commit's writes of an apply list (nothing to check: it was)
--   CC.stand_ins(G, gr, stand_ins)           -- what post_update_fn left in the parameters' private copies
local foreach = require("muon.foreach")
local E = require("muon.errors")
local K = require("muon.optim.kind")

local CC = {}

local function finite(x) return type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge end

-- A non-finite tensor the commit would write: under nonfinite = "skip" the
-- group skips the step, else the step fails with fmt.
local function nonfinite(G, gr, fmt, ...)
  if G.options.nonfinite == "skip" then
    gr.skip_derived = true
    return
  end
  E.raise(E.ENONFINITE, fmt, ...)
end

-- Whether a hook of the group writes the kind's state (then CC.state
-- checks it, naming the hook).
local function hook_writes_state(G)
  for _, h in ipairs(G.kind.HOOKS) do
    if K.HOOK_NAMES[h].writes_state and G.options[h] ~= nil then return true end
  end
  return false
end

-- The hooks a group runs that write `what` of its step ("input": the
-- Newton-Schulz input, "update": the update; K.HOOKS' writes), as text:
-- "post_ortho_fn", "zeropower_fn or post_ortho_fn", or nil for none.
local function writers(G, what)
  local list = {}
  for _, h in ipairs(G.kind.HOOKS) do
    if K.HOOK_NAMES[h].writes == what and G.options[h] ~= nil then list[#list + 1] = h end
  end
  if #list == 0 then return nil end
  return table.concat(list, " or ")
end

-- A finite gradient can still overflow what is derived from it: the NS
-- input and every state tensor direction wrote, as stored (a value that
-- float32 keeps finite rounds to Inf in a bfloat16 state; state a hook
-- wrote is CC.state's; the update itself is checked by CC.apply): the
-- message naming the first one holding NaN or Inf, or nil.
local function derived_failure(G, entries)
  local list, owner, what = {}, {}, {}
  local keys = hook_writes_state(G) and {} or G.kind.state_keys
  for _, e in ipairs(entries) do
    if G.kind.ns then list[#list + 1], owner[#list + 1], what[#list + 1] = e.u, e.p, "the Newton-Schulz input" end
    for _, k in ipairs(keys) do
      -- (state written in place at the commit is not there yet: failure_of finds it)
      if e.new[k] ~= nil then list[#list + 1], owner[#list + 1], what[#list + 1] = e.new[k], e.p, k end
    end
  end
  local bad = foreach.first_nonfinite(list)
  if not bad then return nil end
  local hook = G.kind.ns and what[bad] == "the Newton-Schulz input" and writers(G, "input")
  if hook then
    return ("parameter '%s': the Newton-Schulz input holds NaN or Inf after %s (its gradient is finite) (%s)")
      :format(owner[bad].name, hook, G.label)
  end
  return ("parameter '%s': its gradient is finite but %s overflowed to NaN or Inf%s (%s); nothing was changed")
    :format(owner[bad].name, G.kind.ns and what[bad] == "the Newton-Schulz input"
      and "the momentum (the Newton-Schulz input)" or ("the " .. what[bad]),
      list[bad]:dtype() == "bfloat16" and " in bfloat16 (state_dtype)" or "", G.label)
end

local apply_failure -- (below)

-- Which check a bad value that a kind's direction reported fails (its
-- passes check everything at once): the gradients, the derived values
-- (the NS input, the state as stored), the applies it checked, the state
-- it wrote, as the separate checks would have found them, in that order
-- (state a kind writes in place at the commit is not written yet: then
-- the reported entry bad holds it). Returns the message.
local function failure_of(G, gr, entries, bad, applies)
  local grads = {}
  for i, e in ipairs(entries) do grads[i] = e.grad:is_contiguous() and e.grad or e.grad:contiguous() end
  local g = foreach.first_nonfinite(grads)
  if g then return ("parameter '%s': gradient holds NaN or Inf (%s)"):format(entries[g].p.name, G.label) end
  local msg = derived_failure(G, entries)
  if msg then return msg end
  if applies then
    local values, updates, names, scales = {}, {}, {}, {}
    for i, e in ipairs(entries) do
      values[i], updates[i], names[i] = e.p.value, e.u, e.p.name
      scales[i] = G.kind.apply_scale and G.kind.apply_scale(G.options, gr.hp, e.p.logical_shape) or 1
    end
    msg = apply_failure(G, gr, values, updates, names, scales)
    if msg then return msg end
  end
  for i, e in ipairs(entries) do
    for _, k in ipairs(G.kind.state_keys) do
      local t = e.new[k]
      if t == nil and i == bad or t ~= nil and not t:all_finite() then
        return ("parameter '%s': its gradient is finite but the %s overflowed to NaN or Inf%s (%s); nothing was changed")
          :format(e.p.name, k, G.options.state_dtype == "bfloat16" and " in bfloat16 (state_dtype)" or "", G.label)
      end
    end
  end
  return ("parameter '%s': the step would write NaN or Inf (%s); nothing was changed"):format(entries[1].p.name, G.label)
end

-- What the direction of a group wrote (entries) is finite: with
-- kind.checks, direction reported it (bad: nil, or an entry holding NaN or
-- Inf; applies: it checked the applies too, which CC.apply then skips);
-- else the NS input and the state are checked here (derived_failure; a
-- NaN/Inf gradient was checked before). Under "skip" the NS inputs are
-- zeroed so that routing and Newton-Schulz stay finite.
function CC.derived(run, G, gr, entries, bad, applies)
  local msg
  if G.kind.checks then
    if bad == nil then
      gr.apply_checked = applies == true
      return
    end
    msg = failure_of(G, gr, entries, bad, applies)
  else
    msg = derived_failure(G, entries)
    if not msg then return end
  end
  if G.options.nonfinite ~= "skip" then E.raise(E.ENONFINITE, "%s", msg) end
  gr.skip_derived = true
  if run.W == 1 then gr.skip = true end
  for _, e in ipairs(entries) do e.u:zero() end
end

-- The state the commit swaps in: the hooks' hook state is copied into it
-- from the buffers they saw (scratch:hook_buffer), then what CC.derived
-- did not check is (hook state; the kind's state where a hook wrote it).
-- records: param -> its plan record.
function CC.state(scratch, records, G, gr)
  local list, owner, key = {}, {}, {}
  local kind_keys = hook_writes_state(G) and G.kind.state_keys or {}
  for _, e in ipairs(gr.entries) do
    for _, k in ipairs(kind_keys) do
      list[#list + 1], owner[#list + 1], key[#list + 1] = e.new[k], e.p, k
    end
    for _, h in ipairs(records[e.p].hooks_list) do
      e.new[h.key]:copy(scratch:hook_buffer(e.p, h.key))
      list[#list + 1], owner[#list + 1], key[#list + 1] = e.new[h.key], e.p, h.key
    end
  end
  local bad = foreach.first_nonfinite(list)
  if bad then
    local k = key[bad]
    local hook = k:match("^hook%.(.*)$")
    nonfinite(G, gr, "parameter '%s': %s would hold NaN or Inf after the step%s (%s); nothing was changed",
      owner[bad].name, hook and ("hook state '" .. hook .. "' (pre_ortho_fn / post_ortho_fn)")
        or ("state tensor '" .. k .. "' (written by a hook)"),
      list[bad]:dtype() == "bfloat16" and " in bfloat16 (state_dtype)" or "", G.label)
  end
end

-- This rank's parts of a group's stepping parameters (gr.params; rec:
-- param -> plan record; those this rank holds elements of): their values
-- (copies[i].value with copies, the stand-ins of post_update_fn), their
-- update buffers (scratch), names, scales (kind.apply_scale; nil when the
-- kind has none: all 1) and whether direction checked their apply
-- (gr.apply_checked, for the parameters whose state this rank holds), five
-- lists for CC.apply.
function CC.parts(G, gr, rec, scratch, copies)
  local values, updates, names, checked = {}, {}, {}, {}
  local scale_of = G.kind.apply_scale
  local scales = scale_of and {} or nil
  local was = gr.apply_checked and not copies
  for i, p in ipairs(gr.params) do
    local r = rec[p]
    if r.mine_n > 0 then
      local n = #values + 1
      values[n], updates[n], names[n] = copies and copies[i].value or p.value, scratch:update_of(p), p.name
      checked[n] = was and r.holds or false
      if scales then scales[n] = scale_of(G.options, gr.hp, p.logical_shape) end
    end
  end
  return values, updates, names, scales, checked
end

-- The message of the first of these applies that would write NaN or Inf
-- (one read of values and updates, writing nothing), or nil.
apply_failure = function(G, gr, values, updates, names, scales)
  local decay, alpha, cautious = G.kind.apply_coeffs(G.options, gr.hp)
  for _, part in ipairs(foreach.split_dtype(values, updates, scales or {})) do
    local ok, i = foreach.apply_finite(part[1], part[2], scales and part[3], decay, alpha, cautious)
    if not ok then
      local name
      for n, v in ipairs(values) do if v == part[1][i] then name = names[n] end end
      if not part[2][i]:all_finite() then
        local hook = writers(G, "update")
        if hook then -- (its Newton-Schulz input was checked finite: the hook made it)
          return ("parameter '%s': the update holds NaN or Inf after %s (the Newton-Schulz input was finite) (%s); "
            .. "nothing was changed"):format(name, hook, G.label)
        end
        return ("parameter '%s': update holds NaN or Inf (%s)"):format(name, G.label)
      end
      return ("parameter '%s': the step would leave NaN or Inf in the parameter (value * %.17g + "
        .. "%.17g * update overflows, or the value holds NaN or Inf) (%s); nothing was changed")
        :format(name, decay, alpha, G.label)
    end
  end
  return nil
end

-- The apply of a group's parameters (values[i] = values[i] * decay + alpha
-- * updates[i] * scales[i], names[i] for messages): one read of the values
-- and updates, computing what the commit writes without writing it,
-- except for the parts direction checked already (checked[i]). A NaN/Inf
-- update makes its result NaN/Inf too (alpha * u with alpha finite, 0 *
-- Inf = NaN), so this is also the updates' check; which one it was is
-- looked up only on a failure. Returns the apply list of the commit (per
-- dtype).
function CC.apply(G, gr, values, updates, names, scales, checked)
  local decay, alpha, cautious = G.kind.apply_coeffs(G.options, gr.hp)
  if not (finite(decay) and finite(alpha)) then
    E.raise(E.EINVAL, "%s: the step's decay (%s) or alpha (%s) is not finite", G.label, tostring(decay), tostring(alpha))
  end
  for i, v in ipairs(values) do
    if not v:is_contiguous() then E.raise(E.EINVAL, "parameter '%s': value is not contiguous", names[i]) end
  end
  local applies = {}
  for _, part in ipairs(foreach.split_dtype(values, updates, scales or {})) do
    applies[#applies + 1] = { part[1], part[2], decay, alpha, cautious, scales and part[3] }
  end
  if not gr.skip_derived then
    local cv, cu, cn, cs = values, updates, names, scales
    if checked then
      cv, cu, cn, cs = {}, {}, {}, scales and {}
      for i = 1, #values do
        if not checked[i] then
          local n = #cv + 1
          cv[n], cu[n], cn[n] = values[i], updates[i], names[i]
          if cs then cs[n] = scales[i] end
        end
      end
    end
    local msg = apply_failure(G, gr, cv, cu, cn, cs)
    if msg then nonfinite(G, gr, "%s", msg) end
  end
  return applies
end

-- Write an apply list of CC.apply (its values, in place). Nothing here
-- raises: CC.apply checked the same arguments.
function CC.write(applies)
  for _, a in ipairs(applies) do
    if a[5] then foreach.apply_cautious(a[1], a[2], a[6], a[3], a[4])
    else foreach.apply(a[1], a[2], a[6], a[3], a[4]) end
  end
end

-- What post_update_fn left in the private copies of the parameters
-- (stand_ins[i].value, the values the commit copies in) is finite.
function CC.stand_ins(G, gr, stand_ins)
  local values = {}
  for i, s in ipairs(stand_ins) do values[i] = s.value end
  local bad = foreach.first_nonfinite(values)
  if bad then
    nonfinite(G, gr, "parameter '%s': post_update_fn left NaN or Inf in the parameter (%s); nothing was changed",
      stand_ins[bad].name, G.label)
  end
end

return CC
