-- muon.reference: the API reference, kept next to the code it documents.
-- Each public Lua module opens with a reference block (the format is in the
-- block below); the C headers (src/muon.h, the public API, and
-- src/muon_ffi.h, the private FFI surface) document each MU_API function
-- in the comment right above it. This module finds and parses both: `muon help API`,
-- `muon help NAME`, `make reference` (build/REFERENCE.md) and
-- tests/reference_spec.lua (every public name documented, every entry
-- naming something that exists) all read the same text.
--[[ reference muon.reference
    The format of a reference block, at the top of a public module (only
    comment lines and blank lines before it):

      --[[ reference muon.foo
          Free text before the first entry describes the module.
      ## A heading (optional)
      muon.foo.bar(x, opts)
      muon.foo.baz(x)
          A description, indented. Consecutive entry lines share it.
          opts.name = default: one line per option, with its default.
      Class:method(a, b)
          Methods of a class the module returns (R.MODULES names the
          classes of each module): Class:name for a method, Class.name for
          a field of its objects.
      (and a line holding only two closing square brackets)

    An option whose default a schema holds (an optimizer kind's: R.MODULES'
    defaults) is written "opts.name = {default}": muon help and the
    Markdown print the schema's value there, so the default is written
    once, in the schema.

    A block whose text holds two closing square brackets in a row opens
    with a level, as Lua's long comments do: "--[=[ reference muon.foo",
    closed by a line holding "]=]".

    An entry line starts in column 1 with the module's name or one of its
    classes, then "." or ":", then the public name; the rest of the line is
    the signature. Public names are the string keys of the table the module
    returns (and the names a strict module lists as valid) and the members
    of its classes, except names that start with "_" (those may still be
    documented). A module may keep blocks in several files (muon.tensor: its
    maths in lua/muon/tensor_math.lua).
## The list and the parser
muon.reference.MODULES
    The public modules: { name =, files = { module names whose files hold
    blocks } (default: the module itself), classes = { Name = function(mod)
    returning the list of member names }, defaults = function(head) -> the
    option defaults and option names of the schema an entry documents, or
    nil }.
muon.reference.expand(spec, e)
    An entry's description lines with each "opts.name = {default}" made
    "opts.name = <the schema's default>" (a Lua literal; nil when none).
muon.reference.extract(text, where)
    The reference block of a file's text: { module =, lines = { {text =,
    line =} } }, or nil and a problem ("where: no reference block ...").
muon.reference.parse(block, spec)
    The entries of a block: a list of { heads = { {key =, prefix =, sep =,
    where = the file,
    name =, text =, line =} }, desc = { lines }, section = heading } and a
    list of problems (a line naming nothing of the module, an entry without
    a description). key is "muon.foo.bar" or "Class:name".
muon.reference.load(spec)
    Every entry of a module (all its files) and the problems found.
muon.reference.public_names(spec, mod)
    The set of public names of a loaded module: { [key] = true }.
muon.reference.check_module(spec, mod)
    Problems of one module: a public name without an entry, an entry that
    names nothing, a malformed block. spec.texts = { [file] = text } may
    replace the files (the test's fake modules).
muon.reference.check_all()
    check_module over MODULES: a list of problems, empty when complete.
muon.reference.header_entries(text)
    The MU_API declarations of a C header: a list of { name =, decl =,
    comment = (nil if none directly above), line = }.
muon.reference.check_header(text)
    Problems of a header: every MU_API declaration needs its own comment
    ending on the line right above it.
muon.reference.check_header_types(text, where)
    Problems of a header's types: a struct field without a comment on its
    line or right above it, an enum without a comment above it.
muon.reference.header_items(text)
    The header in order for the Markdown: sections, standalone comments,
    types with their comments, MU_API entries.
muon.reference.header_types(text)
    The types and constants of a C header, for lookups: { kind = "struct"
    | "field" | "enum" | "constant", name =, short = (a field's own name),
    parent = (a field's struct, a constant's enum type), comment =, decl =
    } for each struct (typedef struct, opaque ones too), each struct
    field, each enum type (typedef enum), each constant of an enum and each
    status code of the MU_ERRORS table (MU_EINVAL ...).
muon.reference.HEADERS
    The C headers, in order: { name = "muon.h", title = } (the public API,
    installed) and { name = "muon_ffi.h", title =, private = true } (the
    FFI surface of the Lua layer and the tests: the source tree only).
muon.reference.header_path(name)
    The path of a header of HEADERS (default "muon.h"): the source tree's
    src/, or <prefix>/include/; nil when there is none (muon_ffi.h is
    never installed).
muon.reference.markdown()
    The whole reference as Markdown (what `make reference` writes to
    build/REFERENCE.md): every module's entries, then each header's
    functions (muon.h, then muon_ffi.h where it exists).
muon.reference.lookup(name)
    The entries matching a name as text, or nil: a Lua entry by its full
    name ("muon.tensor.zeros", "Tensor:add") or its last name segments
    ("add", "ns.zeropower"), the Lua entries documenting an option of that
    name ("trusted": opts.trusted), a C function ("mu_engine_step"), struct
    ("mu_engine_opts"), field ("trusted", "mu_engine_opts.trusted"), enum
    or constant ("MU_F32", "MU_EINVAL") of the headers. A private C
    header's entry says so (not installed).
muon.reference.main(args)
    `muon help API` (the reference as text), `muon help NAME` (one entry),
    `muon help API --markdown FILE`; returns the exit status.
]]
local CH = require("muon.c_header")

local R = {}

local function sorted_keys(t, skip)
  local list = {}
  for k in pairs(t) do
    if type(k) == "string" and not (skip and k:find("^_")) then list[#list + 1] = k end
  end
  table.sort(list)
  return list
end

local function members(t) return sorted_keys(t, true) end

-- The public modules and their classes. A class function gets the loaded
-- module and returns its member names (methods and documented fields).
R.MODULES = {
  { name = "muon" },
  { name = "muon.tensor", files = { "muon.tensor", "muon.tensor_ops", "muon.tensor_math" }, classes = {
    Tensor = function(T) return members(T.methods) end,
    Generator = function(T) return members(getmetatable(T.default_generator)) end,
  } },
  { name = "muon.param", classes = {
    Param = function(P)
      local list = members(P.Param)
      for _, f in ipairs({ "name", "value", "grad" }) do list[#list + 1] = f end
      return list
    end,
  } },
  { name = "muon.ns" },
  { name = "muon.optim", defaults = function(head)
    local K, kinds = require("muon.optim.kind"), require("muon.optim.kinds")
    for _, k in ipairs(K.KINDS) do
      if head.key == "muon.optim." .. k.class then
        local kind = kinds.get(k.name)
        return kind.DEFAULTS, kind.OPTIONS
      end
    end
  end, classes = {
    Optimizer = function(optim)
      local T, P = require("muon.tensor"), require("muon.param")
      local seen, list = {}, {}
      local function add(names)
        for _, n in ipairs(names) do
          if not seen[n] then seen[n] = true; list[#list + 1] = n end
        end
      end
      for _, name in ipairs(sorted_keys(optim)) do
        local mod = optim[name]
        add(members(mod[mod.kind.class]))
        add(members(mod({ P("w", T.zeros({ 2, 2 }), T.zeros({ 2, 2 })) })))
      end
      return list
    end,
  } },
  { name = "muon.optim.kind", classes = {
    -- every member the loaded kinds carry (supplied, and derived by register)
    Kind = function()
      local kinds = require("muon.optim.kinds")
      local seen, list = {}, {}
      for _, name in ipairs(kinds.names()) do
        for _, k in ipairs(members(kinds.get(name))) do
          if not seen[k] then seen[k] = true; list[#list + 1] = k end
        end
      end
      return list
    end,
  } },
  { name = "muon.engine", classes = { Engine = function(e) return members(e.Engine) end } },
  { name = "muon.schedules" },
  { name = "muon.foreach" },
  { name = "muon.safetensors" },
  { name = "muon.checkpoint_sharded" },
  { name = "muon.comm", classes = {
    Comm = function(c) return members(getmetatable(c.self())) end,
    Request = function(c)
      local req = c.self():ibcast(require("muon.tensor").zeros({ 1 }), 0)
      req:wait()
      return members(getmetatable(req))
    end,
  } },
  { name = "muon.dist", files = { "muon.dist", "muon.dist_mesh", "muon.dist_plan", "muon.dist_split", "muon.dist_agree" }, classes = {
    Mesh = function(d) return members(getmetatable(d.mesh({ { "world", 1 } }, 1))) end,
  } },
  { name = "muon.reduce", classes = {
    Session = function(rd) return members(getmetatable(rd.session(require("muon.comm").self()))) end,
  } },
  { name = "muon.errors" },
  { name = "muon.check" },
  { name = "muon.plot" },
  { name = "muon.reference" },
}

local split_lines = CH.split_lines

-- The block: the first line "--[[ reference <module>", before any code.
function R.extract(text, where)
  local lines = split_lines(text)
  for i, l in ipairs(lines) do
    local eq, mod = l:match("^%-%-%[(=*)%[ reference ([%w_%.]+)%s*$")
    if mod then
      local block = { module = mod, lines = {}, line = i }
      for j = i + 1, #lines do
        if lines[j]:match("^%]" .. eq .. "%]%s*$") then return block end
        block.lines[#block.lines + 1] = { text = lines[j], line = j }
      end
      return nil, ("%s:%d: the reference block is not closed (a line holding only ']]')"):format(where, i)
    end
    if not (l:match("^%s*$") or l:match("^%-%-") or l:match("^#!")) then
      return nil, ("%s:%d: no reference block ('--[[ reference <module>') before the first line of code"):format(where, i)
    end
  end
  return nil, ("%s: no reference block ('--[[ reference <module>')"):format(where)
end

local function prefixes(spec)
  local list = { { spec.name, false } }
  for cname in pairs(spec.classes or {}) do list[#list + 1] = { cname, true } end
  table.sort(list, function(a, b) return #a[1] > #b[1] end) -- the longest first
  return list
end

local function plain(s) return (s:gsub("%p", "%%%0")) end

function R.parse(block, spec)
  local entries, problems = {}, {}
  local pre = prefixes(spec)
  local cur, section, intro = nil, nil, {}
  local where = spec.where or spec.name
  local function close()
    if cur and #cur.desc == 0 then
      problems[#problems + 1] = ("%s:%d: entry '%s' has no description (indent it below the entry line)")
        :format(where, cur.heads[1].line, cur.heads[1].text)
    end
  end
  for _, l in ipairs(block.lines) do
    local s = l.text
    if s:match("^%s*$") then
      if cur and #cur.desc > 0 then cur.desc[#cur.desc + 1] = "" end
    elseif s:match("^## ") then
      close()
      cur, section = nil, s:sub(4)
    elseif s:match("^%s") then
      if cur then cur.desc[#cur.desc + 1] = s else intro[#intro + 1] = s end
    else
      local head
      for _, p in ipairs(pre) do
        local sep, name, rest = s:match("^" .. plain(p[1]) .. "([%.:])([%a_][%w_]*)(.*)$")
        if sep and (rest == "" or not rest:match("^[%w_]")) then
          head = { prefix = p[1], sep = sep, name = name, text = s, line = l.line, where = where,
            key = p[1] .. (p[2] and ":" or ".") .. name }
          break
        end
      end
      if not head then
        local names = {}
        for _, p in ipairs(pre) do names[#names + 1] = p[1] end
        problems[#problems + 1] = ("%s:%d: '%s' is not an entry: entry lines start with %s and '.' or ':' and a name (descriptions are indented)")
          :format(where, l.line, s, table.concat(names, " or "))
      else
        if not cur or #cur.desc > 0 then
          close()
          cur = { heads = {}, desc = {}, section = section }
          entries[#entries + 1] = cur
        end
        cur.heads[#cur.heads + 1] = head
      end
    end
  end
  close()
  for _, e in ipairs(entries) do
    while e.desc[#e.desc] == "" do e.desc[#e.desc] = nil end
  end
  return entries, problems, intro
end

-- A default as a Lua literal: "asym5" quoted, 1e-08 as 1e-8, {0.9, 0.999}.
local function literal(v)
  if type(v) == "string" then return ("%q"):format(v) end
  if type(v) == "number" then return (("%.10g"):format(v):gsub("e([-+])0*(%d)", "e%1%2")) end
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = literal(x) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return tostring(v)
end

-- The schema an entry's options come from: its defaults and names, or nil.
local function schema_of(spec, e)
  if not spec.defaults then return nil end
  for _, h in ipairs(e.heads) do
    local defaults, names = spec.defaults(h)
    if defaults then return defaults, names end
  end
end

function R.expand(spec, e)
  local defaults = schema_of(spec, e)
  if not defaults then return e.desc end
  local out = {}
  for i, l in ipairs(e.desc) do
    out[i] = l:gsub("opts%.([%w_]+) = {default}", function(name) return "opts." .. name .. " = " .. literal(defaults[name]) end)
  end
  return out
end

-- Problems of an entry whose options come from a schema: an option of the
-- schema it does not name (opts.<name>), a default written by hand.
local function schema_problems(spec, e, problems)
  local defaults, names = schema_of(spec, e)
  if not defaults then return end
  local text = table.concat(e.desc, "\n")
  local head = e.heads[1]
  for name, value in text:gmatch("opts%.([%w_]+) = ([^,:%s]+)") do
    if names[name] and value:sub(1, 9) ~= "{default}" then
      problems[#problems + 1] = ("%s:%d: '%s' writes the default of opts.%s (%s) by hand: write {default}, the schema's")
        :format(head.where, head.line, head.key, name, value)
    end
  end
  local list = {}
  for name in pairs(names) do list[#list + 1] = name end
  table.sort(list)
  for _, name in ipairs(list) do
    if not text:find("opts." .. name, 1, true) then
      problems[#problems + 1] = ("%s:%d: '%s' does not name its option opts.%s"):format(head.where, head.line, head.key, name)
    end
  end
end

local function find_file(modname)
  return package.searchpath(modname, package.path)
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- Every entry of a module, over its files, and the problems.
function R.load(spec)
  local entries, problems, intro = {}, {}, {}
  for _, file in ipairs(spec.files or { spec.name }) do
    local path = (spec.texts and spec.texts[file]) and file or find_file(file)
    local text = spec.texts and spec.texts[file] or (path and read(path))
    if not text then
      problems[#problems + 1] = ("%s: cannot find the file of module %s on package.path"):format(spec.name, file)
    else
      local block, err = R.extract(text, path)
      if not block then
        problems[#problems + 1] = err
      elseif block.module ~= spec.name then
        problems[#problems + 1] = ("%s:%d: the block says 'reference %s' but the module is %s")
          :format(path, block.line, block.module, spec.name)
      else
        local e, p, i = R.parse(block, setmetatable({ where = path }, { __index = spec }))
        for _, x in ipairs(e) do entries[#entries + 1] = x end
        for _, x in ipairs(p) do problems[#problems + 1] = x end
        for _, x in ipairs(i) do intro[#intro + 1] = x end
      end
    end
  end
  return entries, problems, intro
end

-- Names a strict module lists as valid (muon's lazily loaded modules).
local function strict_names(mod)
  local mt = getmetatable(mod)
  if not (mt and type(mt.__index) == "function") then return {} end
  local ok, err = pcall(function() return mod["\1"] end)
  if ok then return {} end
  local msg = type(err) == "table" and tostring(err.message or err.msg or "") or tostring(err)
  local list = msg:match("%(valid: (.-)%)")
  local names = {}
  for n in (list or ""):gmatch("[%w_]+") do names[#names + 1] = n end
  return names
end

function R.public_names(spec, mod)
  local names = {}
  if type(mod) == "table" then
    for _, k in ipairs(sorted_keys(mod, true)) do names[spec.name .. "." .. k] = true end
    for _, k in ipairs(strict_names(mod)) do names[spec.name .. "." .. k] = true end
  end
  for cname, fn in pairs(spec.classes or {}) do
    for _, n in ipairs(fn(mod)) do
      if not n:find("^_") then names[cname .. ":" .. n] = true end
    end
  end
  return names
end

-- Whether an entry's name exists: a key of the module (read raw, so that a
-- strict module's error does not count), a valid name of a strict module,
-- or a member of a class.
local function exists(spec, mod, key, class_members, strict)
  local prefix, name = key:match("^(.*)[%.:]([%w_]+)$")
  if prefix == spec.name then
    return type(mod) == "table" and (rawget(mod, name) ~= nil or strict[name]) or false
  end
  return class_members[prefix] ~= nil and class_members[prefix][name] == true
end

function R.check_module(spec, mod)
  local entries, problems = R.load(spec)
  local documented = {}
  local class_members = {}
  for cname, fn in pairs(spec.classes or {}) do
    local set = {}
    for _, n in ipairs(fn(mod)) do set[n] = true end
    class_members[cname] = set
  end
  local strict = {}
  for _, n in ipairs(strict_names(mod)) do strict[n] = true end
  for _, e in ipairs(entries) do
    schema_problems(spec, e, problems)
    for _, h in ipairs(e.heads) do
      local first = documented[h.key]
      if first then
        problems[#problems + 1] = ("%s: '%s' has two entries (%s:%d and %s:%d): keep one"):format(spec.name, h.key,
          first.where, first.line, h.where, h.line)
      end
      documented[h.key] = h
      if not exists(spec, mod, h.key, class_members, strict) then
        problems[#problems + 1] = ("%s: entry '%s' (line %d) names nothing the module has"):format(spec.name, h.key, h.line)
      end
    end
  end
  local names = R.public_names(spec, mod)
  for _, k in ipairs(sorted_keys(names)) do
    if not documented[k] then
      problems[#problems + 1] = ("%s: public name '%s' has no entry in the reference block"):format(spec.name, k)
    end
  end
  return problems
end

function R.check_all()
  local problems = {}
  for _, spec in ipairs(R.MODULES) do
    local ok, mod = pcall(require, spec.name)
    if not ok then
      problems[#problems + 1] = ("%s: cannot load: %s"):format(spec.name, tostring(mod))
    else
      for _, p in ipairs(R.check_module(spec, mod)) do problems[#problems + 1] = p end
    end
  end
  return problems
end

---------------------------------------------------------------- muon.h

-- (parsed by muon.c_header; documented above as this module's)
for _, name in ipairs({ "header_entries", "check_header", "check_header_types", "header_types", "header_items" }) do
  R[name] = CH[name]
end

R.HEADERS = {
  { name = "muon.h", title = "the public API (installed)" },
  { name = "muon_ffi.h", private = true,
    title = "private: the calls the Lua layer and the tests reach through the FFI (not installed, no stable ABI)" },
}

function R.header_path(name)
  name = name or "muon.h"
  local self = find_file("muon.reference")
  local lua_dir = self and self:match("^(.*)/muon/reference%.lua$") or "lua"
  for _, p in ipairs({ lua_dir .. "/../src/" .. name, lua_dir .. "/../../../include/" .. name }) do
    if read(p) then return p end
  end
  return nil
end

-- The headers found: a list of { spec = HEADERS' entry, path =, text = }.
local function headers()
  local list = {}
  for _, h in ipairs(R.HEADERS) do
    local path = R.header_path(h.name)
    local text = path and read(path)
    if text then list[#list + 1] = { spec = h, path = path, text = text } end
  end
  return list
end

---------------------------------------------------------------- output

local function entry_text(spec, e)
  local out = {}
  for _, h in ipairs(e.heads) do out[#out + 1] = h.text end
  for _, d in ipairs(R.expand(spec, e)) do out[#out + 1] = d end
  return table.concat(out, "\n")
end

local function uncomment(c)
  local out = {}
  for _, l in ipairs(split_lines(c)) do
    l = l:gsub("^%s*/%*+%s?", ""):gsub("%s*%*/%s*$", ""):gsub("^%s*%* ?", "")
    out[#out + 1] = l
  end
  while out[1] == "" do table.remove(out, 1) end
  while out[#out] == "" do out[#out] = nil end
  return table.concat(out, "\n")
end

local function dedent(lines)
  local min
  for _, l in ipairs(lines) do
    if l ~= "" then
      local n = #l:match("^%s*")
      min = (not min or n < min) and n or min
    end
  end
  local out = {}
  for _, l in ipairs(lines) do out[#out + 1] = l:sub((min or 0) + 1) end
  return out
end

-- Markdown text of a description line: *, _, <, > and \ escaped outside
-- `code` spans, so that formulas (m1*buf) and placeholders (<group>) show
-- as written.
local function md_escape(l)
  local parts, code = {}, false
  for piece in (l .. "`"):gmatch("(.-)`") do
    parts[#parts + 1] = code and piece or (piece:gsub("[\\%*_<>]", "\\%0"))
    code = not code
  end
  return table.concat(parts, "`")
end

function R.markdown()
  local out = { "# muon API reference", "",
    "Generated from the reference blocks at the top of the Lua modules (lua/muon/) and the comments in "
      .. "the C headers (`make reference`; `muon help NAME` prints one entry). Lua dims and indices are "
      .. "1-based, C ones 0-based.", "" }
  for _, spec in ipairs(R.MODULES) do
    local entries, _, intro = R.load(spec)
    out[#out + 1] = "## `" .. spec.name .. "`"
    out[#out + 1] = ""
    if #intro > 0 then
      for _, l in ipairs(dedent(intro)) do out[#out + 1] = md_escape(l) end
      out[#out + 1] = ""
    end
    local section
    for _, e in ipairs(entries) do
      if e.section and e.section ~= section then
        section = e.section
        out[#out + 1] = "### " .. section
        out[#out + 1] = ""
      end
      for _, h in ipairs(e.heads) do out[#out + 1] = "- `" .. h.text .. "`" end
      for _, l in ipairs(dedent(R.expand(spec, e))) do out[#out + 1] = l == "" and "" or ("  " .. md_escape(l)) end
      out[#out + 1] = ""
    end
  end
  for _, h in ipairs(headers()) do
    out[#out + 1] = "## C: `" .. h.spec.name .. "`"
    out[#out + 1] = ""
    out[#out + 1] = (h.spec.title:gsub("^%l", string.upper)) .. "."
    out[#out + 1] = ""
    local function prose(c)
      for _, l in ipairs(split_lines(uncomment(c))) do out[#out + 1] = md_escape(l) end
      out[#out + 1] = ""
    end
    local function code(t)
      out[#out + 1] = "```c"
      out[#out + 1] = t
      out[#out + 1] = "```"
    end
    for _, it in ipairs(R.header_items(h.text)) do
      if it.kind == "section" then
        out[#out + 1] = "### " .. it.text
        out[#out + 1] = ""
      elseif it.kind == "prose" then
        prose(it.text)
      elseif it.kind == "code" then
        if it.comment then prose(it.comment) end
        code(it.text)
        out[#out + 1] = ""
      else
        code(it.entry.decl)
        if it.entry.comment then prose(it.entry.comment) else out[#out + 1] = "" end
      end
    end
  end
  return table.concat(out, "\n")
end

local function text_reference()
  local out = {}
  for _, spec in ipairs(R.MODULES) do
    local entries, _, intro = R.load(spec)
    out[#out + 1] = "== " .. spec.name
    for _, l in ipairs(intro) do out[#out + 1] = l end
    for _, e in ipairs(entries) do out[#out + 1] = entry_text(spec, e) end
    out[#out + 1] = ""
  end
  for _, h in ipairs(headers()) do
    out[#out + 1] = "== C: " .. h.spec.name .. " (" .. h.path .. "): " .. h.spec.title
    for _, e in ipairs(R.header_entries(h.text)) do
      if e.comment then out[#out + 1] = e.comment end
      out[#out + 1] = e.decl
      out[#out + 1] = ""
    end
  end
  return table.concat(out, "\n")
end

-- Whether an entry head is named by name: its full key or short form, or
-- its last name segments ("add", "ns.zeropower").
local function head_named(h, name)
  if h.key == name or h.prefix .. h.sep .. h.name == name or h.prefix .. "." .. h.name == name then return true end
  local key = h.prefix .. "." .. h.name
  return #key > #name and key:sub(-#name - 1) == "." .. name
end

function R.lookup(name)
  local found = {}
  local plain_name = name:match("^[%a_][%w_]*$") ~= nil
  local options = {} -- entries that document opts.<name>
  for _, spec in ipairs(R.MODULES) do
    local entries = R.load(spec)
    for _, e in ipairs(entries) do
      local named = false
      for _, h in ipairs(e.heads) do
        if head_named(h, name) then named = true break end
      end
      if named then
        found[#found + 1] = "(" .. spec.name .. ")\n" .. entry_text(spec, e)
      elseif plain_name then
        for _, l in ipairs(e.desc) do
          if l:find("opts%." .. name .. "[^%w_]") or l:find("opts%." .. name .. "$") then
            options[#options + 1] = "(" .. spec.name .. ", option " .. name .. ")\n" .. entry_text(spec, e)
            break
          end
        end
      end
    end
  end
  for _, h in ipairs(headers()) do
    local where = h.spec.private and ("(" .. h.spec.name .. ", " .. h.spec.title .. ")\n") or ""
    for _, e in ipairs(R.header_entries(h.text)) do
      if e.name == name then
        found[#found + 1] = where .. (e.comment and (e.comment .. "\n") or "") .. e.decl
      end
    end
    for _, t in ipairs(R.header_types(h.text)) do
      if t.name == name or t.short == name then
        local head = ("(%s %s%s%s)\n"):format(h.spec.name, t.kind, t.parent and (" of " .. t.parent) or "",
          h.spec.private and (", " .. h.spec.title) or "")
        local comment = t.comment and not t.decl:find(t.comment, 1, true) and (t.comment .. "\n") or ""
        found[#found + 1] = head .. comment .. t.decl
      end
    end
  end
  for _, o in ipairs(options) do found[#found + 1] = o end
  if #found == 0 then return nil end
  return table.concat(found, "\n\n")
end

local HELP_USAGE = "usage: muon help [API | NAME | API --markdown FILE]\n"
  .. "  API                 the whole reference (Lua modules, then the C headers)\n"
  .. "  NAME                one entry: muon.tensor.zeros, Tensor:add, add, mu_engine_step, ...\n"
  .. "  API --markdown FILE the reference as Markdown (what `make reference` writes)\n"

function R.main(args)
  args = args or {}
  local what = args[1]
  if what == nil or what == "-h" or what == "--help" then
    io.stdout:write(HELP_USAGE)
    return 0
  end
  if what == "API" or what == "api" then
    if args[2] == "--markdown" then
      if not args[3] then
        io.stderr:write("muon help: --markdown needs a FILE\n" .. HELP_USAGE)
        return 2
      end
      local f, err = io.open(args[3], "wb")
      if not f then
        io.stderr:write("muon help: cannot write " .. args[3] .. ": " .. tostring(err) .. "\n")
        return 1
      end
      f:write(R.markdown(), "\n")
      f:close()
      return 0
    elseif args[2] ~= nil then
      io.stderr:write("muon help: unexpected argument '" .. tostring(args[2]) .. "'\n" .. HELP_USAGE)
      return 2
    end
    io.stdout:write(text_reference(), "\n")
    return 0
  end
  local text = R.lookup(what)
  if not text then
    io.stderr:write("muon help: no reference entry for '" .. what .. "' (try `muon help API`)\n")
    return 1
  end
  io.stdout:write(text, "\n")
  return 0
end

return R
