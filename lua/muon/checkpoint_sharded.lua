-- Sharded checkpoints: a directory where each state holder wrote its own
-- boxes, nothing gathered, loadable on any world size and mesh.
--[[ reference muon.checkpoint_sharded
    A sharded checkpoint is a directory: one safetensors file per rank of
    the saving mesh, "rank-RRRRR-of-WWWWW.<tag>.safetensors" (tag: the
    step and a random id of that save), holding the boxes of the state
    tensors that rank holds, each under its tensor's name
    ("<kind>/<param>/<key>") with the box's shape; and index.json, written
    by rank 0 last: { format = "muon.sharded", version = 1, world, mesh
    ({name, size} per axis), metadata (what a single-file checkpoint's
    header holds: muon.state, the engine's values, their checksum), files
    ({ name, checksum (XXH64 of its data section), bytes } per rank),
    tensors (name -> { dtype, shape (global), boxes = { {file, start
    (0-based), len} } }), checksum (XXH64 of the rest, canonical JSON) }.
muon.checkpoint_sharded.save(stepper, dir, parts, extra_meta, pre_err)
    Collective. Makes dir (one level) if needed; each rank writes its file
    from its live state (the bytes it allocates: none but file buffers);
    then rank 0 writes index.json atomically and removes the files of
    earlier saves. A failure on any rank (a NaN/Inf state tensor, a file
    that cannot be written) fails every rank, each removing the file it
    wrote: the previous checkpoint in dir stays whole.
muon.checkpoint_sharded.reader(path, verify, kinds, stepper)
    For muon.checkpoint.load: nil when path is not a directory; else the
    checkpoint as { dicts, meta, fetch, close }: the index validated (and
    its checksum when verify), rank 0 refuses a file named like a shard
    that the index does not list; fetch reads this rank's box of a state
    tensor from the files whose boxes meet it, each file's header checked
    against the index and its data against the index's checksum (when
    verify) before its first read. Errors name the file.
muon.checkpoint_sharded.is_dir(path)
    Whether path names a directory that can be listed.
]]
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
local S = require("muon.checkpoint")
local foreach = require("muon.foreach")

local SH = {}

local INDEX = "index.json"
local FORMAT, VERSION = "muon.sharded", 1
local SHARD_NAME = "^rank%-%d+%-of%-%d+%.[%w%-]+%.safetensors$"

local function join(dir, name) return (dir:gsub("/+$", "")) .. "/" .. name end
local function file_name(rank, world, tag) return ("rank-%05d-of-%05d.%s.safetensors"):format(rank, world, tag) end

-- The names in a directory, or nil and the reason.
local function list_dir(path)
  local len = ffi.new("size_t[1]")
  local cap = 0
  for _ = 1, 8 do -- (the directory may grow between the calls)
    local buf = cap > 0 and ffi.new("char[?]", cap) or nil
    if C.mu_dir_list(path, buf, cap, len) ~= 0 then return nil, ffi.string(C.mu_last_error()) end
    local n = tonumber(len[0])
    if n <= cap then
      local names, pos = {}, 0
      while pos < n do
        local name = ffi.string(buf + pos)
        names[#names + 1] = name
        pos = pos + #name + 1
      end
      return names
    end
    cap = n + 4096
  end
  return nil, "the directory keeps changing"
end

function SH.is_dir(path) return type(path) == "string" and path ~= "" and list_dir(path) ~= nil end

local function xxh64(text)
  local out = ffi.new("uint64_t[1]")
  core.check(C.mu_st_checksum_bytes(text, #text, out), "checksum", 2)
  return "xxh64:" .. bit.tohex(out[0], 16)
end

-- The index's checksum: of its canonical JSON without the checksum.
local function index_checksum(idx)
  local copy = {}
  for k, v in pairs(idx) do if k ~= "checksum" then copy[k] = v end end
  return xxh64(S.canonical_json(copy))
end

-- A fresh tag for this save's files: the step and 8 random bytes (rank 0's).
local function new_tag(step)
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(8) or tostring(os.time()) .. tostring(os.clock())
  if f then f:close() end
  local hex = bytes:gsub(".", function(c) return ("%02x"):format(c:byte()) end)
  return ("s%s-%s"):format(step or "0", hex:sub(1, 16))
end

-- fn(name, t, p) for every state tensor of the parts' parameters with
-- state (t: S.tensor_specs' entry), in the parts' and registration order.
local function each_state_tensor(stepper, parts, fn)
  for _, part in ipairs(parts) do
    local _, params = S.of_kind(stepper, part.kind)
    for _, e in ipairs(params) do
      if stepper:step_count(e.p) > 0 then
        for _, t in ipairs(S.tensor_specs(stepper, e)) do fn(part.prefix .. e.p.name .. "/" .. t.key, t, e.p) end
      end
    end
  end
end

-- The state tensors this rank writes: { name, tensor } for each non-empty
-- box it holds (its live tensor: nothing copied).
local function own_entries(stepper, parts)
  local W, list = stepper:size(), {}
  each_state_tensor(stepper, parts, function(name, t, p)
    local n = W > 1 and D.numel(t.record.mine.len) or D.numel(t.shape)
    if (W == 1 or t.record.holds) and n > 0 then list[#list + 1] = { name = name, tensor = stepper:state_of(p)[t.key] } end
  end)
  return list
end

-- The index's tensors (every rank can compute them, rank 0 does): name ->
-- { dtype, shape, boxes = { {file, start, len} } }, file = holder + 1.
local function index_tensors(stepper, parts)
  local W, out = stepper:size(), {}
  each_state_tensor(stepper, parts, function(name, t)
    local boxes = {}
    if W == 1 then
      if D.numel(t.shape) > 0 then
        local zero = {}
        for d = 1, #t.shape do zero[d] = 0 end
        boxes[1] = { file = 1, start = zero, len = t.shape }
      end
    else
      for _, hb in ipairs(D.boxes_of(t.record, stepper:mesh())) do
        boxes[#boxes + 1] = { file = hb.holder + 1, start = hb.box.start, len = hb.box.len }
      end
    end
    out[name] = { dtype = t.dtype, shape = t.shape, boxes = boxes }
  end)
  return out
end

-- The state dict of a kind without its tensors (the index's header: the
-- parameters, the groups' steps and hyperparameters, the step counts).
local function header_dict(stepper, kind)
  local groups, params = S.of_kind(stepper, kind)
  local d = { kind = kind, params = {}, state = {}, groups = {} }
  for li, g in ipairs(groups) do d.groups[li] = { step = g.options.step, options = S.group_options(g.kind, g.options) } end
  for _, e in ipairs(params) do
    local p = e.p
    d.params[#d.params + 1] = { name = p.name, shape = p.logical_shape, dtype = p.value:dtype(), group = e.group }
    local n = stepper:step_count(p)
    if n > 0 then d.state[p.name] = e.kind.counts_steps and { step = n } or {} end
  end
  return d
end

-- This rank's file's checksum and bytes, gathered by every rank (one
-- all-reduce of 3 integers per rank: the XXH64 in two halves, the bytes).
local function gather_files(stepper, names, checksum, bytes)
  local W, me = stepper:size(), stepper:rank()
  local vec = {}
  for i = 1, 3 * W do vec[i] = 0 end
  vec[3 * me + 1] = tonumber(checksum:sub(7, 14), 16)
  vec[3 * me + 2] = tonumber(checksum:sub(15, 22), 16)
  vec[3 * me + 3] = bytes
  local r = W > 1 and stepper:control():allreduce(vec, "sum") or vec
  local files = {}
  for q = 0, W - 1 do
    files[q + 1] = { name = names[q + 1], checksum = ("xxh64:%08x%08x"):format(r[3 * q + 1], r[3 * q + 2]),
      bytes = r[3 * q + 3] }
  end
  return files
end

-- Agree on a failure; on one, remove this rank's new file first.
local function agree_or_remove(stepper, err, path)
  local ok, e = pcall(stepper.agree_failure, stepper, err)
  if not ok then
    if path then os.remove(path) end
    error(e, 0)
  end
end

local save_body
function SH.save(stepper, dir, parts, extra_meta, pre_err)
  return stepper:exclusive("save", save_body, stepper, dir, parts, extra_meta, pre_err)
end

function save_body(stepper, dir, parts, extra_meta, pre_err)
  stepper:gate("save_sharded", pre_err)
  stepper:build_once()
  local W, me = stepper:size(), stepper:rank()
  local step = extra_meta and extra_meta["muon.engine.step"]
  -- 1. rank 0 makes the directory and draws the save's tag
  local tag, err = "", nil
  if me == 0 then
    local ok, e = pcall(function()
      core.check(C.mu_dir_make(dir), "save")
      tag = new_tag(step)
    end)
    if not ok then err = e end
  end
  if W > 1 then tag = stepper:control():bcast_string(tag, 0) end
  stepper:agree_failure(err)
  local names = {}
  for q = 0, W - 1 do names[q + 1] = file_name(q, W, tag) end
  -- 2. every rank writes its own boxes
  local mine = join(dir, names[me + 1])
  local written, checksum, bytes = false, nil, nil
  local ok, e = pcall(function()
    local entries = own_entries(stepper, parts)
    local tensors = {}
    for i, en in ipairs(entries) do tensors[i] = en.tensor end
    local bad = foreach.first_nonfinite(tensors)
    if bad then
      E.raise(E.ENONFINITE, "save '%s': state tensor '%s' holds NaN or Inf (a load would refuse it); nothing was "
        .. "written", dir, entries[bad].name)
    end
    bytes, checksum = st.save(mine, entries, { ["muon.shard"] = ("%d of %d"):format(me, W) })
    written = true
  end)
  agree_or_remove(stepper, not ok and e or nil, written and mine or nil)
  -- 3. rank 0 writes the index (the commit), then drops the earlier files
  local files = gather_files(stepper, names, checksum, bytes)
  err = nil
  if me == 0 then
    local okw, ew = pcall(function()
      local dicts = {}
      for _, part in ipairs(parts) do dicts[#dicts + 1] = { prefix = part.prefix, dict = header_dict(stepper, part.kind) } end
      local _, meta = S.encode(dicts, extra_meta)
      local mesh = {}
      if W > 1 then
        local m = stepper:mesh()
        for a, ax in ipairs(m.axes) do mesh[a] = { ax.name, ax.size } end
      end
      local idx = { format = FORMAT, version = VERSION, world = W, mesh = mesh, metadata = meta, files = files,
        tensors = index_tensors(stepper, parts) }
      idx.checksum = index_checksum(idx)
      local text = S.canonical_json(idx) .. "\n"
      core.check(C.mu_file_write_atomic(join(dir, INDEX), text, #text), "save")
      -- committed: the earlier saves' files go (before the agreement, so
      -- that on every rank the save returns with the directory as it stays)
      local keep = {}
      for _, n in ipairs(names) do keep[n] = true end
      for _, n in ipairs(list_dir(dir) or {}) do
        if n:match(SHARD_NAME) and not keep[n] then os.remove(join(dir, n)) end
      end
    end)
    if not okw then err = ew end
  end
  agree_or_remove(stepper, err, mine)
end

------------------------------------------------------------------- load

local is_int, is_list = S.is_int, S.is_list
local function int_list(x, n)
  if not is_list(x) or (n and #x ~= n) or #x > st.MAX_DIMS then return false end
  for _, v in ipairs(x) do if not is_int(v) then return false end end
  return true
end
local DTYPES = { float32 = true, float64 = true, bfloat16 = true }

-- The first thing wrong with a decoded index, or nil.
local function validate_index(idx)
  if type(idx) ~= "table" or is_list(idx) then return "it is not an object" end
  if idx.format ~= FORMAT or idx.version ~= VERSION then
    return ("format %s version %s, expected %s version %d"):format(tostring(idx.format), tostring(idx.version), FORMAT,
      VERSION)
  end
  if not is_int(idx.world) or idx.world < 1 then return "world is not an integer >= 1" end
  if not is_list(idx.files) or #idx.files ~= idx.world then return "files is not a list of one file per rank of world" end
  local seen = {}
  for i, f in ipairs(idx.files) do
    if type(f) ~= "table" or type(f.name) ~= "string" or not f.name:match(SHARD_NAME) or seen[f.name] then
      return ("files[%d] has no valid shard name (or one used twice)"):format(i)
    end
    seen[f.name] = true
    if type(f.checksum) ~= "string" or not f.checksum:match("^xxh64:%x+$") or #f.checksum ~= 22 then
      return ("files[%d].checksum is not xxh64:<16 hex digits>"):format(i)
    end
    if not is_int(f.bytes) then return ("files[%d].bytes is not an integer >= 0"):format(i) end
  end
  if type(idx.metadata) ~= "table" then return "metadata is not an object" end
  for k, v in pairs(idx.metadata) do
    if type(k) ~= "string" or type(v) ~= "string" then return "metadata does not map strings to strings" end
  end
  if type(idx.tensors) ~= "table" or (next(idx.tensors) ~= nil and is_list(idx.tensors)) then
    return "tensors is not an object"
  end
  for name, t in pairs(idx.tensors) do
    local w = ("tensors['%s']"):format(tostring(name))
    if type(t) ~= "table" or not DTYPES[t.dtype] then return w .. ".dtype is not float32, float64 or bfloat16" end
    if not int_list(t.shape) then return w .. ".shape is not a list of sizes" end
    if not is_list(t.boxes) then return w .. ".boxes is not a list" end
    for j, b in ipairs(t.boxes) do
      local wb = ("%s.boxes[%d]"):format(w, j)
      if type(b) ~= "table" or not is_int(b.file) or b.file < 1 or b.file > #idx.files then
        return wb .. ".file is not a file index 1.." .. #idx.files
      end
      if not int_list(b.start, #t.shape) or not int_list(b.len, #t.shape) then return wb .. " has no start and len per dim" end
      for d = 1, #t.shape do
        if b.start[d] + b.len[d] > t.shape[d] then return wb .. " lies outside the tensor's shape" end
      end
    end
  end
end

local function fmt_list(x) return "(" .. table.concat(x, ", ") .. ")" end

-- The intersection of two boxes, or nil when empty.
local function intersect(a, b)
  local start, len = {}, {}
  for d = 1, #a.len do
    local lo = math.max(a.start[d], b.start[d])
    local hi = math.min(a.start[d] + a.len[d], b.start[d] + b.len[d])
    if hi <= lo then return nil end
    start[d], len[d] = lo, hi - lo
  end
  return { start = start, len = len }
end

local function read_index(dir, verify)
  local path = join(dir, INDEX)
  if C.mu_file_check(path, nil, 0) ~= 0 then
    E.raise(E.EIO, "'%s' is a directory but not a sharded checkpoint: '%s': %s (save(dir, { sharded = true }) "
      .. "writes one)", dir, path, ffi.string(C.mu_last_error()))
  end
  local f = io.open(path, "rb")
  if not f then E.raise(E.EIO, "cannot read '%s'", path) end
  local text = f:read("*a")
  f:close()
  local ok, idx = pcall(cjson.decode, text)
  local problem = not ok and "it is not valid JSON" or validate_index(idx)
  if problem then E.raise(E.EFORMAT, "'%s' is malformed (%s)", path, problem) end
  if verify ~= false then
    if type(idx.checksum) ~= "string" or idx.checksum:lower() ~= index_checksum(idx) then
      E.raise(E.EFORMAT, "'%s': checksum mismatch (it says %s, its contents give %s): the index is corrupted (or "
        .. "edited: load(path, { checksum = false }) skips the checksums)", path, tostring(idx.checksum),
        index_checksum(idx))
    end
  end
  return idx, path
end

-- The files' expected headers: per file, tensor name -> box.
local function file_contents(idx)
  local per = {}
  for i = 1, #idx.files do per[i] = {} end
  for name, t in pairs(idx.tensors) do
    for _, b in ipairs(t.boxes) do
      if per[b.file][name] then
        E.raise(E.EFORMAT, "'%s' is malformed (tensor '%s' has two boxes in file '%s')", INDEX, name,
          idx.files[b.file].name)
      end
      per[b.file][name] = b
    end
  end
  return per
end

function SH.reader(dir, verify, kinds, stepper)
  if not SH.is_dir(dir) then return nil end
  local idx, ipath = read_index(dir, verify)
  local W, me = stepper:size(), stepper:rank()
  local per = file_contents(idx)
  if me == 0 then -- a file named like a shard that the index does not list
    local listed = {}
    for _, f in ipairs(idx.files) do listed[f.name] = true end
    local names = list_dir(dir) or {}
    table.sort(names)
    for _, n in ipairs(names) do
      if n:match(SHARD_NAME) and not listed[n] then
        E.raise(E.EFORMAT, "'%s': shard file '%s' is not listed in %s (an extra file, or one of an interrupted "
          .. "save: remove it)", dir, join(dir, n), INDEX)
      end
    end
  end
  local open = {} -- file index -> opened file, checked
  local function file(i)
    if open[i] then return open[i] end
    local fe = idx.files[i]
    local path = join(dir, fe.name)
    local ok, f = pcall(st.open, path)
    if not ok then
      E.raise(E.code(f) or E.EIO, "sharded checkpoint '%s': shard file '%s' (listed in %s) cannot be read: %s", dir,
        path, INDEX, E.message(f))
    end
    open[i] = f
    local function bad(fmt, ...)
      E.raise(E.EFORMAT, "sharded checkpoint '%s': shard file '%s' does not match %s: " .. fmt, dir, path, INDEX, ...)
    end
    local rank = ("%d of %d"):format(i - 1, #idx.files)
    if f.metadata["muon.shard"] ~= rank then
      bad("it says it is rank %s's file, the index lists it as rank %s's", tostring(f.metadata["muon.shard"]), rank)
    end
    local want = per[i]
    for _, en in ipairs(f.entries) do
      local b = want[en.name]
      if not b then bad("it holds tensor '%s', which the index does not place in it", en.name) end
      local t = idx.tensors[en.name]
      if en.dtype ~= t.dtype or fmt_list(en.shape) ~= fmt_list(b.len) then
        bad("tensor '%s' is %s %s, the index says %s %s", en.name, tostring(en.dtype), fmt_list(en.shape), t.dtype,
          fmt_list(b.len))
      end
    end
    for name in pairs(want) do
      if not f.by_name[name] then bad("it has no tensor '%s'", name) end
    end
    if f.data_size ~= fe.bytes then bad("its data section has %d bytes, the index says %d", f.data_size, fe.bytes) end
    if verify ~= false then
      local got = f.checksum()
      if got ~= fe.checksum:lower() or (f.metadata["muon.checksum"] or ""):lower() ~= got then
        E.raise(E.EFORMAT, "sharded checkpoint '%s': shard file '%s' is corrupted: its data gives %s, %s says %s "
          .. "and its header %s", dir, path, got, INDEX, fe.checksum, tostring(f.metadata["muon.checksum"]))
      end
    end
    return f
  end
  -- Every file is checked by one rank (file i by rank (i - 1) mod W), so a
  -- missing or corrupt file fails the load whatever boxes each rank reads.
  for i = me + 1, #idx.files, W do file(i) end
  -- The stand-ins: full-shape tensors over one cell (mismatches and the
  -- staging read their shapes and dtypes only).
  local cell = T.zeros({ 1 }, "float64")
  local names, order, tensors = {}, {}, {}
  for name, t in pairs(idx.tensors) do
    local zero = {}
    for d = 1, #t.shape do zero[d] = 0 end
    local v = T.wrap(cell.data, t.shape, t.dtype, zero)
    tensors[name], names[v] = v, name
    order[#order + 1] = name
  end
  table.sort(order)
  local meta = {}
  for k, v in pairs(idx.metadata) do meta[k] = v end
  -- (the data checksum a file's metadata holds: here the index's, which
  -- covers the files' checksums; the ranks' agreement compares it)
  meta["muon.checksum"] = idx.checksum
  local dicts = S.decode({ metadata = meta, order = order, tensors = tensors, lazy = true }, ipath, verify, kinds)

  -- This rank's box of state tensor t (as the group keeps it), assembled
  -- from the boxes of the files that meet it.
  local function fetch(_, t, v)
    local name = names[v]
    local it = idx.tensors[name]
    local box = t.record and t.record.mine
    if not box then
      local zero = {}
      for d = 1, #it.shape do zero[d] = 0 end
      box = { start = zero, len = it.shape }
    end
    local dst = T.zeros(box.len, it.dtype)
    local covered, pieces = 0, {}
    for _, b in ipairs(it.boxes) do
      local x = intersect(b, box)
      if x then
        for _, y in ipairs(pieces) do
          if intersect(x, y) then
            E.raise(E.EFORMAT, "'%s' is malformed (boxes of tensor '%s' overlap)", ipath, name)
          end
        end
        pieces[#pieces + 1] = x
        covered = covered + D.numel(x.len)
        local f = file(b.file)
        local view = D.box_view(dst, x, box)
        if fmt_list(b.start) == fmt_list(box.start) and fmt_list(b.len) == fmt_list(box.len) then
          f.read(name, dst) -- (the same box: straight into place)
        else
          local tmp = T.zeros(b.len, it.dtype)
          f.read(name, tmp)
          view:copy(D.box_view(tmp, x, b))
        end
        if not view:all_finite() then
          E.raise(E.EFORMAT, "sharded checkpoint '%s': state tensor '%s' in '%s' holds NaN or Inf", dir, name,
            join(dir, idx.files[b.file].name))
        end
      end
    end
    if covered ~= D.numel(box.len) then
      E.raise(E.EFORMAT, "'%s' is malformed (the boxes of tensor '%s' do not cover %s at %s)", ipath, name,
        fmt_list(box.len), fmt_list(box.start))
    end
    return dst:dtype() == t.dtype and dst or dst:clone(t.dtype)
  end
  local function close()
    for _, f in pairs(open) do f.close() end
    open = {}
  end
  return { dicts = dicts, meta = meta, fetch = fetch, close = close, cell = cell }
end

return SH
