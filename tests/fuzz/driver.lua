-- Fuzz targets driven by tests/fuzz/fuzz_lua.c (libFuzzer) and replayed by
-- tests/fuzz_spec.lua: each takes the path of a file holding one input and
-- raises only when the outcome is a bug -- an error that is not a clean
-- validation message naming the file, a load that succeeds on bytes it
-- should reject, or a failed load that changed the engine's state.
local T = require("muon.tensor")
local st = require("muon.safetensors")
local engine = require("muon.engine")
local E = require("muon.errors")

local D = {}

local MARK = "MUON-FUZZ-BUG: "
local function bug(fmt, ...) error(MARK .. fmt:format(...), 0) end

local function clean_error(err, path, what)
  -- muon raises error objects carrying a status code (muon.errors)
  if E.is(err) then
    if E.name(err.code) == nil then bug("%s raised an error object with an unknown code %s", what, tostring(err.code)) end
    err = tostring(err)
  end
  if type(err) ~= "string" then bug("%s raised a %s, not a message", what, type(err)) end
  if not err:find(path, 1, true) then bug("%s error does not name the file: %s", what, err) end
  -- a Lua runtime error inside muon's own modules (not a validation message,
  -- not an error in the config's own code)
  local internal = false
  for _, sig in ipairs({ "attempt to ", "bad argument #", "table index is ", "stack overflow",
                         "invalid value %(at index", "invalid order function" }) do
    if err:find("lua/muon/[%w_/]+%.lua:%d+: " .. sig) then internal = true end
  end
  if internal then
    bug("%s raised an internal error: %s", what, err)
  end
end

-- A small engine (Muon + AdamW) whose checkpoints make the seed corpus.
local CONFIG = {
  groups = {
    { name = "m", optimizer = "muon", min_dim = 2, lr = 0.02, weight_decay = 0.01 },
    { name = "a", optimizer = "adamw", lr = 1e-3 },
  },
}
function D.make_engine()
  local eng = engine.new(CONFIG)
  local ps = {}
  for i, spec in ipairs({ { "w", { 4, 3 } }, { "b", { 3 } }, { "c", { 2, 1, 3 } } }) do
    local w, g = T.randn(spec[2], i), T.randn(spec[2], 10 + i)
    eng:add_param(spec[1], w, g)
    ps[#ps + 1] = w
  end
  return eng, ps
end

-- The engine's state as a string (no file I/O: fast): step counter, lr
-- scale, optimizer state, and (unless state_only) the parameter values.
function D.snapshot(eng, state_only)
  local parts = { tostring(eng.step_count), ("%a"):format(eng.lr_scale) }
  local function flat(t)
    local f = t:flat()
    for i = 1, #f do f[i] = ("%a"):format(f[i]) end
    return table.concat(f, ",")
  end
  for _, e in ipairs(state_only and {} or eng.params) do parts[#parts + 1] = e.param.name .. "=" .. flat(e.param.value) end
  for gi, g in ipairs(eng.groups) do
    parts[#parts + 1] = g.kind.name .. gi .. ":" .. tostring(g.options.step)
    for _, p in ipairs(g.options.params) do
      local s = eng:state(p.name)
      if s then
        local keys = {}
        for k in pairs(s) do keys[#keys + 1] = k end
        table.sort(keys)
        for _, k in ipairs(keys) do
          local v = s[k]
          if T.is_tensor(v) then v = flat(v) end
          parts[#parts + 1] = p.name .. "/" .. k .. "=" .. tostring(v)
        end
      end
    end
  end
  return table.concat(parts, ";")
end

local eng
function D.safetensors(path)
  -- the reader alone
  local ok, res = pcall(st.load, path)
  if not ok then
    clean_error(res, path, "safetensors.load")
  else
    local info = st.inspect(path)
    if #info.order ~= #res.order then bug("inspect and load disagree on %s", path) end
    for _, name in ipairs(res.order) do
      if not T.is_tensor(res.tensors[name]) then bug("tensor '%s' missing after load", name) end
    end
  end
  -- the engine's checkpoint loader: fails cleanly and changes nothing
  if not eng then
    eng = D.make_engine()
    eng:step()
  end
  local before = D.snapshot(eng)
  local okl, err = pcall(eng.load, eng, path)
  if not okl then
    clean_error(err, path, "engine:load")
    if D.snapshot(eng) ~= before then bug("a failed engine:load changed the engine's state") end
  else
    eng = nil -- loaded something else: start from the reference engine next time
  end
end

function D.config(path)
  local ok, e = pcall(engine.new, path)
  if not ok then
    clean_error(e, path, "engine.new")
    return
  end
  local shapes = { { "w", { 4, 3 } }, { "b", { 3 } }, { "layers.0.attn.wq", { 6, 4 } }, { "c", { 2, 1, 3 } } }
  for i, s in ipairs(shapes) do
    pcall(e.add_param, e, s[1], T.randn(s[2], i), T.randn(s[2], 10 + i))
  end
  for _ = 1, 2 do
    local oks, err = pcall(e.step, e)
    if not oks and tostring(err):find(MARK, 1, true) then error(err, 0) end
  end
end

return D
