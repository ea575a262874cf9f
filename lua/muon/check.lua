-- `muon check config.lua --params shapes.txt|model.safetensors`: which
-- parameter lands in which group, with which optimizer and options, the
-- Newton-Schulz shape and cost of each Muon parameter, totals per group,
-- warnings for matrices that rarely belong in Muon, and every problem
-- found, without training anything (engine.check builds a dry engine).
--[[ reference muon.check
    `muon check CONFIG --params SHAPES|MODEL.safetensors [--trust]` as
    functions: route parameter shapes through a config without allocating
    them; Newton-Schulz shapes and costs, totals per group, warnings.
muon.check.main(args)
    The CLI entry: prints the report, notes and warnings, then "no problems
    found" (exit status 0) or the problems (1); usage errors exit 2.
    Warnings do not change the exit status.
muon.check.run(config_path, shapes_path, opts)
    The report text (with "config: <name>" first when the config has one:
    the routing table, the Newton-Schulz table, the totals per group), the
    list of problems (unmatched parameters, 1-D parameters in a Muon group,
    a Muon group whose match selects no parameter while others take the
    matrices, a pattern in regex syntax, unreadable lines, a broken config,
    an unreadable params file), the warnings (check.warnings, and groups
    left empty: Engine:check_routes) and notes (tensors a checkpoint left
    out).
    opts as muon.engine.new's.
muon.check.read_params(path)
    The parameters of a params file, told apart by content (never by the
    file's name): a safetensors file (a u64 header length that fits the
    file, then '{') is read with read_safetensors_shapes, any other file
    with a control byte (NUL, ...) is refused (nil and a message: binary
    content is never read as names), else read_shapes. Returns shapes,
    problems, notes, or nil and a message.
muon.check.read_safetensors_shapes(path)
    Names and shapes of the floating-point tensors of a safetensors file
    from its header (no data read), in file order; integer and bool
    tensors (buffers: position ids, masks) are left out, each named in a
    note. Returns shapes, {}, notes, or nil and a message.
muon.check.read_shapes(path)
    A shapes file (lines "name dim1 dim2 ...", # comments) as { {name =,
    shape = {...}}, ... } and the list of problems, or nil and a message
    (a line with a control byte: not a text file).
muon.check.ns_shape(shape, nd_mode)
    How Newton-Schulz sees a parameter (muon.ns.core, the step's rule):
    "[96, 32]"; "[16, 8] (conv-like [16, 1, 8])"; "192 x [3, 3]: dims 1..2
    batched; nd_mode=flatten gives [64, 27]"; "[64, 27] (dims 2..4
    flattened: nd_mode=flatten)"; "-" for a 1-D shape.
muon.check.totals(rows)
    Per group of engine.check's rows (in group order), then "all": {
    label, optimizer, params, elements, state_bytes (the kind's state in
    its state_dtype and the hook state in float32, for float32 parameters
    on one process), flops (Newton-Schulz flops per step: muon.ns.shape_cost
    with the group's options; nil when a zeropower_fn hook replaces it) }.
muon.check.warnings(rows)
    Messages for matrices routed to a Newton-Schulz kind that usually
    belong in AdamW: 1xN and Nx1 (as Newton-Schulz sees them),
    embedding-like (a name with embed, wte, wpe, lm_head or tok_emb, or a
    side > 10x the other and > 32768), and N-D parameters batched into
    small matrices (nd_mode = "batch", a side <= 8).
muon.check.format_report(rows)
    The Newton-Schulz table and the totals table run prints after the
    routing table.
muon.check.write_list(what, list)
    Writes "N <what>s:" and the items to stdout (nothing for an empty list).
muon.check.format_options(options, defaults, hooks, order)
    "lr=0.02 weight_decay=0.1 ...": the kind's usual keys in order, the
    other options that differ from the defaults (sorted), then hooks=....
muon.check.format_table(header, rows)
    A text table with a header row, columns padded to the widest cell.
]]
local check = {}

local shape_string = require("muon.tensor").shape_string

local USAGE = "usage: muon check [--trust] CONFIG.lua --params SHAPES.txt|MODEL.safetensors [--world N --rank R [--mesh SPEC]]\n"
  .. "  SHAPES.txt: one parameter per line, 'name dim1 dim2 ...' ('#' starts a comment)\n"
  .. "  MODEL.safetensors: names and shapes from its header (the data is not read; integer\n"
  .. "    and bool tensors are buffers, not parameters, and are left out)\n"
  .. "  --world N --rank R: print rank R's plan at world size N (no MPI; N <= 2147483647, MPI's\n"
  .. "    int ranks); --mesh axis:size,...\n"
  .. "    (e.g. replicate:2,shard:2048; default: the config's dist.mesh); a SHAPES line may end\n"
  .. "    with a placement '@R,S(1)' (default: R on replicate axes, S(1) on shard axes)\n"
  .. "  --trust: run the config with full Lua (io, os, require); default: sandboxed\n"

-- Parse a shapes text file: returns list of { name=, shape={...} } and a
-- list of problems, or nil, err.
function check.read_shapes(path)
  local C = require("muon.core").C
  if C.mu_file_check(path, nil, 0) ~= 0 then -- a FIFO would block io.open
    return nil, ("cannot open params file '%s': %s"):format(path, require("ffi").string(C.mu_last_error()))
  end
  local f, err = io.open(path, "r")
  if not f then return nil, "cannot open params file: " .. tostring(err) end
  local all = f:read("*a") or ""
  f:close()
  local shapes, problems = {}, {}
  local n = 0
  for line in (all:sub(-1) == "\n" and all or all .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local ctl = line:find("[%z\1-\8\14-\31\127]")
    if ctl then -- (binary content is never read as names)
      return nil, ("params file '%s' is not a shapes text file: line %d has the control byte 0x%02x"):format(
        path, n, line:byte(ctl))
    end
    local text = line:gsub("#.*$", "")
    local fields = {}
    for w in text:gmatch("%S+") do fields[#fields + 1] = w end
    if #fields > 0 then
      local shape, bad, placement = {}, nil, nil
      if #fields > 1 and fields[#fields]:sub(1, 1) == "@" then -- a placement (muon check --world)
        placement = {}
        for e in fields[#fields]:sub(2):gmatch("[^,]+") do placement[#placement + 1] = e end
        fields[#fields] = nil
      end
      for i = 2, #fields do
        local d = tonumber(fields[i])
        if not d or d ~= math.floor(d) or d < 0 then bad = fields[i] break end
        shape[#shape + 1] = d
      end
      if bad then
        problems[#problems + 1] = ("%s:%d: bad dimension '%s' for parameter '%s'"):format(path, n, bad, fields[1])
      else
        shapes[#shapes + 1] = { name = fields[1], shape = shape, placement = placement }
      end
    end
  end
  return shapes, problems
end

-- The first bytes of a regular file (n at most), or nil, err.
local function head_bytes(path, n)
  local C = require("muon.core").C
  if C.mu_file_check(path, nil, 0) ~= 0 then -- a FIFO would block io.open
    return nil, ("cannot open params file '%s': %s"):format(path, require("ffi").string(C.mu_last_error()))
  end
  local f, err = io.open(path, "rb")
  if not f then return nil, "cannot open params file: " .. tostring(err) end
  local s = f:read(n) or ""
  local size = f:seek("end")
  f:close()
  return s, size
end

-- Does head (the first bytes of a file of size bytes) start like a
-- safetensors file: a u64 little-endian header length N, 8 + N <= size,
-- then the JSON object's '{'?
local function looks_safetensors(head, size)
  if #head < 9 then return false end
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + head:byte(i) end
  return n >= 2 and 8 + n <= size and head:sub(9, 9) == "{"
end

-- Why head is not text (a NUL or another control byte), or nil.
local function binary_reason(head)
  if head:sub(1, 4) == "PK\3\4" then return "a zip archive, as torch.save writes (save a safetensors file instead)" end
  local i = head:find("[%z\1-\8\14-\31\127]")
  if i then return ("byte %d is 0x%02x"):format(i, head:byte(i)) end
  return nil
end

-- Names and shapes from a safetensors header (no data read). Integer and
-- bool tensors are buffers (position ids, masks), not parameters: left
-- out, each named in a note.
function check.read_safetensors_shapes(path)
  local ok, h = pcall(require("muon.safetensors").inspect, path)
  if not ok then return nil, ("params file '%s': %s"):format(path, require("muon.errors").message(h)) end
  local shapes, notes = {}, {}
  for _, e in ipairs(h.entries) do
    local float = e.st_dtype == "F32" or e.st_dtype == "F64" or e.st_dtype == "BF16" or e.st_dtype == "F16"
      or e.st_dtype:match("^F8") ~= nil
    if float then
      shapes[#shapes + 1] = { name = e.name, shape = e.shape, dtype = e.st_dtype }
    else
      notes[#notes + 1] = ("'%s' (%s %s) left out: not a floating-point tensor (a buffer, not a parameter)")
        :format(e.name, e.st_dtype, shape_string(e.shape))
    end
  end
  return shapes, {}, notes
end

-- The parameters of a params file, told apart by content (never by the
-- file's name): a safetensors file (its header), else a shapes text file;
-- any other binary file is a problem, never read as names. Returns shapes,
-- problems, notes (or nil, err).
function check.read_params(path)
  local head, size = head_bytes(path, 4096)
  if not head then return nil, size end
  if looks_safetensors(head, size) then return check.read_safetensors_shapes(path) end
  local why = binary_reason(head)
  if why then
    return nil, ("params file '%s' is neither a safetensors file nor a shapes text file (%s)"):format(path, why)
  end
  local shapes, problems = check.read_shapes(path)
  return shapes, problems, {}
end

local function numel(shape) return require("muon.dist").numel(shape) end

-- The matrix a conv-like N-D shape flattens into (nd_mode = "flatten").
local function flattened(shape) return shape_string({ shape[1], numel(shape) / math.max(shape[1], 1) }) end

-- How Newton-Schulz sees a parameter of this shape (muon.ns.core, the rule
-- the step uses): "[64, 27] (dims 2..4 flattened: ...)", "192 x [3, 3]: ...".
function check.ns_shape(shape, nd_mode)
  local ns = require("muon.ns")
  local a, b, batch = ns.core(shape, nd_mode)
  if a == nil then return "-" end
  local n, ab = #shape, shape_string({ a, b })
  if n == 2 then return ab end
  if nd_mode == "flatten" then
    return ("%s (dims 2..%d flattened: nd_mode=flatten)"):format(ab, n)
  end
  if n == 3 and shape[2] == 1 then return ("%s (conv-like %s)"):format(ab, shape_string(shape)) end
  return ("%d x %s: dims 1..%d batched; nd_mode=flatten gives %s"):format(batch, ab, n - 2, flattened(shape))
end

-- NS flops per step of a row (0 for other kinds): the cost model
-- (muon.ns.shape_cost) with the group's options; nil when a hook
-- (zeropower_fn) replaces Newton-Schulz.
local function ns_flops(row)
  local kinds = require("muon.optim.kinds")
  local kind = kinds.get(row.optimizer)
  if not (kind and kind.ns) then return 0 end
  for _, h in ipairs(row.hooks or {}) do
    if h == "zeropower_fn" then return nil end
  end
  return (require("muon.ns").shape_cost(row.shape, row.options.nd_mode, row.ns_opts))
end

-- Optimizer-state bytes of a row: the kind's state tensors (state_dtype:
-- float32 or bfloat16) and its hook state (float32), as a float32 model
-- holds them on one process.
local function state_bytes(row)
  local kinds = require("muon.optim.kinds")
  local kind = kinds.get(row.optimizer)
  if not kind then return 0 end
  local es = row.options.state_dtype == "bfloat16" and 2 or 4
  local bytes = #kind.state_keys * numel(row.shape) * es
  if kind.hook_shapes and row.options.hook_state then
    local ok, list = pcall(kind.hook_shapes, row.options, row.shape)
    for _, h in ipairs(ok and list or {}) do bytes = bytes + 4 * numel(h.shape) end
  end
  return bytes
end

-- Per group (in group order) and in all: { label, optimizer, params,
-- elements, state_bytes, flops (nil: a zeropower_fn hook) }.
function check.totals(rows)
  local by, list = {}, {}
  local all = { label = "all", optimizer = "", params = 0, elements = 0, state_bytes = 0, flops = 0 }
  for _, r in ipairs(rows) do
    local t = by[r.group]
    if not t then
      t = { group = r.group, label = tostring(r.group) .. (r.group_name and (" (" .. r.group_name .. ")") or ""),
        optimizer = r.optimizer, params = 0, elements = 0, state_bytes = 0, flops = 0 }
      by[r.group] = t
      list[#list + 1] = t
    end
    local n, sb, fl = numel(r.shape), state_bytes(r), ns_flops(r)
    for _, x in ipairs({ t, all }) do
      x.params, x.elements, x.state_bytes = x.params + 1, x.elements + n, x.state_bytes + sb
      x.flops = (x.flops and fl) and x.flops + fl or nil
    end
  end
  table.sort(list, function(a, b) return a.group < b.group end)
  list[#list + 1] = all
  return list
end

local EMBED_NAMES = { "embed", "wte", "wpe", "lm_head", "tok_emb" }

-- Matrices routed to Muon that usually belong in AdamW: 1xN and Nx1 (as
-- Newton-Schulz sees them), and embedding-like ones (a name with embed,
-- wte, wpe, lm_head, tok_emb; or a side > 10x the other and > 32768).
-- Returns a list of messages.
function check.warnings(rows)
  local kinds = require("muon.optim.kinds")
  local out = {}
  for _, r in ipairs(rows) do
    local kind = kinds.get(r.optimizer)
    local a, b, batch = require("muon.ns").core(r.shape, r.options.nd_mode)
    if kind and kind.ns and a then
      local what = ("'%s' (%s, group %s) "):format(r.name, shape_string(r.shape), tostring(r.group))
      local lname = r.name:lower()
      local named
      for _, pat in ipairs(EMBED_NAMES) do
        if lname:find(pat, 1, true) then named = pat break end
      end
      if a == 1 or b == 1 then
        out[#out + 1] = what .. ("is a %s matrix for Newton-Schulz: orthogonalizing a vector only "
          .. "normalizes it; such parameters usually go to AdamW"):format(shape_string({ a, b }))
      elseif named then
        out[#out + 1] = what .. ("looks like an embedding or output head (its name has '%s'): those usually "
          .. "go to AdamW (Muon is for hidden matrices)"):format(named)
      elseif math.max(a, b) > 10 * math.min(a, b) and math.max(a, b) > 32768 then
        out[#out + 1] = what .. ("looks like an embedding or output head (%s: one side > 10x the other and "
          .. "> 32768): those usually go to AdamW (Muon is for hidden matrices)"):format(shape_string({ a, b }))
      end
      if #r.shape > 2 and r.options.nd_mode ~= "flatten" and not (#r.shape == 3 and r.shape[2] == 1)
        and math.min(a, b) <= 8 then
        out[#out + 1] = what .. ("is orthogonalized as %d separate %s matrices (nd_mode = 'batch'); a conv "
          .. "kernel is usually one matrix: nd_mode = 'flatten' gives %s"):format(batch, shape_string({ a, b }),
          flattened(r.shape))
      end
    end
  end
  return out
end

-- "1234567 (1.2 MiB)" for bytes; "4.72e+06" for flops.
local function fmt_bytes(n)
  if n < 1024 then return tostring(n) end
  local units, v, u = { "KiB", "MiB", "GiB", "TiB" }, n, 0
  while v >= 1024 and u < #units do v, u = v / 1024, u + 1 end
  return ("%d (%.1f %s)"):format(n, v, units[u])
end

-- The tables after the routing table: Newton-Schulz per parameter, then
-- totals per group.
function check.format_report(rows)
  local kinds = require("muon.optim.kinds")
  local ns_rows = {}
  for _, r in ipairs(rows) do
    local kind = kinds.get(r.optimizer)
    if kind and kind.ns then
      local fl = ns_flops(r)
      ns_rows[#ns_rows + 1] = { r.name, shape_string(r.shape), check.ns_shape(r.shape, r.options.nd_mode),
        fl and ("%.3g"):format(fl) or "(zeropower_fn)" }
    end
  end
  local text = ""
  if #ns_rows > 0 then
    text = text .. "\nNewton-Schulz (standard iteration, ns_steps per step):\n"
      .. check.format_table({ "parameter", "shape", "NS shape", "flops/step" }, ns_rows)
  end
  local t_rows = {}
  for _, t in ipairs(check.totals(rows)) do
    t_rows[#t_rows + 1] = { t.label, t.optimizer, tostring(t.params), tostring(t.elements), fmt_bytes(t.state_bytes),
      t.flops and (t.flops > 0 and ("%.3g"):format(t.flops) or "0") or "(zeropower_fn)" }
  end
  return text .. "\ntotals per group (state: float32 parameters, one process):\n"
    .. check.format_table({ "group", "optimizer", "parameters", "elements", "state bytes", "NS flops/step" }, t_rows)
end

local function fmt_value(v)
  if type(v) == "table" then
    local parts = {}
    for i = 1, #v do parts[i] = fmt_value(v[i]) end
    local keys = {}
    for k in pairs(v) do if type(k) ~= "number" then keys[#keys + 1] = tostring(k) end end
    table.sort(keys)
    for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. fmt_value(v[k]) end
    return "(" .. table.concat(parts, ",") .. ")"
  elseif type(v) == "number" then
    return ("%.6g"):format(v)
  end
  return tostring(v)
end

-- "lr=0.02 wd=0.1 ..." from a row's options: the usual keys (order: the
-- kind's schema says which, kind.DISPLAY), then the other options that
-- differ from defaults (sorted), then hooks by name.
function check.format_options(options, defaults, hooks, order)
  local parts, shown = {}, {}
  options = options or {}
  for _, k in ipairs(order or {}) do
    if options[k] ~= nil then parts[#parts + 1] = k .. "=" .. fmt_value(options[k]) end
    shown[k] = true
  end
  local others = {}
  for k, v in pairs(options) do
    if not shown[k] and type(k) == "string" and k:sub(1, 1) ~= "_" and type(v) ~= "function"
      and fmt_value(v) ~= fmt_value(defaults and defaults[k]) then
      others[#others + 1] = k
    end
  end
  table.sort(others)
  for _, k in ipairs(others) do parts[#parts + 1] = k .. "=" .. fmt_value(options[k]) end
  if hooks and #hooks > 0 then parts[#parts + 1] = "hooks=" .. table.concat(hooks, ",") end
  return table.concat(parts, " ")
end

-- Text table with a header row; columns padded to the widest cell.
function check.format_table(header, rows)
  local widths = {}
  for i, h in ipairs(header) do widths[i] = #h end
  for _, r in ipairs(rows) do
    for i, c in ipairs(r) do widths[i] = math.max(widths[i] or 0, #c) end
  end
  local out = {}
  local function line(cells)
    local t = {}
    for i, c in ipairs(cells) do
      t[i] = i == #cells and c or (c .. string.rep(" ", widths[i] - #c))
    end
    out[#out + 1] = table.concat(t, "  ")
  end
  line(header)
  local rule = {}
  for i = 1, #header do rule[i] = string.rep("-", widths[i]) end
  line(rule)
  for _, r in ipairs(rows) do line(r) end
  return table.concat(out, "\n") .. "\n"
end

-- Runs the check; returns text for stdout and the list of problems.
-- (and the warnings, and notes on what a checkpoint left out)
function check.run(config_path, shapes_path, opts)
  local shapes, problems, notes = check.read_params(shapes_path)
  if not shapes then return "", { problems }, {}, {} end
  local rows, more, eng = require("muon.engine").check(config_path, shapes, opts) -- (the dry run)
  for _, p in ipairs(more) do problems[#problems + 1] = p end
  if not eng then return "", problems, {}, notes end -- the config itself is broken: no table
  local by_name = {}
  for _, r in ipairs(rows) do by_name[r.name] = r end
  local cells = {}
  for _, s in ipairs(shapes) do
    local r = by_name[s.name]
    if r then
      local group = r.group and tostring(r.group) or "-"
      if r.group_name then group = group .. " (" .. r.group_name .. ")" end
      cells[#cells + 1] = {
        r.name, shape_string(s.shape), group, r.optimizer or "-", check.format_options(r.options, r.defaults, r.hooks, r.order),
      }
    else
      cells[#cells + 1] = { s.name, shape_string(s.shape), "-", "-", "(not registered: see problems)" }
    end
  end
  local text = check.format_table({ "parameter", "shape", "group", "optimizer", "options" }, cells)
  text = text .. check.format_report(rows)
  local name = eng.config.name
  if name ~= nil then text = "config: " .. name .. "\n" .. text end
  -- groups left empty (muon.routing): errors are problems, the rest warnings
  local warnings = check.warnings(rows)
  local route_errors, route_warnings = eng:check_routes()
  for _, m in ipairs(route_errors) do problems[#problems + 1] = m end
  for _, m in ipairs(route_warnings) do warnings[#warnings + 1] = m end
  return text, problems, warnings, notes
end

-- "\nN notes:\n  - ...\n" for a non-empty list.
function check.write_list(what, list)
  if #list == 0 then return end
  io.write(("\n%d %s%s:\n"):format(#list, what, #list == 1 and "" or "s"))
  for _, s in ipairs(list) do io.write("  - ", s, "\n") end
end

function check.main(args)
  local config, params, trusted, world
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--params" then
      params = args[i + 1]
      if not params then
        io.stderr:write("muon check: --params needs a file\n" .. USAGE)
        return 2
      end
      i = i + 2
    elseif a:match("^%-%-params=") then
      params = a:sub(10)
      i = i + 1
    elseif a == "--world" or a == "--rank" or a == "--mesh" then
      local v = args[i + 1]
      if not v or (a ~= "--mesh" and not (tonumber(v) and tonumber(v) == math.floor(tonumber(v)))) then
        io.stderr:write(("muon check: %s needs %s\n"):format(a, a == "--mesh" and "a spec (axis:size,...)" or "an integer")
          .. USAGE)
        return 2
      end
      world = world or {}
      world[a:sub(3)] = a == "--mesh" and v or tonumber(v)
      i = i + 2
    elseif a == "--trust" then
      trusted = true
      i = i + 1
    elseif a == "-h" or a == "--help" then
      io.write(USAGE)
      return 0
    elseif a:sub(1, 1) == "-" then
      io.stderr:write("muon check: unknown option '" .. a .. "'\n" .. USAGE)
      return 2
    elseif config then
      io.stderr:write("muon check: unexpected argument '" .. a .. "'\n" .. USAGE)
      return 2
    else
      config = a
      i = i + 1
    end
  end
  if not config or not params then
    io.stderr:write("muon check: " .. (config and "missing --params SHAPES.txt or MODEL.safetensors" or "missing CONFIG.lua") .. "\n" .. USAGE)
    return 2
  end
  local text, problems, warnings, notes
  if world then -- rank R's plan at world size N (muon.check_world)
    if not world.world or not world.rank or world.world < 1 or world.rank < 0 or world.rank >= world.world then
      io.stderr:write("muon check: --world N and --rank R (0 <= R < N) go together\n" .. USAGE)
      return 2
    end
    local max = require("muon.dist").MAX_RANKS
    if world.world > max then
      io.stderr:write(("muon check: --world %.0f: at most %d ranks (MPI numbers ranks with C ints)\n"):format(
        world.world, max) .. USAGE)
      return 2
    end
    local shapes, bad, rnotes = check.read_params(params)
    notes, warnings = rnotes or {}, {}
    if not shapes then text, problems = "", { bad }
    else
      local rw, _
      text, problems, _, rw = require("muon.check_world").run(config, shapes, { world = world.world, rank = world.rank,
        mesh = world.mesh, trusted = trusted })
      warnings = rw or {}
      for _, p in ipairs(bad) do problems[#problems + 1] = p end
    end
  else
    text, problems, warnings, notes = check.run(config, params, trusted and { trusted = true } or nil)
  end
  io.write(text)
  check.write_list("note", notes)
  check.write_list("warning", warnings)
  if #problems == 0 then
    io.write("no problems found\n")
    return 0
  end
  io.write(("\n%d problem%s:\n"):format(#problems, #problems == 1 and "" or "s"))
  for _, p in ipairs(problems) do io.write("  - ", p, "\n") end
  return 1
end

return check
