-- The checks of what a step's commit writes (muon.step): every tensor
-- that becomes state or a parameter's value is finite, or the group's
-- nonfinite policy applies: "error" fails the step naming the parameter
-- and the tensor (nothing changes), "skip" skips the group's step
-- (gr.skip_derived; on a mesh agreed with the failure flag). Nothing here
-- writes a parameter or the state.
--
--   local CC = require("muon.commit_checks")
--   CC.derived(run, G, gr, entries)          -- the NS input / hidden state a finite gradient overflowed
--   CC.state(scratch, records, G, gr)        -- hook state (copied from the hooks' buffers) and hook-written state
--   CC.parts(gr, rec, scratch, copies)       -- values, updates, names of the parts this rank holds
--   CC.apply(G, gr, values, updates, names)  -- value * decay + alpha * update, computed without writing
--                                            --> the apply list of the commit ({ values, updates, decay, alpha, cautious })
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
-- input, and the state the update does not show (kind.hidden_state_keys;
-- the update itself is checked by CC.apply). Under "skip" the NS inputs are
-- zeroed so that routing and Newton-Schulz stay finite.
function CC.derived(run, G, gr, entries)
  local list, owner = {}, {}
  for _, e in ipairs(entries) do
    if G.kind.ns then list[#list + 1] = e.u end
    for _, k in ipairs(G.kind.hidden_state_keys) do list[#list + 1] = e.new[k] end
    for _ = #owner + 1, #list do owner[#owner + 1] = e.p end
  end
  local bad = foreach.first_nonfinite(list)
  local name = bad and owner[bad].name
  if not name then -- (the state a kind writes in place at the commit: its direction checked it)
    for _, e in ipairs(entries) do
      if e.overflow then name = e.p.name break end
    end
  end
  if not name then return end
  if G.options.nonfinite ~= "skip" then
    local hook = G.kind.ns and writers(G, "input")
    if hook then
      E.raise(E.ENONFINITE, "parameter '%s': the Newton-Schulz input holds NaN or Inf after %s (its gradient is "
        .. "finite) (%s)", name, hook, G.label)
    end
    E.raise(E.ENONFINITE, "parameter '%s': its gradient is finite but the %s overflowed to NaN or Inf (%s)",
      name, G.kind.ns and "momentum (the Newton-Schulz input)" or table.concat(G.kind.hidden_state_keys, ", "),
      G.label)
  end
  gr.skip_derived = true
  if run.W == 1 then gr.skip = true end
  for _, e in ipairs(entries) do e.u:zero() end
end

-- Whether a hook of the group writes the kind's state (then the update
-- does not show it: it is checked on its own).
local function hook_writes_state(G)
  for _, h in ipairs(G.kind.HOOKS) do
    if K.HOOK_NAMES[h].writes_state and G.options[h] ~= nil then return true end
  end
  return false
end

-- The state the commit swaps in: the hooks' hook state is copied into it
-- from the buffers they saw (scratch:hook_buffer), then every state tensor
-- the update does not show is checked (hook state; the kind's state where a
-- hook wrote it; the hidden state was checked by CC.derived). records:
-- param -> its plan record.
function CC.state(scratch, records, G, gr)
  local list, owner, key = {}, {}, {}
  local kind_keys = {}
  if hook_writes_state(G) then
    local hidden = {}
    for _, k in ipairs(G.kind.hidden_state_keys) do hidden[k] = true end
    for _, k in ipairs(G.kind.state_keys) do
      if not hidden[k] then kind_keys[#kind_keys + 1] = k end
    end
  end
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
    nonfinite(G, gr, "parameter '%s': %s would hold NaN or Inf after the step (%s); nothing was changed",
      owner[bad].name, hook and ("hook state '" .. hook .. "' (pre_ortho_fn / post_ortho_fn)")
        or ("state tensor '" .. k .. "' (written by a hook)"), G.label)
  end
end

-- This rank's parts of a group's stepping parameters (gr.params; rec:
-- param -> plan record; those this rank holds elements of): their values
-- (copies[i].value with copies, the stand-ins of post_update_fn), their
-- update buffers (scratch) and names, three lists for CC.apply.
function CC.parts(gr, rec, scratch, copies)
  local values, updates, names = {}, {}, {}
  for i, p in ipairs(gr.params) do
    if rec[p].mine_n > 0 then
      local n = #values + 1
      values[n], updates[n], names[n] = copies and copies[i].value or p.value, scratch:update_of(p), p.name
    end
  end
  return values, updates, names
end

-- The apply of a group's parameters (values[i] += ... updates[i], names[i]
-- for messages): one read of the values and updates, computing what the
-- commit writes without writing it. A NaN/Inf update makes its result
-- NaN/Inf too (alpha * u with alpha finite, 0 * Inf = NaN), so this is also
-- the updates' check; which one it was is looked up only on a failure.
-- Returns the apply list of the commit (per dtype).
function CC.apply(G, gr, values, updates, names)
  local decay, alpha, cautious = G.kind.apply_coeffs(G.options, gr.hp)
  if not (finite(decay) and finite(alpha)) then
    E.raise(E.EINVAL, "%s: the step's decay (%s) or alpha (%s) is not finite", G.label, tostring(decay), tostring(alpha))
  end
  for i, v in ipairs(values) do
    if not v:is_contiguous() then E.raise(E.EINVAL, "parameter '%s': value is not contiguous", names[i]) end
  end
  local applies = {}
  for _, part in ipairs(foreach.split_dtype(values, updates)) do
    applies[#applies + 1] = { part[1], part[2], decay, alpha, cautious }
    if not gr.skip_derived then
      local ok, i = foreach.apply_finite(part[1], part[2], nil, decay, alpha, cautious)
      if not ok then
        local name
        for n, v in ipairs(values) do if v == part[1][i] then name = names[n] end end
        local hook = writers(G, "update")
        if not part[2][i]:all_finite() and hook then
          -- (its Newton-Schulz input was checked finite: the hook made it)
          nonfinite(G, gr, "parameter '%s': the update holds NaN or Inf after %s (the Newton-Schulz input was "
            .. "finite) (%s); nothing was changed", name, hook, G.label)
        elseif not part[2][i]:all_finite() then
          nonfinite(G, gr, "parameter '%s': update holds NaN or Inf (%s)", name, G.label)
        else
          nonfinite(G, gr, "parameter '%s': the step would leave NaN or Inf in the parameter (value * %.17g + "
            .. "%.17g * update overflows, or the value holds NaN or Inf) (%s); nothing was changed",
            name, decay, alpha, G.label)
        end
      end
    end
  end
  return applies
end

-- Write an apply list of CC.apply (its values, in place). Nothing here
-- raises: CC.apply checked the same arguments.
function CC.write(applies)
  for _, a in ipairs(applies) do
    if a[5] then foreach.apply_cautious(a[1], a[2], nil, a[3], a[4])
    else foreach.apply(a[1], a[2], nil, a[3], a[4]) end
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
