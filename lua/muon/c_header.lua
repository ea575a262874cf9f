-- muon.c_header: the C headers' declarations and comments as data, for
-- the API reference (muon.reference re-exports each function under its own
-- name and documents it there): the MU_API entries with the comment right
-- above each, the checks that every entry, struct field and enum has one,
-- the types and constants for lookups, and the header in order for the
-- Markdown. A line-based reader of the headers' own layout (one declaration
-- starting a line, comments in /* */), not a C parser.
local H = {}

function H.split_lines(text)
  local lines = {}
  for l in (text:gsub("\r\n", "\n") .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = l end
  if lines[#lines] == "" then lines[#lines] = nil end
  return lines
end

-- MU_API declarations (up to the ';'), with the comment that ends on the
-- line right above each.
function H.header_entries(text)
  local lines = H.split_lines(text)
  local list = {}
  local i = 1
  while i <= #lines do
    local l = lines[i]
    if l:match("^MU_API%s") then
      local decl, j = { l }, i
      while not lines[j]:find(";") and j < #lines do
        j = j + 1
        decl[#decl + 1] = lines[j]
      end
      local joined = table.concat(decl, "\n")
      local name = joined:match("([%w_]+)%s*%(")
      local comment
      local k = i - 1
      if k >= 1 and lines[k]:match("%*/%s*$") then
        local c = { lines[k] }
        while not lines[k]:find("/%*") and k > 1 do
          k = k - 1
          table.insert(c, 1, lines[k])
        end
        comment = table.concat(c, "\n")
      elseif k >= 1 and lines[k]:match("^%s*//") then
        comment = lines[k]
      end
      list[#list + 1] = { name = name, decl = joined, comment = comment, line = i }
      i = j + 1
    else
      i = i + 1
    end
  end
  return list
end

function H.check_header(text, where)
  local problems = {}
  where = where or "muon.h"
  for _, e in ipairs(H.header_entries(text)) do
    if not e.comment then
      problems[#problems + 1] = ("%s:%d: MU_API %s has no comment right above it"):format(where, e.line, tostring(e.name))
    end
  end
  return problems
end

-- Public types of a header: every field of a struct (a line ending in ';'
-- inside "typedef struct ... {" .. "}") has a comment on its line or a
-- comment ending on the line above; every enum (enum { ... }, typedef
-- enum) has a comment ending above it (macro lines that build it, starting
-- with '#' or ending in a backslash, may come between).
function H.check_header_types(text, where)
  local lines = H.split_lines(text)
  local problems = {}
  where = where or "muon.h"
  local function comment_above(i)
    local k = i - 1
    while k >= 1 and (lines[k]:match("^#") or lines[k]:match("\\%s*$")) do k = k - 1 end
    return k >= 1 and (lines[k]:match("%*/%s*$") ~= nil)
  end
  local in_struct, in_comment = nil, false
  for i, l in ipairs(lines) do
    if in_struct and in_comment then -- (a field's comment continued: not a field)
      if l:find("%*/") then in_comment = false end
    elseif in_struct then
      local open = l:find("/%*")
      if open and not l:find("%*/", open) then in_comment = true end
      if l:match("^}") then
        in_struct = nil
      elseif l:find(";") and not open and not lines[i - 1]:match("%*/%s*$") then
        problems[#problems + 1] = ("%s:%d: field '%s' of %s has no comment"):format(where, i,
          l:match("([%w_]+)%s*[%[;]") or l, in_struct)
      end
    elseif l:match("^typedef struct [%w_]* ?{") then
      in_struct = l:match("^typedef struct ([%w_]+)") or "a struct"
    elseif (l:match("^enum%s*{") or l:match("^typedef enum")) and not comment_above(i) then
      problems[#problems + 1] = ("%s:%d: enum '%s' has no comment above it"):format(where, i,
        l:match("(MU_[%w_]+)") or l)
    end
  end
  return problems
end

-- The comment ending on the line right above line i (macro lines that
-- build an enum, starting with '#' or ending in a backslash, skipped), or nil.
local function comment_above_text(lines, i)
  local k = i - 1
  while k >= 1 and (lines[k]:match("^#") or lines[k]:match("\\%s*$")) do k = k - 1 end
  if k < 1 or not lines[k]:match("%*/%s*$") then return nil end
  local c = { lines[k] }
  while not lines[k]:find("/%*") and k > 1 do
    k = k - 1
    table.insert(c, 1, lines[k])
  end
  return table.concat(c, "\n")
end

-- A member line's own comment: on its line (continued below it up to the
-- closing */), or nil.
local function inline_comment(lines, i)
  local at = lines[i]:find("/%*")
  if not at then return nil end
  local c = { lines[i]:sub(at) }
  local k = i
  while not lines[k]:find("%*/") and k < #lines do
    k = k + 1
    c[#c + 1] = lines[k]
  end
  return table.concat(c, "\n")
end

function H.header_types(text)
  local lines = H.split_lines(text)
  local items = {}
  local errors_at -- the line of "#define MU_ERRORS(X)", whose rows are the status codes
  for n, x in ipairs(lines) do
    if x:find("^#define MU_ERRORS%(X%)") then errors_at = n end
  end
  local function add(t) items[#items + 1] = t end
  local i = 1
  while i <= #lines do
    local l = lines[i]
    local sname = l:match("^typedef struct ([%w_]+) ?{")
    local ename = l:match("^typedef enum ?[%w_]* ?{")
    if sname or ename then -- a struct or enum type: its members up to the closing line
      local above = comment_above_text(lines, i)
      local j, body = i, { l }
      while j < #lines and not lines[j]:match("^}") do
        j = j + 1
        body[#body + 1] = lines[j]
      end
      local tname = lines[j]:match("^}%s*([%w_]+)") or sname
      add({ kind = sname and "struct" or "enum", name = tname, comment = above, decl = table.concat(body, "\n") })
      local prev -- (a comment on the lines above a field)
      for k = i + 1, j - 1 do
        local m = lines[k]
        local field = sname and m:match("([%w_]+)%s*[%[;]") or (not sname and m:match("^%s+(MU_[%w_]+)"))
        if m:match("^%s*/%*") and not m:match("^%s*/%*.*;") then
          prev = comment_above_text(lines, k + 1) or prev
        elseif field and not m:match("^%s*%*") and not m:match("^%s*/%*") then
          local names = sname and {} or { field }
          if sname then -- (one line may declare several: "double lo, hi;")
            local decl = m:gsub("/%*.*$", ""):gsub("%[[^%]]*%]", "")
            for f in decl:gsub("^[^,]-([%w_]+)%s*,", ",%1,"):gmatch("([%w_]+)%s*[,;]") do names[#names + 1] = f end
          end
          for _, f in ipairs(names) do
            add({ kind = sname and "field" or "constant", name = sname and (tname .. "." .. f) or f, short = f,
              parent = tname, comment = inline_comment(lines, k) or prev, decl = m })
          end
          prev = nil
        end
      end
      i = j + 1
    else
      local opaque = l:match("^typedef struct ([%w_]+) [%w_]+;")
      if opaque then add({ kind = "struct", name = opaque, comment = comment_above_text(lines, i), decl = l }) end
      if l:match("^enum%s*{.*}%s*;") then
        local above = comment_above_text(lines, i)
        for c in l:gmatch("(MU_[%w_]+)%s*=") do add({ kind = "constant", name = c, comment = above, decl = l }) end
      end
      local code = l:match("^%s*X%(([%w_]+),%s*%-?%d+,")
      if code and errors_at then -- a row of the MU_ERRORS table: a status code
        add({ kind = "constant", name = "MU_" .. code, parent = "MU_ERRORS", decl = (l:gsub("%s*\\%s*$", "")),
          comment = comment_above_text(lines, errors_at) })
      end
      i = i + 1
    end
  end
  return items
end

-- The header as a sequence for the Markdown reference: { kind = "section",
-- text } for a "/* ---- name */" divider, { kind = "prose", text } for a
-- comment that stands alone, { kind = "code", text, comment } for a type,
-- enum or macro with the comment above it, { kind = "api", entry } for an
-- MU_API declaration (header_entries' entry). The include guard and the
-- MU_API / extern "C" scaffolding are left out.
local SCAFFOLD = { "^#ifn?def ", "^#if ", "^#else", "^#endif", "^#include ", "^#define MUON_H", "^#define MUON_FFI_H",
  "^#define MU_API", "^extern \"C\"", "^}%s*$", "^#undef " }
local function scaffold(l)
  for _, p in ipairs(SCAFFOLD) do
    if l:match(p) then return true end
  end
  return false
end

-- The declarations from line i up to a blank line, a comment or an
-- MU_API (scaffolding left out): their text and the next line's index.
local function code_run(lines, i)
  local code = {}
  while i <= #lines and not lines[i]:match("^%s*$") and not lines[i]:match("^/%*")
    and not lines[i]:match("^MU_API") do
    if not scaffold(lines[i]) then code[#code + 1] = lines[i] end
    i = i + 1
  end
  return table.concat(code, "\n"), i
end

function H.header_items(text)
  local lines = H.split_lines(text)
  local apis = {}
  for _, e in ipairs(H.header_entries(text)) do apis[e.line] = e end
  local items = {}
  local i, n = 1, #lines
  local first_comment = true
  while i <= n do
    local l = lines[i]
    local title = l:match("^/%* %-%-%-+ (.-) %*/%s*$")
    if title then
      items[#items + 1] = { kind = "section", text = title }
      i = i + 1
    elseif l:match("^/%*") then
      local c = { l }
      while not lines[i]:find("%*/") and i < n do
        i = i + 1
        c[#c + 1] = lines[i]
      end
      i = i + 1
      local comment = table.concat(c, "\n")
      local nxt = lines[i] or ""
      if first_comment then
        first_comment = false
        items[#items + 1] = { kind = "prose", text = comment }
      elseif apis[i] then -- (the API entry carries this comment)
        items[#items + 1] = { kind = "api", entry = apis[i] }
        i = i + select(2, apis[i].decl:gsub("\n", "")) + 1
      elseif nxt:match("^%s*$") or nxt:match("^/%*") or scaffold(nxt) then
        items[#items + 1] = { kind = "prose", text = comment }
      else
        local code
        code, i = code_run(lines, i)
        items[#items + 1] = { kind = "code", text = code, comment = comment }
      end
    elseif apis[i] then
      local e = apis[i]
      items[#items + 1] = { kind = "api", entry = e }
      i = i + select(2, e.decl:gsub("\n", "")) + 1
    elseif l:match("^%s*$") or scaffold(l) then
      i = i + 1
    else
      local code
      code, i = code_run(lines, i)
      if code ~= "" then items[#items + 1] = { kind = "code", text = code } end
    end
  end
  return items
end

return H
