-- Optimizer state: state_dict / load_state_dict, and safetensors checkpoints.
-- Tensors are named "<prefix><param name>/<state key>"; the parameter list
-- (names, shapes, dtypes), group steps and per-parameter scalars go in the
-- metadata as JSON. Loading checks everything first and changes nothing on
-- a mismatch; the error lists every mismatch.
local ffi = require("ffi")
local bit = require("bit")
local core = require("muon.core")
local C = core.C
local cjson = require("cjson").new()
cjson.decode_invalid_numbers(false)
cjson.decode_max_depth(16)
local st = require("muon.safetensors")
local P = require("muon.param")

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
  meta["muon.state"] = canonical_json(header)
  for k, v in pairs(extra_meta or {}) do meta[k] = v end
  meta[META_SUM] = meta_checksum(meta)
  return entries, meta
end

-- Structure of a decoded muon.state header: raises a message naming the
-- first thing wrong (the file is untrusted).
local function is_int(x) return type(x) == "number" and x == math.floor(x) and x >= 0 and x < 2 ^ 53 end
local function is_list(x)
  if type(x) ~= "table" then return false end
  local n = 0
  for _ in pairs(x) do n = n + 1 end
  return n == #x
end
local function validate_header(header)
  if not is_list(header) then return "it is not a list" end
  for i, h in ipairs(header) do
    local w = ("entry %d"):format(i)
    if type(h) ~= "table" then return w .. " is not an object" end
    if type(h.prefix) ~= "string" then return w .. ": prefix is not a string" end
    if h.kind ~= "muon" and h.kind ~= "adamw" then return w .. ": kind is not 'muon' or 'adamw'" end
    if h.params ~= nil and not is_list(h.params) then return w .. ": params is not a list" end
    if h.groups ~= nil and not is_list(h.groups) then return w .. ": groups is not a list" end
    for j, e in ipairs(h.params or {}) do
      local we = ("%s: params[%d]"):format(w, j)
      if type(e) ~= "table" or type(e.name) ~= "string" then return we .. " has no name" end
      if type(e.dtype) ~= "string" then return we .. " has no dtype" end
      if not is_int(e.group) then return we .. " has no group index" end
      if not is_list(e.shape) or #e.shape > 8 then return we .. " has no shape" end
      for _, d in ipairs(e.shape) do
        if not is_int(d) then return we .. " has a bad shape" end
      end
    end
    for j, g in ipairs(h.groups or {}) do
      if type(g) ~= "table" or not is_int(g.step) then return ("%s: groups[%d] has no step"):format(w, j) end
    end
    if h.scalars ~= nil then
      if type(h.scalars) ~= "table" then return w .. ": scalars is not an object" end
      for name, sc in pairs(h.scalars) do
        if type(name) ~= "string" or type(sc) ~= "table" then return w .. ": scalars is malformed" end
        for k, v in pairs(sc) do
          if type(k) ~= "string" or type(v) ~= "number" then return w .. ": scalars is malformed" end
        end
      end
    end
  end
end

-- Inverse of encode: list of { prefix, dict } from a loaded file.
function S.decode(file, path)
  local meta = file.metadata
  if meta["muon.state"] == nil then
    error(("'%s' is not a muon optimizer checkpoint (no muon.state metadata)"):format(path), 3)
  end
  if meta["muon.checksum"] == nil or meta[META_SUM] == nil then
    error(("'%s': checkpoint has no checksum (muon.checksum, %s): corrupted or not written by muon")
      :format(path, META_SUM), 3)
  end
  local want, got = meta[META_SUM], meta_checksum(meta)
  if want:lower() ~= got then
    error(("'%s': metadata checksum mismatch (header says %s, metadata gives %s): the file is corrupted")
      :format(path, want, got), 3)
  end
  local ok, header = pcall(cjson.decode, meta["muon.state"])
  local problem = not ok and "it is not valid JSON" or validate_header(header)
  if problem then
    error(("'%s': muon.state metadata is malformed (%s)"):format(path, problem), 3)
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
