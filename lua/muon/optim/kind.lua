-- Optimizer kinds: the contract, the list, the hooks and the option schema,
-- each declared once here. A kind (muon.optim.muon, .adamw, .lion) is one
-- file that registers itself (K.register) when it loads; muon.optim.kinds
-- loads them all. This module requires no kind.
--[[ reference muon.optim.kind
    The optimizer kind contract, in the spirit of Knot Resolver's
    kr_layer_api: a kind is a table of the members below (Kind.*). The step
    protocol (muon.step) calls only the members a kind supplies (an
    optional member left out is skipped, never stubbed), and K.register
    checks a kind once, when its file loads. Each kind declares its options
    as data (the option schema, in the spirit of Snabb's lib.parse), and
    everything about options derives from it: the checks (muon.optim.Muon /
    AdamW / Lion and the engine's groups), the per-step checks of
    schedulable values, the `muon check` display, what checkpoints save and
    what a load restores, the cross-rank config agreement, and the
    sandbox's view of the classes.
## The list
muon.optim.kind.KINDS
    Every kind, in checkpoint order: { name, class, module }. name is
    `optimizer = name` in a config group and the kind in checkpoints; class
    the one-process optimizer muon.optim.<class>; module its file.
muon.optim.kind.DEFAULT
    The kind of a config group without `optimizer` ("muon").
## The members a kind supplies
muon.optim.kind.MEMBERS
    { name, type, required } of every member a kind may supply (the
    Kind entries below up to replica_count); register checks them.
Kind.name
Kind.class
    Its name and class name, as in KINDS (required).
Kind.options
    The option schema (required): a list of entries { name, default,
    check, schedulable = bool, show = n, saved = bool, load = "restore" |
    "config", optional = bool }, checked in this order. default: the value
    when a group does not set it (nil: none); check(v, name, group) raises
    naming the option and the value (muon.optim.options); optional: a nil
    value skips the check. schedulable: a config's schedule may set it per
    step, and every step checks the value it uses. show: `muon check` lists
    it first, in this rank (the others only when they differ from the
    default). saved (default true): a checkpoint keeps its value (when it
    is plain data). load: what an engine's checkpoint load does with a
    saved value: "restore" (it replaces the group's until the next step;
    the default for schedulable options) or "config" (the config's value
    stays, a note on stderr when they differ; the default for the others).
    Two markers splice shared entries in: HOOK_OPTIONS and COMMON_OPTIONS.
Kind.state
    Per-parameter state tensors (required): a list of { key, min = n }.
    Keys other than "step" and "hook.*". min: the least value the kind's
    maths leave in the tensor (AdamW's exp_avg_sq >= 0), an invariant a
    loaded checkpoint must hold (as every state tensor, finite in the
    group's state_dtype: the step checks each state tensor it writes for
    NaN/Inf).
Kind.counts_steps
    true: it keeps a step count per parameter (state.step; saved in
    checkpoints).
Kind.direction(ctx, group, hp, entries)
    On each state holder (required): the new state and the update (or the
    Newton-Schulz input) into the step's buffers. group is the group's
    option table (defaults merged, checked; step = its step count), hp the
    values of this step (the group's, with the schedule's on top). entry =
    { p, grad, old = { key -> tensor }, new = { key -> tensor }, u = update
    buffer, count = the parameter's step number after this step, work = a
    table for the kind's own buffers, kept across steps }; it reads old,
    writes new and u (and its work buffers) and changes nothing else; a
    hook it calls sees work buffers, never old or new. A kind with checks
    returns what it checked in the same passes (see Kind.checks).
Kind.checks
    true: direction checks what it writes, in its own passes, and returns
    bad, applies: bad nil when every entry's u and new state (as stored)
    is finite, else the index of an entry where one is NaN or Inf (a
    NaN/Inf gradient always shows there; state a hook wrote is the step's
    to check, naming the hook); applies true when the same passes
    also checked the apply's result for every entry (e.p.value * decay +
    alpha * e.u * scale, with apply_coeffs' and apply_scale's values). The
    step then checks neither those gradients, nor those outputs, nor (with
    applies) those applies again; on a bad value it finds out which check
    failed for its message. Without it the step checks the gradients, the
    Newton-Schulz input, every state tensor direction wrote (as stored) and
    every apply.
Kind.apply_coeffs(group, hp)
    -> decay, alpha, cautious (required): the commit does p = p * decay +
    alpha * u * scale (cautious: the decay only where the update moves p
    towards 0; scale: apply_scale's, else 1).
Kind.apply_scale(group, hp, shape)
    -> the scale the apply multiplies the update of a parameter of this
    global shape by (one pass fewer when orthogonalize leaves it to the
    apply); a kind without it gets 1.
Kind.resolve(group)
    Checks across options and derived values (fields starting with "_"),
    after every option's own check.
Kind.check_param(p, group)
    Raises for a parameter the kind cannot step.
Kind.orthogonalize(ctx, group, hp, items)
    Newton-Schulz (and its scale, unless apply_scale takes it) in place
    on the owner's items { name, input, state, shape, signals, region }; a
    kind with it runs Newton-Schulz (its inputs are routed to owners on a
    mesh). ctx is the step's narrow context (muon.kind_context):
    ctx:batch_buffer(dtype, n, a, b, slot) -> a reusable (n, a, b) tensor,
    ctx:ns_workspace(dtype, a, b) -> a Newton-Schulz workspace,
    ctx:ns_many(jobs) -> Newton-Schulz in place on every { x = tensor, r =
    resolved options } in one scheduler call.
Kind.ns_prepare(ctx, group, hp, items, jobs)
Kind.ns_finish(ctx, group, hp, items, done)
    The two halves of orthogonalize around one scheduler call for many
    batches: ns_prepare appends its jobs and returns done (nil: use
    orthogonalize), ns_finish completes them. Both or neither, with
    orthogonalize.
Kind.hook_shapes(group, shape)
    -> list of { name, key, shape }: the hook state tensors of a parameter
    of this global shape.
Kind.post_update(group, hp, params, boxes, signals, reducers)
    post_update_fn on each stepped parameter, before the commit: params are
    stand-ins whose value is a private copy of this rank's piece after the
    apply (the commit copies it into the parameter); reducers[i] = {
    allreduce, global_norm } for params[i] on a mesh (muon.reduce; nil: one
    process).
Kind.replica_count(v)
    -> n: the seed's hsdp_replica_count as a number.
Kind.in_place_state(group)
Kind.commit_state(group, hp, entries)
    Both or neither, with checks. in_place_state -> the state keys of the
    group whose new value the kind writes in place at the commit (no second
    buffer: the step's scratch stays small), or nil. For those keys
    direction gets old[k] (the state, or on a parameter's first step zeros
    that become it) and no new[k]; its report (Kind.checks) covers the value
    commit_state will write, as stored (the nonfinite policy applies);
    commit_state then writes it into old[k] from what it read (grad, old),
    after the parameters' apply; it must not fail.
## What register derives from the schema (set on the kind)
Kind.ENTRIES
    The schema's entries with the markers expanded, in check order.
Kind.DEFAULTS
    name -> default, for the options that have one.
Kind.OPTIONS
    name -> true, every option.
Kind.SCHEDULABLE
    name -> check, the schedulable options.
Kind.SCHEDULE_ORDER
    The schedulable names, sorted: the per-step checks run in this order.
Kind.HOOKS
    The hook options it takes, in HOOKS order.
Kind.DISPLAY
    `muon check`'s first keys (the entries with show, in its order).
Kind.SAVED
    name -> true, the options a checkpoint keeps.
Kind.LOAD
    name -> "restore" | "config" (see Kind.options).
Kind.state_keys
Kind.state_min
    The state keys, in Kind.state's order; key -> its min (the keys that
    have one).
Kind.ns
    Whether it runs Newton-Schulz (it has orthogonalize).
## Hooks
muon.optim.kind.HOOKS
    The hook options (Lua functions of a config), in the order `muon check`
    lists them: { name, signature, whole =, reshapes =, keeps_state =,
    reduces =, writes_state =, writes = }. whole: a parameter of a group that sets it
    is orthogonalized whole on one rank; reshapes: it reshapes the
    Newton-Schulz input; keeps_state: it sees the group's hook_state (one
    table for every such hook of a group); reduces: its ctx has allreduce
    and global_norm (muon.reduce); writes_state: it writes the kind's state
    (checked for NaN/Inf on its own); writes: what of the step it writes
    ("input": the Newton-Schulz input, "update": the update), for the
    message that names the hook when that holds NaN or Inf (pre_ortho_fn's
    result is checked where it runs).
muon.optim.kind.HOOK_NAMES
    name -> its HOOKS entry.
muon.optim.kind.HOOK_KEYS
    The hook options as a set, with hook_state.
muon.optim.kind.HOOK_STATE_RULES
    The rules of hook_state = { name = rule }: { rule, first dim, second
    dim } per 2-D core matrix (rows x cols): "rows", "cols" or 1, in the
    order messages list them; rows_rows and cols_cols are preconditioners.
muon.optim.kind.hook_state_rule(name)
    The rule named name, or nil.
muon.optim.kind.whole(kind, group)
    Whether the group's hooks make its parameters orthogonalize whole.
## The option schema
muon.optim.kind.HOOK_OPTIONS
    The marker for every hook of HOOKS, then hook_state (a kind takes all
    of them or none).
muon.optim.kind.COMMON_OPTIONS
    The marker for COMMON (added at the end when a kind does not place it).
muon.optim.kind.COMMON
    The options every kind has: nonfinite ("error" | "skip") and
    state_dtype ("float32" | "bfloat16").
muon.optim.kind.register(kind)
    Check a kind against the contract and set what derives from its
    schema; returns it. Raises EINVAL naming the kind and the member.
muon.optim.kind.validate(kind, group)
    Every option of a group (defaults merged) checked in schema order,
    then kind.resolve; an EINVAL error object naming the option and value.
muon.optim.kind.check_step(kind, hp)
    This step's value of every schedulable option, in SCHEDULE_ORDER.
muon.optim.kind.serialize(v)
    A value as canonical text, the same in every process (numbers as
    %.17g, table keys sorted, nested tables, code by its type): what ranks
    compare to agree on a config and a step's values.
]]
local O = require("muon.optim.options")
local E = require("muon.errors")

local K = {}

--------------------------------------------------------------- the kinds

-- (KINDS and DEFAULT: see the reference block)
K.KINDS = {
  { name = "muon", class = "Muon", module = "muon.optim.muon" },
  { name = "adamw", class = "AdamW", module = "muon.optim.adamw" },
  { name = "lion", class = "Lion", module = "muon.optim.lion" },
}
K.DEFAULT = "muon"

local BY_NAME = {}
for _, e in ipairs(K.KINDS) do BY_NAME[e.name] = e end

------------------------------------------------------------ the contract

-- The members a kind supplies: { name, type, required } (their contract:
-- the Kind entries of the reference block).
K.MEMBERS = {
  { "name", "string", true }, { "class", "string", true }, { "options", "table", true },
  { "state", "table", true }, { "counts_steps", "boolean", false }, { "direction", "function", true },
  { "checks", "boolean", false }, { "apply_coeffs", "function", true }, { "apply_scale", "function", false },
  { "resolve", "function", false }, { "check_param", "function", false },
  { "orthogonalize", "function", false }, { "ns_prepare", "function", false }, { "ns_finish", "function", false },
  { "hook_shapes", "function", false }, { "post_update", "function", false }, { "replica_count", "function", false },
  { "in_place_state", "function", false }, { "commit_state", "function", false },
}

-------------------------------------------------------------- the hooks

-- (HOOKS, HOOK_STATE_RULES and their flags: see the reference block)
K.HOOKS = {
  { "zeropower_fn", "(x, steps) -> orthogonalized x", writes = "update" },
  { "momentum_update_fn", "(grads, bufs, m1, m2, nesterov) -> updates", writes_state = true, writes = "input" },
  { "reshape_fn", "(name, x) -> views of x", whole = true, reshapes = true, writes = "update" },
  { "ns_transform_fn", "(name, x) -> nil or { tensors, restore }", whole = true, reshapes = true, writes = "update" },
  { "post_update_fn", "(param, local_tensor, ctx)", reduces = true },
  { "pre_ortho_fn", "(G, state, ctx): on the Newton-Schulz input, after momentum", whole = true, keeps_state = true,
    reduces = true },
  { "post_ortho_fn", "(O, state, ctx): after Newton-Schulz, before the scale", whole = true, keeps_state = true,
    reduces = true, writes = "update" },
}
K.HOOK_STATE_RULES = {
  { "rows", "rows", 1 },
  { "cols", 1, "cols" },
  { "matrix", "rows", "cols" },
  { "scalar", 1, 1 },
  { "rows_rows", "rows", "rows" },
  { "cols_cols", "cols", "cols" },
}

-- The hook names as a set; the hook options: the hooks and hook_state
-- (a kind takes all of them or none: K.HOOK_OPTIONS).
K.HOOK_NAMES = {}
for _, h in ipairs(K.HOOKS) do K.HOOK_NAMES[h[1]] = h end
K.HOOK_KEYS = { hook_state = true }
for _, h in ipairs(K.HOOKS) do K.HOOK_KEYS[h[1]] = true end

function K.hook_state_rule(name)
  for _, r in ipairs(K.HOOK_STATE_RULES) do
    if r[1] == name then return r end
  end
  return nil
end

local RULE_NAMES = {}
for i, r in ipairs(K.HOOK_STATE_RULES) do RULE_NAMES[i] = "'" .. r[1] .. "'" end
local RULE_LIST = table.concat(RULE_NAMES, ", ", 1, #RULE_NAMES - 1) .. " or " .. RULE_NAMES[#RULE_NAMES]
local STATE_HOOKS = {}
for _, h in ipairs(K.HOOKS) do
  if h.keeps_state then STATE_HOOKS[#STATE_HOOKS + 1] = h[1] end
end

-- hook_state = { name = rule, ... }: the per-parameter state of the hooks
-- that keep state, one table per group (every such hook sees it).
local function check_hook_state(v, _, g)
  local function fail(fmt, ...) E.raise(E.EINVAL, fmt, ...) end
  if type(v) ~= "table" then
    fail("hook_state must be a table { name = %s, ... }, got %s", table.concat(RULE_NAMES, " | "), type(v))
  end
  local any = false
  for k, rule in pairs(v) do
    if type(k) ~= "string" or not k:match("^[%a_][%w_]*$") then fail("hook_state names must be identifiers, got %s", tostring(k)) end
    if not K.hook_state_rule(rule) then fail("hook_state.%s must be %s, got %s", k, RULE_LIST, tostring(rule)) end
    any = true
  end
  local kept = false
  for _, h in ipairs(STATE_HOOKS) do kept = kept or g[h] ~= nil end
  if any and not kept then
    fail("hook_state needs a %s (the hook that keeps it)", table.concat(STATE_HOOKS, " or a "))
  end
end

-- Whether a group's hooks make its parameters orthogonalize whole.
function K.whole(kind, group)
  for _, h in ipairs(kind.HOOKS) do
    if K.HOOK_NAMES[h].whole and group[h] ~= nil then return true end
  end
  return false
end

-------------------------------------------------------- the option schema

-- The schema's format and its two markers: Kind.options in the reference
-- block.
K.HOOK_OPTIONS = setmetatable({}, { __tostring = function() return "K.HOOK_OPTIONS" end })
K.COMMON_OPTIONS = setmetatable({}, { __tostring = function() return "K.COMMON_OPTIONS" end })

-- Options every kind has.
K.COMMON = {
  -- NaN/Inf gradient: "error" (the step fails, nothing changes) or "skip" (the group skips the step)
  { "nonfinite", "error", O.oneof({ "error", "skip" }) },
  -- the dtype of the kind's state tensors: "float32" (the parameters' own
  -- dtype) or "bfloat16" (float32 parameters: half the bytes; the maths stay
  -- float32, each new state rounded once). Layout, not a value: not saved
  -- (a checkpoint's tensors are converted to it on load).
  { "state_dtype", "float32", O.oneof({ "float32", "bfloat16" }), saved = false },
}

local ENTRY_KEYS = { [1] = true, [2] = true, [3] = true, schedulable = true, show = true, saved = true,
  load = true, optional = true, hook = true }

local function expand(schema)
  local out = {}
  local common = false
  for _, e in ipairs(schema) do
    if e == K.HOOK_OPTIONS then
      for _, h in ipairs(K.HOOKS) do out[#out + 1] = { h[1], nil, O.fn(), hook = true, optional = true } end
      -- layout, not a value: not saved (the config declares it)
      out[#out + 1] = { "hook_state", nil, check_hook_state, optional = true, saved = false }
    elseif e == K.COMMON_OPTIONS then
      common = true
      for _, c in ipairs(K.COMMON) do out[#out + 1] = c end
    else
      out[#out + 1] = e
    end
  end
  if not common then
    for _, c in ipairs(K.COMMON) do out[#out + 1] = c end
  end
  return out
end

-- What derives from a schema, set on the kind (the reference block's
-- second part: ENTRIES, DEFAULTS, ..., ns).
local function derive(kind, entries)
  local d = { DEFAULTS = {}, OPTIONS = {}, SCHEDULABLE = {}, SCHEDULE_ORDER = {}, HOOKS = {}, DISPLAY = {},
    SAVED = {}, LOAD = {}, ENTRIES = entries }
  local shown = {}
  for _, e in ipairs(entries) do
    local name = e[1]
    d.OPTIONS[name] = true
    if e[2] ~= nil then d.DEFAULTS[name] = e[2] end
    if e.schedulable then
      d.SCHEDULABLE[name] = e[3]
      d.SCHEDULE_ORDER[#d.SCHEDULE_ORDER + 1] = name
    end
    if e.hook then d.HOOKS[#d.HOOKS + 1] = name end
    if e.show then shown[#shown + 1] = e end
    if e.saved ~= false then d.SAVED[name] = true end
    d.LOAD[name] = e.load or (e.schedulable and "restore" or "config")
  end
  table.sort(d.SCHEDULE_ORDER)
  table.sort(shown, function(a, b) return a.show < b.show end)
  for i, e in ipairs(shown) do d.DISPLAY[i] = e[1] end
  d.state_keys, d.state_min = {}, {}
  for _, s in ipairs(kind.state) do
    d.state_keys[#d.state_keys + 1] = s[1]
    d.state_min[s[1]] = s.min
  end
  d.ns = kind.orthogonalize ~= nil
  for k, v in pairs(d) do kind[k] = v end
end

local STATE_KEYS = { [1] = true, min = true }

-- Check a kind against the contract (once, when its module loads) and set
-- what derives from its schema. Raises naming the kind and the member.
function K.register(kind)
  local what = "optimizer kind '" .. tostring(kind.name) .. "'"
  local entry = BY_NAME[kind.name]
  if not entry then E.raise(E.EINVAL, "%s is not in muon.optim.kind's list (K.KINDS)", what) end
  if kind.class ~= entry.class then
    E.raise(E.EINVAL, "%s: class must be '%s' (K.KINDS), got %s", what, entry.class, tostring(kind.class))
  end
  local valid = {}
  for _, m in ipairs(K.MEMBERS) do
    valid[m[1]] = true
    local v = kind[m[1]]
    if v == nil and m[3] then
      E.raise(E.EINVAL, "%s: member '%s' is missing (muon.optim.kind's reference: Kind.%s)", what, m[1], m[1])
    end
    if v ~= nil and type(v) ~= m[2] then
      E.raise(E.EINVAL, "%s: member '%s' must be a %s, got %s", what, m[1], m[2], type(v))
    end
  end
  E.check_keys(kind, valid, "member", what)
  if (kind.ns_prepare == nil) ~= (kind.ns_finish == nil) or (kind.ns_prepare and not kind.orthogonalize) then
    E.raise(E.EINVAL, "%s: ns_prepare and ns_finish come together, with orthogonalize", what)
  end
  if (kind.in_place_state == nil) ~= (kind.commit_state == nil) or (kind.in_place_state and not kind.checks) then
    E.raise(E.EINVAL, "%s: in_place_state and commit_state come together, with checks = true", what)
  end
  local entries, seen = expand(kind.options), {}
  for i, e in ipairs(entries) do
    if type(e) ~= "table" or type(e[1]) ~= "string" then E.raise(E.EINVAL, "%s: options[%d] has no name", what, i) end
    E.check_keys(e, ENTRY_KEYS, "schema field", ("%s: option '%s'"):format(what, e[1]))
    if seen[e[1]] then E.raise(E.EINVAL, "%s: option '%s' is declared twice", what, e[1]) end
    seen[e[1]] = true
    if type(e[3]) ~= "function" then E.raise(E.EINVAL, "%s: option '%s' has no check", what, e[1]) end
    if e.load ~= nil and e.load ~= "restore" and e.load ~= "config" then
      E.raise(E.EINVAL, "%s: option '%s': load must be 'restore' or 'config'", what, e[1])
    end
  end
  for _, s in ipairs(kind.state) do
    if type(s) ~= "table" or type(s[1]) ~= "string" or s[1]:find("^hook%.") or s[1] == "step"
      or (s.min ~= nil and type(s.min) ~= "number") then
      E.raise(E.EINVAL, "%s: state entries are { key, min = number } with a key other than 'step' or 'hook.*'", what)
    end
    E.check_keys(s, STATE_KEYS, "state entry field", what)
  end
  derive(kind, entries)
  return kind
end

-- Check a group's options (defaults already merged) in schema order, then
-- the kind's resolve. Raises an EINVAL error object (no position) naming
-- the option and the value.
function K.validate(kind, group)
  for _, e in ipairs(kind.ENTRIES) do
    local v = group[e[1]]
    if v ~= nil or not e.optional then e[3](v, e[1], group) end
  end
  if kind.resolve then kind.resolve(group) end
end

-- Check this step's value of every schedulable option of a group (hp: the
-- step's values), in SCHEDULE_ORDER.
function K.check_step(kind, hp)
  for _, k in ipairs(kind.SCHEDULE_ORDER) do kind.SCHEDULABLE[k](hp[k], k, hp) end
end

------------------------------------------------- canonical serialization

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do
    if not (type(k) == "number" and k >= 1 and k <= #t and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" or ta == "string" then return a < b end
    return tostring(a) < tostring(b)
  end)
  return keys
end

local function serialize(v, depth)
  local t = type(v)
  if t == "number" then return ("%.17g"):format(v) end
  if t == "table" then
    if depth > 8 then return "{...}" end
    local parts = {}
    for i = 1, #v do parts[i] = serialize(v[i], depth + 1) end
    for _, k in ipairs(sorted_keys(v)) do parts[#parts + 1] = serialize(k, depth + 1) .. "=" .. serialize(v[k], depth + 1) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  if t == "function" or t == "userdata" or t == "cdata" or t == "thread" then return t end
  return tostring(v)
end

-- A value as canonical text: the same value gives the same text in every
-- process (numbers as %.17g, table keys sorted, nested tables; code by its
-- type): what ranks compare to agree on a config and a step's values.
function K.serialize(v) return serialize(v, 0) end

return K
