-- Checkpoints: the optimizer state of a step protocol (muon.step) as data
-- and as safetensors files, for one process and for meshes alike. The
-- kinds (muon.optim.kind) are those of the stepper's groups; a file naming
-- another kind of the list (K.KINDS) is refused as not matching.
--
-- A state dict (per optimizer kind, muon.optim.kind) is plain data:
--   { kind = "muon"|"adamw"|..., params = { {name, shape, dtype, group}, ... },
--     state = { [name] = { <state key> = t, ..., step = n (kinds that count steps) } },
--     groups = { {step = n, options = { lr = ..., momentum = ..., ... }}, ... } }
-- (options: the group's hyperparameters, as torch's param_groups; a load
-- restores them; files without them load as before) with full (global-shape) tensors. On a mesh each state buffer lives on
-- one rank per box (muon.dist's holder): saving gathers the full tensors to
-- rank 0, which writes one file; loading reads the file on every rank and
-- each holder keeps its box. The file never depends on the mesh. (A
-- sharded checkpoint, muon.checkpoint_sharded, is a directory where each
-- holder writes its own boxes; its load goes through S.load too.)
--
-- Checkpoint files: tensors "<prefix><param name>/<state key>"; the
-- parameter lists, group steps and per-parameter scalars go in the metadata
-- as canonical JSON, with an XXH64 checksum over the metadata. Everything a
-- file says is validated like a config value before anything changes; a
-- mismatch with the optimizer lists every difference.
local ffi = require("ffi")
local bit = require("bit")
local core = require("muon.core")
local C = core.C
local cjson = require("cjson").new()
cjson.decode_invalid_numbers(false)
cjson.decode_max_depth(16)
local st = require("muon.safetensors")
local T = require("muon.tensor")
local E = require("muon.errors")
local D = require("muon.dist")
local K = require("muon.optim.kind")
local foreach = require("muon.foreach")

local S = {}

-- The data section is covered by st.save's "muon.checksum"; the metadata
-- (parameter list, steps, scalars, engine values) by this one: XXH64 of the
-- other metadata entries (but muon.format, which st.save adds), sorted, as
-- "key=value\n".
local META_SUM = "muon.state_checksum"
local function meta_checksum(meta)
  local keys = {}
  for k in pairs(meta) do
    if k ~= META_SUM and k ~= "muon.checksum" and k ~= "muon.format" then keys[#keys + 1] = k end
  end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = k .. "=" .. meta[k] .. "\n" end
  local text = table.concat(parts)
  local out = ffi.new("uint64_t[1]")
  core.check(C.mu_st_checksum_bytes(text, #text, out), "checksum", 2)
  return "xxh64:" .. bit.tohex(out[0], 16)
end

S.meta_checksum = meta_checksum

-- JSON with object keys sorted, so that the same state always gives the
-- same bytes (cjson's key order follows its hash table, which differs
-- between processes). Values are strings, numbers, booleans, lists, maps.
local function canonical_json(v)
  local t = type(v)
  if t == "table" then
    local n, count = #v, 0
    for _ in pairs(v) do count = count + 1 end
    local parts = {}
    if count == n and (n > 0 or next(v) == nil) then
      for i = 1, n do parts[i] = canonical_json(v[i]) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    for i, k in ipairs(keys) do
      local x = v[k]
      if x == nil then x = v[tonumber(k)] end
      parts[i] = cjson.encode(k) .. ":" .. canonical_json(x)
    end
    return "{" .. table.concat(parts, ",") .. "}"
  elseif t == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
    return ("%.17g"):format(v)
  end
  return cjson.encode(v)
end

S.canonical_json = canonical_json

-- What a checkpoint holds per parameter of a kind (a kind object): its
-- scalars (the step count of kinds that count steps); its state tensors
-- are kind.state_keys, in that order.
local function scalar_keys(kind) return kind.counts_steps and { step = true } or {} end

-- The kinds of a stepper's groups: name -> kind.
local function kinds_of(stepper)
  local kinds = {}
  for _, G in ipairs(stepper:group_specs()) do kinds[G.kind.name] = G.kind end
  return kinds
end

local function fmt_shape(s) return "(" .. table.concat(s, ", ") .. ")" end

-- A group's hyperparameters as plain data (torch's param_groups without
-- params): every saved option of its kind's schema whose value is a
-- number, a string, a boolean or a list of them (hooks are code, never
-- plain; hook_state is layout, not saved).
local function is_plain(v, depth)
  local t = type(v)
  if t == "number" then return v == v and v ~= math.huge and v ~= -math.huge end
  if t == "string" or t == "boolean" then return true end
  if t ~= "table" or depth > 2 or getmetatable(v) ~= nil then return false end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  if n ~= #v then return false end
  for i = 1, n do
    if not is_plain(v[i], depth + 1) then return false end
  end
  return true
end

local function copy_plain(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for i = 1, #v do c[i] = copy_plain(v[i]) end
  return c
end

local function group_options(kind, options)
  local out = {}
  for k in pairs(kind.SAVED) do
    local v = options[k]
    if v ~= nil and is_plain(v, 0) then out[k] = copy_plain(v) end
  end
  return out
end

-- The groups of one kind (its name) in a stepper, and their parameters:
-- returns groups (list of { index = stepper group index, options, kind }),
-- params (list of { p, group = index among the kind's groups, kind, hooks }).
local function of_kind(stepper, kind)
  local groups, params = {}, {}
  for gi, G in ipairs(stepper:group_specs()) do
    if G.kind.name == kind then
      groups[#groups + 1] = { index = gi, options = G.options, kind = G.kind }
      for _, p in ipairs(stepper:params(gi)) do
        params[#params + 1] = { p = p, group = #groups, kind = G.kind,
          hooks = G.kind.hook_shapes and G.kind.hook_shapes(G.options, p.logical_shape) or {} }
      end
    end
  end
  return groups, params
end

-- The state tensors of a parameter: its kind's, then its hook state's
-- ("hook.<name>"), each { key, shape (global), record (of the plan, on a
-- mesh: boxes and holders), dtype (as the group keeps it), min (the kind's
-- invariant, Kind.state_min) }.
local function tensor_specs(stepper, e)
  local list = {}
  local rec = stepper:record(e.p)
  local r = stepper:size() > 1 and rec or nil
  for _, k in ipairs(e.kind.state_keys) do
    list[#list + 1] = { key = k, shape = e.p.logical_shape, record = r, dtype = rec.state_dtype,
      min = e.kind.state_min[k] }
  end
  for _, h in ipairs(e.hooks) do
    list[#list + 1] = { key = h.key, shape = h.shape, record = r and r.hook_records[h.key], dtype = rec.dtype }
  end
  return list
end

-- Whether a checkpoint's state tensor of dtype `have` loads as `want`
-- (converted): float32 and bfloat16 state are interchangeable.
local function convertible(have, want)
  return have == want or (have == "float32" or have == "bfloat16") and (want == "float32" or want == "bfloat16")
end

------------------------------------------------------------- state dicts

-- Where each box of a parameter's state lives: the plan's record.
local function holders(stepper, p) return stepper:record(p) end

-- The state dict of one kind: on one process it shares the live tensors;
-- on a mesh the full tensors are gathered to rank 0 (collective; other
-- ranks get the dict without tensors).
function S.state_dict(stepper, kind)
  stepper:build_once()
  local groups, params = of_kind(stepper, kind)
  local d = { kind = kind, params = {}, state = {}, groups = {} }
  for li, g in ipairs(groups) do d.groups[li] = { step = g.options.step, options = group_options(g.kind, g.options) } end
  local pieces = {} -- gathers on a mesh: { dtype, sends, recvs }
  local W, me = stepper:size(), stepper:rank()
  for _, e in ipairs(params) do
    local p = e.p
    d.params[#d.params + 1] = { name = p.name, shape = p.logical_shape, dtype = p.value:dtype(), group = e.group }
    local n = stepper:step_count(p)
    if n > 0 then
      local entry = {}
      if scalar_keys(e.kind).step then entry.step = n end
      if W == 1 then
        -- (an empty parameter steps without state: its state is zeros)
        local s = stepper:state_of(p) or {}
        for _, t in ipairs(tensor_specs(stepper, e)) do entry[t.key] = s[t.key] or T.zeros(t.shape, t.dtype) end
      else
        for _, t in ipairs(tensor_specs(stepper, e)) do
          local k, r = t.key, t.record
          local full = me == 0 and T.zeros(t.shape, t.dtype) or nil
          entry[k] = full
          local piece = pieces[t.dtype]
          if not piece then
            piece = { sends = {}, recvs = {} }
            for q = 1, W do piece.sends[q], piece.recvs[q] = {}, {} end
            pieces[t.dtype] = piece
          end
          if me == 0 then
            -- rank 0 receives every non-empty box (O(shard count) per
            -- parameter; an empty parameter's state stays zeros)
            for _, hb in ipairs(D.boxes_of(r, stepper:mesh())) do
              local h, b = hb.holder, hb.box
              local dst = D.box_view(full, b)
              if h == 0 then dst:copy(stepper:state_of(p)[k])
              else table.insert(piece.recvs[h + 1], { n = D.numel(b.len), dst = dst }) end
            end
          elseif r.holds and D.numel(r.mine.len) > 0 then
            table.insert(piece.sends[1], { n = D.numel(r.mine.len), src = stepper:state_of(p)[k] })
          end
        end
      end
      d.state[p.name] = entry
    end
  end
  if W > 1 then
    -- One exchange per dtype, in a fixed order (the same on every rank).
    for code = 0, #T.DTYPE_NAMES do
      local dt = T.DTYPE_NAMES[code]
      local piece = pieces[dt]
      if piece then stepper:exchange_control(dt, piece.sends, piece.recvs) end
    end
  end
  return d
end

-- Every difference between a state dict and the stepper's parameters of
-- that kind.
function S.mismatches(stepper, kind, d)
  local problems = {}
  local function add(...) problems[#problems + 1] = string.format(...) end
  local groups, params = of_kind(stepper, kind)
  if d.kind ~= kind then add("optimizer kind: checkpoint has %s, this optimizer is %s", tostring(d.kind), kind) end
  if #d.groups ~= #groups then
    add("param groups: checkpoint has %d, this optimizer has %d", #d.groups, #groups)
  end
  local current = {}
  for _, e in ipairs(params) do current[e.p.name] = e end
  local seen = {}
  for _, e in ipairs(d.params or {}) do
    seen[e.name] = true
    local c = current[e.name]
    if not c then
      add("parameter '%s' is in the checkpoint but not in this optimizer", e.name)
    else
      local shape = c.p.logical_shape
      if fmt_shape(shape) ~= fmt_shape(e.shape) then
        add("parameter '%s': shape %s in the checkpoint, %s here", e.name, fmt_shape(e.shape), fmt_shape(shape))
      end
      if e.dtype ~= c.p.value:dtype() then
        add("parameter '%s': dtype %s in the checkpoint, %s here", e.name, tostring(e.dtype), c.p.value:dtype())
      end
      if e.group ~= c.group then
        add("parameter '%s': group %s in the checkpoint, %d here", e.name, tostring(e.group), c.group)
      end
    end
  end
  for name in pairs(current) do
    if not seen[name] then add("parameter '%s' is missing from the checkpoint", name) end
  end
  for name, entry in pairs(d.state or {}) do
    local c = current[name]
    if c then
      local want = {}
      for _, t in ipairs(tensor_specs(stepper, c)) do
        want[t.key] = true
        local x = entry[t.key]
        if x == nil then
          add("state of '%s' has no '%s' tensor in the checkpoint", name, t.key)
        elseif fmt_shape(x:size()) ~= fmt_shape(t.shape) or not convertible(x:dtype(), t.dtype) then
          add("state '%s/%s': %s %s in the checkpoint, this optimizer keeps %s %s", name, t.key, x:dtype(),
            fmt_shape(x:size()), t.dtype, fmt_shape(t.shape))
        end
      end
      for k, x in pairs(entry) do
        if T.is_tensor(x) and not want[k] then
          add("state '%s/%s' is in the checkpoint but this optimizer keeps no such state", name, k)
        end
      end
    end
  end
  table.sort(problems)
  return problems
end

-- The hyperparameters a state dict holds for group li, applied: returns the
-- group's new options (validated by its kind, as the constructor does) and
-- notes on saved values that differ from the config's. hyper = "restore":
-- every saved value is taken (torch's load_state_dict). hyper = "config"
-- (an engine): the kind's schema says per option (kind.LOAD): "config"
-- keeps the config's (noted when the file differs), "restore" takes the
-- file's (noted when it differs from expected[k], the config's value at
-- the checkpoint's step expected.step).
local function staged_options(g, saved, li, what, hyper, expected)
  if saved == nil then return nil, {} end
  local kind, current = g.kind, g.options
  local new, notes = {}, {}
  for k, v in pairs(current) do new[k] = v end
  local keys = {}
  for k in pairs(saved) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if not kind.SAVED[k] then
      E.raise(E.EFORMAT, "%s: param group %d: '%s' is not a %s option", what, li, k, kind.name)
    end
    local v = saved[k]
    if hyper == "config" and kind.LOAD[k] == "config" then
      if current[k] == nil or canonical_json(v) ~= canonical_json(current[k]) then
        notes[#notes + 1] = ("%s = %s in the checkpoint, %s in the config"):format(k, canonical_json(v),
          current[k] == nil and "nil" or canonical_json(current[k]))
      end
    else
      new[k] = copy_plain(v)
      local want = hyper == "config" and expected and expected[li] and expected[li][k]
      if want ~= nil and want ~= false and is_plain(want, 0) and canonical_json(v) ~= canonical_json(want) then
        notes[#notes + 1] = ("%s = %s in the checkpoint, %s in the config at step %d (the checkpoint's until the next step)")
          :format(k, canonical_json(v), canonical_json(want), expected.step)
      end
    end
  end
  local ok, err = pcall(K.validate, kind, new)
  if not ok then E.raise(E.EFORMAT, "%s: param group %d: %s", what, li, E.message(err)) end
  return new, notes
end

-- A loaded state tensor t as the group keeps it (converted to its dtype),
-- checked: finite (a float32 value above
-- bfloat16's range becomes Inf), and not below the kind's invariant
-- spec.min. Raises EFORMAT naming the tensor (name) and where it came from
-- (what: the file).
local function check_loaded(t, spec, name, from, what)
  if not t:all_finite() then
    E.raise(E.EFORMAT, "%s: state tensor '%s' holds NaN or Inf%s; nothing was changed", what, name,
      from ~= t:dtype() and (" once converted from %s to %s (the group's state_dtype)"):format(from, t:dtype()) or "")
  end
  if spec.min ~= nil and t:numel() > 0 then
    local x = t:dtype() == "bfloat16" and t:clone("float32") or t:contiguous()
    local below = x:lt(spec.min)
    if below:amax() > 0 then
      local i = below:argmax()
      E.raise(E.EFORMAT, "%s: state tensor '%s' holds %.9g (element %d), below %g, which %s's %s never is (the "
        .. "file is corrupted or was edited); nothing was changed", what, name, x:view({ x:numel() }):get(i), i,
        spec.min, spec.class, spec.key)
    end
  end
end

-- Check d against the stepper and copy this rank's part of it (raises,
-- changing nothing). Returns what commit() installs. hyper: "restore" (the
-- group hyperparameters d holds replace the current ones, as torch's
-- load_state_dict) or "config" (see staged_options). fetch(p, t, v) (a
-- sharded checkpoint's, muon.checkpoint_sharded): this rank's box of state
-- tensor t (a tensor_specs entry) of parameter p as the group keeps it,
-- read from the files (v is then a stand-in of the full shape and stored
-- dtype), checked as read.
local function stage(stepper, kind, d, what, hyper, expected, prefix, fetch)
  if type(d) ~= "table" or type(d.groups) ~= "table" or type(d.params) ~= "table" or type(d.state) ~= "table" then
    E.raise(E.EINVAL, "%s must be a table { groups = {...}, params = {...}, state = {...} } as state_dict() returns, got %s",
      what or "state dict", type(d) == "table" and "a table without them" or type(d))
  end
  local problems = S.mismatches(stepper, kind, d)
  if #problems > 0 then
    E.raise(E.EINVAL, "%s does not match this optimizer:\n  %s", what or "state dict", table.concat(problems, "\n  "))
  end
  local groups, params = of_kind(stepper, kind)
  local staged = { groups = {}, params = {}, notes = {}, converted = {} }
  for li, g in ipairs(d.groups) do
    local options, notes = staged_options(groups[li], g.options, li, what or "state dict", hyper or "restore", expected)
    staged.groups[li] = { options = groups[li].options, step = g.step, restore = options }
    for _, n in ipairs(notes) do
      staged.notes[#staged.notes + 1] = ("%s group %d: %s"):format(kind, li, n)
    end
  end
  local W = stepper:size()
  for _, e in ipairs(params) do
    local p = e.p
    local entry = d.state[p.name]
    local one = { p = p, count = 0 }
    if entry then
      one.count = entry.step or 1
      local r = W > 1 and holders(stepper, p) or nil
      if W == 1 or r.holds then
        one.state = {}
        for _, t in ipairs(tensor_specs(stepper, e)) do
          local v = entry[t.key]
          t.class = e.kind.class
          local name = (prefix or "") .. p.name .. "/" .. t.key
          if fetch then
            one.state[t.key] = fetch(p, t, v)
            check_loaded(one.state[t.key], t, name, v:dtype(), what or "state dict")
          else
            -- (checked whole, as the group keeps it: the same verdict on every holder)
            local full = v:dtype() == t.dtype and v or v:clone(t.dtype)
            check_loaded(full, t, name, v:dtype(), what or "state dict")
            if W > 1 then one.state[t.key] = D.box_view(full, t.record.mine):clone()
            else one.state[t.key] = full ~= v and full or v:clone() end
          end
          if v:dtype() ~= t.dtype then
            local c = staged.converted[v:dtype() .. " to " .. t.dtype] or 0
            staged.converted[v:dtype() .. " to " .. t.dtype] = c + 1
          end
        end
        if entry.step ~= nil and scalar_keys(e.kind).step then one.state.step = entry.step end
      end
    end
    staged.params[#staged.params + 1] = one
  end
  return staged
end

local function commit(stepper, staged)
  for _, g in ipairs(staged.groups) do
    if g.restore then
      for k, v in pairs(g.restore) do g.options[k] = v end
    end
    g.options.step = g.step
  end
  for _, one in ipairs(staged.params) do stepper:install(one.p, one.state, one.count) end
end

-- Replace the kind's state by d (tensors are copied) after checking everything.
local S_load_state_dict_body
function S.load_state_dict(stepper, kind, d, what)
  return stepper:exclusive("load_state_dict", S_load_state_dict_body, stepper, kind, d, what)
end

function S_load_state_dict_body(stepper, kind, d, what)
  stepper:build_once()
  local ok, staged = pcall(stage, stepper, kind, d, what, "restore")
  stepper:agree_failure(not ok and staged or nil)
  commit(stepper, staged)
end

----------------------------------------------------------------- files

-- Flatten state dicts into safetensors entries + metadata. dicts is a list
-- of { prefix = "muon/", dict = state_dict }.
function S.encode(dicts, extra_meta)
  local entries, meta = {}, {}
  local header = {}
  for _, item in ipairs(dicts) do
    local d, prefix = item.dict, item.prefix
    local scalars = {}
    for _, e in ipairs(d.params) do
      local entry = d.state[e.name]
      if entry then
        -- the kind's tensors, then the hook state's, each sorted by key
        -- (the kinds' state keys are in that order)
        local own, hooks = {}, {}
        for k, v in pairs(entry) do
          if type(k) == "string" and T.is_tensor(v) then
            local list = k:match("^hook%.") and hooks or own
            list[#list + 1] = k
          end
        end
        table.sort(own)
        table.sort(hooks)
        for _, list in ipairs({ own, hooks }) do
          for _, k in ipairs(list) do entries[#entries + 1] = { name = prefix .. e.name .. "/" .. k, tensor = entry[k] } end
        end
        for k, v in pairs(entry) do
          if type(v) == "number" then
            scalars[e.name] = scalars[e.name] or {}
            scalars[e.name][k] = v
          end
        end
      end
    end
    header[#header + 1] = { prefix = prefix, kind = d.kind, params = d.params, groups = d.groups, scalars = scalars }
  end
  meta["muon.state"] = canonical_json(header)
  for k, v in pairs(extra_meta or {}) do meta[k] = v end
  meta[META_SUM] = meta_checksum(meta)
  return entries, meta
end

-- Structure and values of a decoded muon.state header: returns a message
-- naming the first thing wrong (the file is untrusted), or nil.
local function is_int(x) return type(x) == "number" and x == math.floor(x) and x >= 0 and x < 2 ^ 53 end
local function is_list(x)
  if type(x) ~= "table" then return false end
  local n = 0
  for _ in pairs(x) do n = n + 1 end
  return n == #x
end
local function repr(v)
  if type(v) == "string" then return ("%q"):format(v) end
  return tostring(v)
end
local KIND_LIST, KNOWN
do
  local quoted = {}
  KNOWN = {}
  for i, e in ipairs(K.KINDS) do
    quoted[i] = "'" .. e.name .. "'"
    KNOWN[e.name] = true
  end
  KIND_LIST = table.concat(quoted, ", ", 1, #quoted - 1) .. " or " .. quoted[#quoted]
end

-- kinds: name -> kind, those of the stepper (an entry of another kind of
-- the list is checked for its structure only: it cannot match).
local function validate_header(header, kinds)
  if not is_list(header) then return "it is not a list" end
  for i, h in ipairs(header) do
    local w = ("entry %d"):format(i)
    if type(h) ~= "table" then return w .. " is not an object" end
    if type(h.prefix) ~= "string" then return w .. ": prefix is not a string" end
    if type(h.kind) ~= "string" or not KNOWN[h.kind] then return w .. ": kind is not " .. KIND_LIST end
    local spec = { scalars = kinds[h.kind] and scalar_keys(kinds[h.kind]) }
    if h.params ~= nil and not is_list(h.params) then return w .. ": params is not a list" end
    if h.groups ~= nil and not is_list(h.groups) then return w .. ": groups is not a list" end
    local ngroups = #(h.groups or {})
    for j, e in ipairs(h.params or {}) do
      local we = ("%s: params[%d]"):format(w, j)
      if type(e) ~= "table" or type(e.name) ~= "string" then return we .. " has no name" end
      if e.dtype ~= "float32" and e.dtype ~= "float64" then return we .. ".dtype = " .. repr(e.dtype) .. " is not float32 or float64" end
      if not is_int(e.group) or e.group < 1 or e.group > ngroups then
        return ("%s.group = %s is not a group index 1..%d"):format(we, repr(e.group), ngroups)
      end
      if not is_list(e.shape) or #e.shape > 8 then return we .. " has no shape" end
      for _, d in ipairs(e.shape) do
        if not is_int(d) then return we .. " has a bad shape" end
      end
    end
    for j, g in ipairs(h.groups or {}) do
      if type(g) ~= "table" or not is_int(g.step) then
        return ("%s: groups[%d].step = %s is not an integer >= 0"):format(w, j, repr(type(g) == "table" and g.step or g))
      end
      -- options: the group's hyperparameters (files since the format kept
      -- them; older files have none and load as before)
      if g.options ~= nil then
        if type(g.options) ~= "table" or (next(g.options) ~= nil and is_list(g.options)) then
          return ("%s: groups[%d].options is not an object"):format(w, j)
        end
        for k, v in pairs(g.options) do
          if type(k) ~= "string" or not is_plain(v, 0) then
            return ("%s: groups[%d].options.%s is not a number, string, boolean or list of them"):format(w, j, tostring(k))
          end
        end
      end
    end
    if h.scalars ~= nil then
      if type(h.scalars) ~= "table" then return w .. ": scalars is not an object" end
      local group_of = {}
      for _, e in ipairs(h.params or {}) do group_of[e.name] = e.group end
      for name, sc in pairs(h.scalars) do
        if type(name) ~= "string" or type(sc) ~= "table" then return w .. ": scalars is malformed" end
        if group_of[name] == nil then return ("%s: scalars of '%s', which is not in params"):format(w, tostring(name)) end
        for k, v in pairs(sc) do
          local wk = ("%s: scalars['%s'].%s"):format(w, name, tostring(k))
          if type(k) ~= "string" or (spec.scalars and not spec.scalars[k]) then
            return wk .. " is not a " .. h.kind .. " state value"
          end
          local gstep = h.groups[group_of[name]].step
          if not is_int(v) or v < 1 or v > gstep then
            return ("%s = %s is not an integer in 1..%d (its group's step)"):format(wk, repr(v), gstep)
          end
        end
      end
    end
  end
end

local function format_error(msg) E.raise(E.EFORMAT, msg) end

-- Inverse of encode: list of { prefix, dict } from a loaded file, for the
-- kinds (name -> kind) of a stepper. verify = false: the checksums are
-- neither required nor checked (a file written in Python); the structure
-- and every value still are. file: { metadata, order, tensors, lazy } (lazy:
-- the tensors are stand-ins whose values are checked when read).
function S.decode(file, path, verify, kinds)
  local meta = file.metadata
  if meta["muon.state"] == nil then
    format_error(("'%s' is not a muon optimizer checkpoint (no muon.state metadata)"):format(path))
  end
  if verify ~= false then
    if meta["muon.checksum"] == nil or meta[META_SUM] == nil then
      format_error(("'%s': checkpoint has no checksum (muon.checksum, %s): corrupted or not written by muon "
        .. "(a file written by another program loads with load(path, { checksum = false }))"):format(path, META_SUM))
    end
    local want, got = meta[META_SUM], meta_checksum(meta)
    if want:lower() ~= got then
      format_error(("'%s': metadata checksum mismatch (header says %s, metadata gives %s): the file is corrupted "
        .. "(or edited by another program: load(path, { checksum = false }) skips the checksums)")
        :format(path, want, got))
    end
  end
  local ok, header = pcall(cjson.decode, meta["muon.state"])
  local problem = not ok and "it is not valid JSON" or validate_header(header, kinds)
  if problem then
    format_error(("'%s': muon.state metadata is malformed (%s)"):format(path, problem))
  end
  local out, used = {}, {}
  -- The tensors "<prefix><param>/<key>", per owner ("<prefix><param>").
  local by_owner = {}
  for _, name in ipairs(file.order) do
    local owner, key = name:match("^(.*)/([%a_][%w_%.]*)$")
    if owner then
      by_owner[owner] = by_owner[owner] or {}
      table.insert(by_owner[owner], key)
    end
  end
  for _, h in ipairs(header) do
    local kind = kinds[h.kind]
    local own = {}
    for _, k in ipairs(kind and kind.state_keys or {}) do own[k] = true end
    local d = { kind = h.kind, params = h.params or {}, groups = h.groups or {}, state = {} }
    for _, e in ipairs(d.params) do
      local entry
      for _, k in ipairs(by_owner[h.prefix .. e.name] or {}) do
        -- (a kind the stepper does not have takes any key: it cannot match)
        if own[k] or k:match("^hook%.[%a_][%w_]*$") or not kind then
          local name = h.prefix .. e.name .. "/" .. k
          entry = entry or {}
          entry[k] = file.tensors[name]
          used[name] = true
          if not file.lazy and not entry[k]:all_finite() then -- (lazy: checked as read)
            format_error(("'%s': state tensor '%s' holds NaN or Inf"):format(path, name))
          end
        end
      end
      local sc = h.scalars and h.scalars[e.name]
      if sc then
        entry = entry or {}
        for k, v in pairs(sc) do entry[k] = v end
      end
      if entry and kind then
        -- A state entry is whole: every tensor of its kind, and the step
        -- count where the kind keeps one.
        for _, k in ipairs(kind.state_keys) do
          if entry[k] == nil then
            format_error(("'%s': state of '%s' has no '%s' tensor"):format(path, e.name, k))
          end
        end
        for k in pairs(scalar_keys(kind)) do
          if entry[k] == nil then format_error(("'%s': state of '%s' has no '%s' value"):format(path, e.name, k)) end
        end
      end
      if entry then d.state[e.name] = entry end
    end
    out[#out + 1] = { prefix = h.prefix, dict = d }
  end
  for _, name in ipairs(file.order) do
    if not used[name] then
      format_error(("'%s': tensor '%s' does not belong to any parameter in the checkpoint's metadata"):format(path, name))
    end
  end
  return out
end

-- Save the state of the kinds in parts (list of { prefix, kind }) to path,
-- with extra metadata. Collective on a mesh (rank 0 writes the file).
-- pre_err: an error the caller met checking its arguments (raised on every
-- rank of a mesh: Stepper:gate).
local S_save_body
function S.save(stepper, path, parts, extra_meta, pre_err)
  return stepper:exclusive("save", S_save_body, stepper, path, parts, extra_meta, pre_err)
end

function S_save_body(stepper, path, parts, extra_meta, pre_err)
  stepper:gate("save", pre_err)
  local dicts = {}
  for _, part in ipairs(parts) do dicts[#dicts + 1] = { prefix = part.prefix, dict = S.state_dict(stepper, part.kind) } end
  local err
  if stepper:rank() == 0 then
    local ok, e = pcall(function()
      local entries, meta = S.encode(dicts, extra_meta)
      -- a file whose load would refuse it is not written
      local tensors = {}
      for i, en in ipairs(entries) do tensors[i] = en.tensor end
      local bad = foreach.first_nonfinite(tensors)
      if bad then
        E.raise(E.ENONFINITE, "save '%s': state tensor '%s' holds NaN or Inf (a load would refuse the file); "
          .. "nothing was written", path, entries[bad].name)
      end
      st.save(path, entries, meta)
    end)
    if not ok then err = e end
  end
  stepper:agree_failure(err)
end

-- The options of a checkpoint load (see muon.safetensors.load_options).
S.load_options = st.load_options

-- Load a checkpoint saved by S.save for the kinds in parts (each
-- { prefix, kind, hyper = "restore" | "config", expected = the config's values at the
-- checkpoint's step per group of the kind, see stage }): validates
-- everything first (check(meta) may reject the extra metadata, raising),
-- changes nothing on any error (on every rank of a mesh). opts: see
-- S.load_options; pre_err: as for S.save. reader(path, verify, kinds,
-- stepper) (muon.checkpoint_sharded.reader): nil for a file, else the
-- checkpoint path names as { dicts, meta, fetch, close }. Returns the
-- checkpoint's metadata.
local S_load_body
function S.load(stepper, path, parts, check, opts, pre_err, reader)
  return stepper:exclusive("load", S_load_body, stepper, path, parts, check, opts, pre_err, reader)
end

function S_load_body(stepper, path, parts, check, opts, pre_err, reader)
  -- (the options are the call's arguments: agreed at the gate)
  local okv, verify, dtype = pcall(S.load_options, opts)
  stepper:gate("load", pre_err or (not okv and verify or nil),
    okv and { { "checksum", tostring(verify) }, { "dtype", tostring(dtype) } } or nil)
  stepper:build_once() -- (collective on a mesh: before anything that can fail)
  local staged, meta, opened = {}, nil, nil
  local ok, err = pcall(function()
    opened = reader and reader(path, verify, kinds_of(stepper), stepper)
    local dicts
    if opened then
      dicts, meta = opened.dicts, opened.meta
    else
      local file = st.load(path, { checksum = verify })
      meta = file.metadata
      dicts = S.decode(file, path, verify, kinds_of(stepper))
    end
    local by_prefix, problems = {}, {}
    for _, it in ipairs(dicts) do by_prefix[it.prefix] = it end
    local wanted = {}
    for _, part in ipairs(parts) do
      wanted[part.prefix] = true
      local it = by_prefix[part.prefix]
      if not it then
        problems[#problems + 1] = part.prefix ~= "" and ("the checkpoint has no %s state"):format(part.kind)
          or ("the checkpoint holds %d optimizer states, expected 1"):format(#dicts)
      else
        local ps = S.mismatches(stepper, part.kind, it.dict)
        for _, m in ipairs(ps) do problems[#problems + 1] = m end
      end
    end
    for _, it in ipairs(dicts) do
      if not wanted[it.prefix] then
        problems[#problems + 1] = ("the checkpoint has %s state but this config has no %s group"):format(it.dict.kind, it.dict.kind)
      end
    end
    if #problems > 0 then
      E.raise(E.EINVAL, "checkpoint '%s' does not match:\n  %s", path, table.concat(problems, "\n  "))
    end
    if check then check(meta) end
    for _, part in ipairs(parts) do
      staged[#staged + 1] = stage(stepper, part.kind, by_prefix[part.prefix].dict, "checkpoint '" .. path .. "'", part.hyper,
        part.expected, part.prefix, opened and opened.fetch)
    end
  end)
  if opened then opened.close() end
  -- A rank that failed above (its file missing, malformed, not matching)
  -- fails every rank with its own error (the lowest failing rank's).
  stepper:agree_failure(not ok and err or nil)
  if stepper:size() > 1 then
    -- Every rank must load the same file: its step and checksums agree
    -- (one all-reduce when they do; the message is the same on every rank).
    local msg = stepper:agree_entries({
      { "step", tostring(meta["muon.engine.step"] or "(none)") },
      { "data checksum", tostring(meta["muon.checksum"] or "(none)") },
      { "metadata checksum", tostring(meta_checksum(meta)) },
    }, ("checkpoints loaded from '%s'"):format(path))
    if msg then E.raise(E.EINVAL, "%s: every rank must load the same file; nothing was changed", msg) end
  end
  local converted = {}
  for _, s in ipairs(staged) do
    commit(stepper, s)
    if #s.notes > 0 and stepper:rank() == 0 then
      io.stderr:write(("muon: checkpoint '%s': the config's values are kept:\n  %s\n")
        :format(path, table.concat(s.notes, "\n  ")))
    end
    for what, n in pairs(s.converted) do converted[what] = (converted[what] or 0) + n end
  end
  local conv = {}
  for what, n in pairs(converted) do conv[#conv + 1] = ("%d from %s"):format(n, what) end
  if #conv > 0 and stepper:rank() == 0 then -- one note for the whole load
    table.sort(conv)
    io.stderr:write(("muon: checkpoint '%s': state tensors converted to the groups' state_dtype: %s\n")
      :format(path, table.concat(conv, ", ")))
  end
  return meta
end

-- What the sharded checkpoints (muon.checkpoint_sharded) share with this
-- format: the lists of a stepper's state, the group hyperparameters, the
-- header's validation.
S.kinds_of, S.of_kind, S.tensor_specs, S.group_options = kinds_of, of_kind, tensor_specs, group_options
S.is_int, S.is_list = is_int, is_list

return S
