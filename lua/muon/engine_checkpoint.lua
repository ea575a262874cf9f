-- The engine's checkpoints (Engine:save, Engine:load in lua/muon/engine.lua,
-- whose reference block is their contract): one part per optimizer kind
-- the config uses, the engine's own values (step count, lr_scale) in the
-- metadata and their checks, over muon.checkpoint (one file) and
-- muon.checkpoint_sharded (a directory). `self` is the engine.
local E = require("muon.errors")
local O = require("muon.optim.options")
local kinds = require("muon.optim.kinds")
local S = require("muon.checkpoint")
local SH = require("muon.checkpoint_sharded")

local C = {}

-- The kinds the config uses, as checkpoint parts (prefix per kind, in
-- the kinds' order).
local function parts(self)
  local seen, list = {}, {}
  for _, kind in ipairs(kinds.names()) do
    for _, g in ipairs(self.groups) do
      if g.kind.name == kind and not seen[kind] then
        seen[kind] = true
        list[#list + 1] = { prefix = kind .. "/", kind = kind, hyper = "config" }
      end
    end
  end
  return list
end

-- A bad path fails on every rank of a mesh (the call's gate, muon.step).
local function path_error(fn, path)
  if type(path) ~= "string" then return E.new(E.EINVAL, ("%s: path must be a string, got %s"):format(fn, type(path))) end
  if path == "" then return E.new(E.EINVAL, fn .. ": path is empty") end
end

-- save's options: whether the checkpoint is sharded (or the error).
local function save_options(opts)
  if opts == nil then return false end
  if type(opts) ~= "table" then return false, E.new(E.EINVAL, "save: options must be a table { sharded = true }, got " .. type(opts)) end
  for k in pairs(opts) do
    if k ~= "sharded" then return false, E.new(E.EINVAL, "save: " .. E.unknown("option", tostring(k), { "sharded" })) end
  end
  if opts.sharded ~= nil and type(opts.sharded) ~= "boolean" then
    return false, E.new(E.EINVAL, "save: sharded must be a boolean, got " .. type(opts.sharded))
  end
  return opts.sharded == true
end

-- Engine:save's body (its guards are the engine's).
function C.save(self, path, opts)
  local sharded, oerr = save_options(opts)
  local ok, err = pcall(sharded and SH.save or S.save, self:_stepper(), path, parts(self),
    { ["muon.engine.step"] = tostring(self.step_count), ["muon.engine.lr_scale"] = ("%.17g"):format(self.lr_scale) },
    path_error("save", path) or oerr)
  if not ok then E.reraise(err, E.EIO) end
end

-- A C host's argument error in a collective call (mu_engine_save, _load):
-- on a mesh it fails that call on every rank, not on this one only.
function C.fail_collective(self, op, err)
  if self.dist == nil then error(err, 0) end
  local st = self:_stepper()
  if op == "save" then S.save(st, nil, parts(self), nil, err)
  elseif op == "save_sharded" then SH.save(st, nil, parts(self), nil, err)
  else S.load(st, nil, parts(self), nil, nil, err) end
end

-- The engine's values in a checkpoint's metadata, checked like config values.
local function engine_meta(meta)
  local step_s, scale_s = meta["muon.engine.step"], meta["muon.engine.lr_scale"]
  local step, scale = tonumber(step_s), tonumber(scale_s)
  if step_s == nil or step == nil or step ~= math.floor(step) or step < 0 or step >= 2 ^ 53 then
    E.raise(E.EFORMAT, "checkpoint metadata muon.engine.step = %s is not an integer >= 0", tostring(step_s))
  end
  if scale_s == nil or not O.is_finite(scale) or scale < 0 then
    E.raise(E.EFORMAT, "checkpoint metadata muon.engine.lr_scale = %s is not a finite number >= 0", tostring(scale_s))
  end
  return step, scale
end

-- Engine:load's body (its contract: muon.engine's reference block; its
-- guards are the engine's). What a load restores and what the config
-- keeps is one rule, from the kinds' schemas (kind.LOAD); a schedulable
-- value is compared with what the config gives at the checkpoint's step.
function C.load(self, path, opts)
  local values
  local ps = parts(self)
  local ok, err = pcall(S.load, self:_stepper(), path, ps, function(meta)
    values = { engine_meta(meta) }
    -- the config's values at the checkpoint's step, per kind's groups
    local okv, sched = false, nil
    if values[1] > 0 then okv, sched = pcall(self._scheduled, self, values[1], values[2]) end
    for _, part in ipairs(ps) do
      part.expected = nil
      if okv then
        part.expected = { step = values[1] }
        for _, g in ipairs(self.groups) do
          if g.kind.name == part.kind then part.expected[#part.expected + 1] = sched[g.index] end
        end
      end
    end
  end, opts, path_error("load", path), SH.reader)
  if not ok then E.reraise(err, E.EFORMAT) end
  self.step_count, self.lr_scale = values[1], values[2]
end

return C
