-- `muon check config.lua --params shapes.txt`: which parameter lands in
-- which group, with which optimizer and options, and every problem found,
-- without training anything (engine.check builds a dry engine).
--[[ reference muon.check
    `muon check CONFIG --params SHAPES [--trust]` as functions: route
    parameter shapes through a config without allocating them.
muon.check.main(args)
    The CLI entry: prints the table, then "no problems found" (exit status
    0) or the problems (1); usage errors exit 2.
muon.check.run(config_path, shapes_path, opts)
    The table text (with "config: <name>" first when the config has one)
    and the list of problems (unmatched parameters, 1-D parameters in a
    Muon group, unreadable lines, a broken config). opts as
    muon.engine.new's.
muon.check.read_shapes(path)
    A shapes file (lines "name dim1 dim2 ...", # comments) as { {name =,
    shape = {...}}, ... } and the list of problems, or nil and a message.
muon.check.format_options(options, defaults, hooks, order)
    "lr=0.02 weight_decay=0.1 ...": the kind's usual keys in order, the
    other options that differ from the defaults (sorted), then hooks=....
muon.check.format_table(header, rows)
    A text table with a header row, columns padded to the widest cell.
]]
local check = {}

local USAGE = "usage: muon check [--trust] CONFIG.lua --params SHAPES.txt\n"
  .. "  SHAPES.txt: one parameter per line, 'name dim1 dim2 ...' ('#' starts a comment)\n"
  .. "  --trust: run the config with full Lua (io, os, require); default: sandboxed\n"

-- Parse a shapes file: returns list of { name=, shape={...} } or nil, err.
function check.read_shapes(path)
  local C = require("muon.core").C
  if C.mu_file_check(path, nil, 0) ~= 0 then -- a FIFO would block io.open
    return nil, ("cannot open params file '%s': %s"):format(path, require("ffi").string(C.mu_last_error()))
  end
  local f, err = io.open(path, "r")
  if not f then return nil, "cannot open params file: " .. tostring(err) end
  local shapes, problems = {}, {}
  local n = 0
  for line in f:lines() do
    n = n + 1
    local text = line:gsub("#.*$", "")
    local fields = {}
    for w in text:gmatch("%S+") do fields[#fields + 1] = w end
    if #fields > 0 then
      local shape, bad = {}, nil
      for i = 2, #fields do
        local d = tonumber(fields[i])
        if not d or d ~= math.floor(d) or d < 0 then bad = fields[i] break end
        shape[#shape + 1] = d
      end
      if bad then
        problems[#problems + 1] = ("%s:%d: bad dimension '%s' for parameter '%s'"):format(path, n, bad, fields[1])
      else
        shapes[#shapes + 1] = { name = fields[1], shape = shape }
      end
    end
  end
  f:close()
  return shapes, problems
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
function check.run(config_path, shapes_path, opts)
  local shapes, problems = check.read_shapes(shapes_path)
  if not shapes then return "", { problems } end
  local engine = require("muon.engine")
  local okc, err = pcall(engine.new, config_path, opts)
  if not okc then -- the config itself is broken: no table
    problems[#problems + 1] = tostring(err)
    return "", problems
  end
  local ok, rows, more = pcall(engine.check, config_path, shapes, opts)
  if not ok then
    problems[#problems + 1] = tostring(rows)
    return "", problems
  end
  for _, p in ipairs(more or {}) do problems[#problems + 1] = p end
  local by_name = {}
  for _, r in ipairs(rows or {}) do by_name[r.name] = r end
  local cells = {}
  for _, s in ipairs(shapes) do
    local dims = {}
    for i, d in ipairs(s.shape) do dims[i] = tostring(d) end
    local r = by_name[s.name]
    if r then
      local group = r.group and tostring(r.group) or "-"
      if r.group_name then group = group .. " (" .. r.group_name .. ")" end
      cells[#cells + 1] = {
        r.name, table.concat(dims, "x"), group, r.optimizer or "-", check.format_options(r.options, r.defaults, r.hooks, r.order),
      }
    else
      cells[#cells + 1] = { s.name, table.concat(dims, "x"), "-", "-", "(not registered: see problems)" }
    end
  end
  local text = check.format_table({ "parameter", "shape", "group", "optimizer", "options" }, cells)
  local name = err.config.name
  if name ~= nil then text = "config: " .. name .. "\n" .. text end
  return text, problems
end

function check.main(args)
  local config, params, trusted
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
    io.stderr:write("muon check: " .. (config and "missing --params SHAPES.txt" or "missing CONFIG.lua") .. "\n" .. USAGE)
    return 2
  end
  local text, problems = check.run(config, params, trusted and { trusted = true } or nil)
  io.write(text)
  if #problems == 0 then
    io.write("no problems found\n")
    return 0
  end
  io.write(("\n%d problem%s:\n"):format(#problems, #problems == 1 and "" or "s"))
  for _, p in ipairs(problems) do io.write("  - ", p, "\n") end
  return 1
end

return check
