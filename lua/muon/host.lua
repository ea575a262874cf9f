-- Glue between C hosts (src/engine.c: mu_engine_*; src/script.c: mu_script_run*) and the
-- Lua engine. The Lua C API cannot push FFI cdata, so the C side passes raw
-- buffers as light userdata plus a shape table; this module wraps them as
-- tensors. Errors are raised as error objects (lua/muon/errors.lua) whose
-- code is the status the C call returns; a plain string error gets the
-- call's fallback code (src/engine.c).
local E = require("muon.errors")

local host = {}

-- A trainer's parameter dtype by code: float32 or float64 (names from C's
-- dtype table); nil for any other.
local function param_dtype(code)
  local T = require("muon.tensor")
  local name = T.DTYPE_NAMES[tonumber(code)]
  return (name == "float32" or name == "float64") and name or nil
end

local raise = E.raise

-- Open an engine on a config file. config.load (lua/muon/config.lua) reads
-- it: a file that cannot be read (missing, a directory, a FIFO) is EIO, a
-- syntax error (compiled, not run) or a precompiled chunk is EFORMAT;
-- whatever the engine rejects (unknown option, bad value) comes back as
-- EINVAL, or with the code of its error object.
-- opts.source (mu_engine_open_source): the config's text, path its name.
function host.open(path, opts)
  local engine = require("muon.engine")
  if next(opts) == nil then opts = nil end
  return engine.new(path, opts)
end

-- Tensors wrapping the trainer's buffers, kept alive by the engine object
-- (the engine holds the tensors it is given; the buffers belong to C).
function host.add_param(eng, name, dtype_code, shape, data, grad)
  local T = require("muon.tensor")
  local dtype = param_dtype(dtype_code)
  if not dtype then raise(E.EDTYPE, "parameter '" .. name .. "': unsupported dtype " .. tostring(dtype_code)) end
  local value = T.wrap(data, shape, dtype)
  local g = nil
  if grad ~= nil then g = T.wrap(grad, shape, dtype) end
  eng:add_param(name, value, g)
end

-- mu_engine_set_comm: a caller's MPI communicator for a distributed config.
function host.set_comm(eng, ptr)
  if not eng.dist then raise(E.ESTATE, "set_comm: the config has no dist section") end
  eng:set_comm(require("muon.comm").from_handle(ptr))
end

-- mu_engine_add_param_sharded: placements = { {kind, dim0}, ... } per mesh
-- axis; the buffers hold this rank's shard (data may be NULL when the shard
-- is empty; grad NULL means no gradient, on every rank alike).
function host.add_param_sharded(eng, name, dtype_code, shape, placements, data, grad)
  local T = require("muon.tensor")
  local dtype = param_dtype(dtype_code)
  if not dtype then raise(E.EDTYPE, "parameter '" .. name .. "': unsupported dtype " .. tostring(dtype_code)) end
  if not eng.dist then raise(E.ESTATE, "add_param_sharded: parameter '" .. name .. "': the config has no dist section") end
  local pl = { shape = shape }
  for i, p in ipairs(placements) do
    if p[1] == 0 then pl[i] = "R"
    elseif p[1] == 1 then
      if p[2] < 0 or p[2] >= #shape then
        raise(E.EINVAL, ("parameter '%s': placements[%d] shards dim %d (0-based) of a %d-D tensor"):format(name, i - 1, p[2], #shape))
      end
      pl[i] = { "shard", p[2] + 1 }
    else raise(E.EINVAL, ("parameter '%s': placements[%d].kind %d is not MU_REPLICATE or MU_SHARD"):format(name, i - 1, p[1])) end
  end
  local local_shape = eng:local_shape_of(name, shape, pl)
  local n = 1
  for _, x in ipairs(local_shape) do n = n * x end
  local function wrap(ptr, what)
    if ptr == nil then
      if n > 0 then raise(E.EINVAL, ("parameter '%s': %s is NULL but the local shard has %d elements"):format(name, what, n)) end
      return T.zeros(local_shape, dtype)
    end
    return T.wrap(ptr, local_shape, dtype)
  end
  local value = wrap(data, "local_data")
  local g = nil
  if grad ~= nil then g = wrap(grad, "local_grad") end
  eng:add_param(name, value, g, pl)
end

-- mu_engine_set_grads: list = { {name, light userdata or false}, ... };
-- each buffer holds its parameter's local shape in its dtype (an empty
-- local shard's is not read: an empty tensor stands for it).
function host.set_grads(eng, list)
  local T = require("muon.tensor")
  local changes = {}
  for i, e in ipairs(list) do
    local name, ptr = e[1], e[2]
    local p = eng:param(name)
    if not p then raise(E.EINVAL, "set_grads: no parameter '" .. tostring(name) .. "'") end
    local g = nil
    if ptr then
      g = p.value:numel() == 0 and T.zeros(p.value:size(), p.value:dtype()) or T.wrap(ptr, p.value:size(), p.value:dtype())
    end
    changes[i] = { name, g }
  end
  eng:set_grads(changes)
end

-- mu_engine_query: "groups" as JSON text (Engine:param_groups()).
function host.query(eng, what)
  if what ~= "groups" then raise(E.EINVAL, "query: unknown key '" .. tostring(what) .. "' (known: groups)") end
  return require("muon.checkpoint").canonical_json(eng:param_groups())
end

function host.step(eng) eng:step() end

-- mu_engine_reduce_grads: op "mean" (MU_REDUCE_MEAN) or "sum" (MU_REDUCE_SUM).
function host.reduce_grads(eng, op) eng:reduce_grads({ op = op }) end

-- mu_engine_set_signal: values is a Lua list of the n doubles.
function host.set_signal(eng, name, values) eng:set_signal(name, values) end

function host.set(eng, key, value) eng:set(key, value) end

function host.get(eng, key)
  local v = eng:get(key)
  if type(v) ~= "number" then
    raise(E.EINVAL, "key '" .. tostring(key) .. "' has no numeric value (got " .. type(v) .. ")")
  end
  return v
end

function host.zero_grad(eng) eng:zero_grad() end
function host.clip_grad_norm(eng, max_norm) return eng:clip_grad_norm(max_norm) end
function host.set_lr(eng, group, lr) eng:set_lr(group, lr) end

function host.save(eng, path, sharded) eng:save(path, sharded and { sharded = true } or nil) end

-- A C-side argument error of mu_engine_save / mu_engine_load (op "save",
-- "save_sharded" or "load"; code and message): raised on every rank of a
-- distributed engine.
function host.fail_collective(eng, op, code, msg) eng:_fail_collective(op, E.new(code, msg)) end

-- The fixes a message names, as a C host spells them: what the Lua side
-- writes (the Lua call) -> the C call. host.load's errors go through it.
host.C_FIXES = {
  { "load(path, { checksum = false })", "mu_engine_load_ex(eng, path, MU_LOAD_NO_CHECKSUM)" },
}

-- err (an error object or a string) with its fixes spelled for C (code
-- and traceback kept).
function host.c_spelling(err)
  local msg = E.message(err)
  for _, f in ipairs(host.C_FIXES) do
    local i, j = msg:find(f[1], 1, true)
    while i do
      msg = msg:sub(1, i - 1) .. f[2] .. msg:sub(j + 1)
      i, j = msg:find(f[1], i + #f[2], true)
    end
  end
  if msg == E.message(err) then return err end
  return E.is(err) and E.new(err.code, msg, rawget(err, "tb")) or msg
end

function host.load(eng, path, no_checksum)
  local ok, err = pcall(eng.load, eng, path, no_checksum and { checksum = false } or nil)
  if not ok then error(host.c_spelling(err), 0) end
end

-- The exit status for what a script (or a module's function) returns, read
-- the way LuaJIT's os.exit reads its argument: nothing, nil or true 0,
-- false 1, an integer 0..255 itself, a string holding one as that number.
-- A value os.exit would refuse (another string, a table, ...) or silently
-- truncate (256 would exit 0, -1 255, 3.5 3, NaN and inf 0) is an error
-- naming it instead, so that no failure reads as success. (The standalone
-- interpreters ignore a script's return value; `muon run` gives it a use.)
local function exit_status(v, who)
  if v == nil or v == true then return 0 end
  if v == false then return 1 end
  local n = v
  if type(v) == "string" then n = tonumber(v) end
  if type(n) == "number" and n == math.floor(n) and n >= 0 and n <= 255 then return n end
  local shown = type(v) == "string" and ("'" .. v .. "'") or type(v) == "number" and tostring(v) or ("a " .. type(v))
  error(E.new(E.EINVAL, ("%s returned %s: an exit status is nothing, true, false or an integer 0..255")
    :format(who, shown), ""), 0)
end

-- `muon run script.lua args...`: arg = { [0] = script, args... } as in the
-- standalone interpreter; the chunk also gets the args as `...`. What it
-- returns is the exit status (exit_status).
-- trusted: engines opened by the script default to trusted configs.
local function trust_configs()
  local engine = require("muon.engine")
  local new = engine.new
  engine.new = function(cfg, opts)
    local o = {}
    for k, v in pairs(opts or {}) do o[k] = v end
    if o.trusted == nil then o.trusted = true end
    return new(cfg, o)
  end
end

function host.run_script(path, args, trusted)
  if trusted then trust_configs() end
  -- source text only; a script that cannot be read or compiled is a
  -- one-line error (an empty traceback: src/script.c prints none)
  local config = require("muon.config")
  local okc, chunk = pcall(function() return config.compile(config.read_file(path, "script"), path, nil, "script") end)
  if not okc then error(E.new(E.code(chunk) or E.ELUA, E.message(chunk), ""), 0) end
  local a = { [0] = path }
  for i = 1, #args do a[i] = args[i] end
  rawset(_G, "arg", a)
  return exit_status((chunk(unpack(args))), path)
end

-- "module" calls require(module).main(args); "module:fn" calls .fn(args).
function host.run_module(target, args, trusted)
  if trusted then trust_configs() end
  local mod, fn = target:match("^([^:]+):([%w_]+)$")
  if not mod then mod, fn = target, "main" end
  local m = require(mod)
  if type(m) ~= "table" or type(m[fn]) ~= "function" then
    raise(E.EINVAL, "module '%s' has no function '%s'", mod, fn)
  end
  return exit_status((m[fn](args)), mod .. "." .. fn)
end

-- `muon info`: version, library, BLAS core and threads, MPI.
function host.info(args)
  if #args > 0 then
    io.stderr:write("muon info: unexpected argument '" .. args[1] .. "'\n")
    return 2
  end
  local muon = require("muon")
  local core = require("muon.core")
  local C = core.C
  local b = muon.blas_info()
  local lines = {}
  local function add(k, v) lines[#lines + 1] = ("%-18s %s"):format(k, v) end
  add("version", muon._VERSION)
  add("library", core.path)
  add("lua modules", (package.searchpath("muon", package.path) or "?"):gsub("/muon/init%.lua$", ""))
  add("luajit", jit and jit.version or _VERSION)
  add("blas core", b.core .. (b.expected and (" (cpu supports " .. b.expected .. ")") or ""))
  add("blas threads", tostring(b.threads))
  add("blas config", b.config)
  add("OPENBLAS_CORETYPE", os.getenv("OPENBLAS_CORETYPE") or "(unset)")
  add("bf16 products", b.bf16)
  local have_mpi = false
  pcall(function() have_mpi = C.mu_comm_have_mpi() ~= 0 end)
  local size = 1
  pcall(function() size = C.mu_comm_world_size() end)
  add("mpi", have_mpi and ("Open MPI (world size " .. tostring(size) .. ")") or "not built (single-process backend)")
  io.write(table.concat(lines, "\n"), "\n")
  return 0
end

return host
