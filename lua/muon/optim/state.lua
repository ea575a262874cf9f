-- Optimizer state: state_dict / load_state_dict, and safetensors checkpoints.
-- Tensors are named "<prefix><param name>/<state key>"; the parameter list
-- (names, shapes, dtypes), group steps and per-parameter scalars go in the
-- metadata as JSON. Loading checks everything first and changes nothing on
-- a mismatch; the error lists every mismatch.
local cjson = require("cjson").new()
local st = require("muon.safetensors")
local P = require("muon.param")

local S = {}

-- Tensor state keys of each optimizer kind (everything else is a scalar).
local TENSOR_KEYS = { "momentum_buffer", "exp_avg", "exp_avg_sq" }

local function kind_of(opt)
  return opt.DEFAULTS.matched_adamw_rms ~= nil and "muon" or "adamw"
end

-- A plain description of opt's state: tensors (shared, not copied),
-- per-parameter scalars, group steps, and the parameter list.
function S.state_dict(opt)
  local d = { kind = kind_of(opt), params = {}, state = {}, groups = {} }
  for gi, g in ipairs(opt.param_groups) do
    d.groups[gi] = { step = g.step }
    for _, p in ipairs(g.params) do
      d.params[#d.params + 1] = { name = p.name, shape = p.value:size(), dtype = p.value:dtype(), group = gi }
      local s = opt.state[p]
      if s then
        local entry = {}
        for k, v in pairs(s) do entry[k] = v end
        d.state[p.name] = entry
      end
    end
  end
  return d
end

local function fmt_shape(s) return "(" .. table.concat(s, ", ") .. ")" end

-- Every difference between a state dict and opt's parameters.
local function mismatches(opt, d)
  local problems = {}
  local function add(...) problems[#problems + 1] = string.format(...) end
  if d.kind ~= kind_of(opt) then add("optimizer kind: checkpoint has %s, this optimizer is %s", tostring(d.kind), kind_of(opt)) end
  if #d.groups ~= #opt.param_groups then
    add("param groups: checkpoint has %d, this optimizer has %d", #d.groups, #opt.param_groups)
  end
  local current = {}
  for gi, g in ipairs(opt.param_groups) do
    for _, p in ipairs(g.params) do current[p.name] = { p = p, group = gi } end
  end
  local seen = {}
  for _, e in ipairs(d.params or {}) do
    seen[e.name] = true
    local c = current[e.name]
    if not c then
      add("parameter '%s' is in the checkpoint but not in this optimizer", e.name)
    else
      local shape = c.p.value:size()
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
      for _, k in ipairs(TENSOR_KEYS) do
        local t = entry[k]
        if t ~= nil and (not P.same_shape(t, c.p.value) or t:dtype() ~= c.p.value:dtype()) then
          add("state '%s/%s': %s %s in the checkpoint, parameter is %s %s", name, k, t:dtype(),
            fmt_shape(t:size()), c.p.value:dtype(), fmt_shape(c.p.value:size()))
        end
      end
    end
  end
  table.sort(problems)
  return problems
end
S.mismatches = mismatches

-- Replace opt's state by d (tensors are copied) after checking everything.
function S.load_state_dict(opt, d, what)
  local problems = mismatches(opt, d)
  if #problems > 0 then
    error(("%s does not match this optimizer:\n  %s"):format(what or "state dict", table.concat(problems, "\n  ")), 2)
  end
  local state = {}
  for _, g in ipairs(opt.param_groups) do
    for _, p in ipairs(g.params) do
      local entry = d.state[p.name]
      if entry then
        local s = {}
        for k, v in pairs(entry) do s[k] = type(v) == "cdata" and v:clone() or v end
        state[p] = s
      end
    end
  end
  opt.state = state
  for gi, g in ipairs(d.groups) do opt.param_groups[gi].step = g.step end
end

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
        for _, k in ipairs(TENSOR_KEYS) do
          if entry[k] ~= nil then entries[#entries + 1] = { name = prefix .. e.name .. "/" .. k, tensor = entry[k] } end
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
  meta["muon.state"] = cjson.encode(header)
  for k, v in pairs(extra_meta or {}) do meta[k] = v end
  return entries, meta
end

-- Inverse of encode: list of { prefix, dict } from a loaded file.
function S.decode(file, path)
  local ok, header = pcall(cjson.decode, file.metadata["muon.state"] or "")
  if not ok or type(header) ~= "table" then
    error(("'%s' is not a muon optimizer checkpoint (no valid muon.state metadata)"):format(path), 3)
  end
  local out, used = {}, {}
  for _, h in ipairs(header) do
    local d = { kind = h.kind, params = h.params or {}, groups = h.groups or {}, state = {} }
    for _, e in ipairs(d.params) do
      local entry
      for _, k in ipairs(TENSOR_KEYS) do
        local name = h.prefix .. e.name .. "/" .. k
        local t = file.tensors[name]
        if t ~= nil then
          entry = entry or {}
          entry[k] = t
          used[name] = true
        end
      end
      local sc = h.scalars and h.scalars[e.name]
      if sc then
        entry = entry or {}
        for k, v in pairs(sc) do entry[k] = v end
      end
      if entry then d.state[e.name] = entry end
    end
    out[#out + 1] = { prefix = h.prefix, dict = d }
  end
  for _, name in ipairs(file.order) do
    if not used[name] then
      error(("'%s': tensor '%s' does not belong to any parameter in the checkpoint's metadata"):format(path, name), 3)
    end
  end
  return out
end

function S.save(opt, path)
  local entries, meta = S.encode({ { prefix = "", dict = S.state_dict(opt) } })
  st.save(path, entries, meta)
end

function S.load(opt, path)
  local file = st.load(path)
  local dicts = S.decode(file, path)
  if #dicts ~= 1 then error(("'%s' holds %d optimizer states, expected 1"):format(path, #dicts), 2) end
  S.load_state_dict(opt, dicts[1].dict, "checkpoint '" .. path .. "'")
end

-- Attach state_dict/load_state_dict/save/load methods to an optimizer class.
function S.install(class)
  function class:state_dict() return S.state_dict(self) end
  function class:load_state_dict(d) return S.load_state_dict(self, d) end
  function class:save(path) return S.save(self, path) end
  function class:load(path) return S.load(self, path) end
end

return S
