-- What an engine tells (its config's `log` key; MUON_LOG in the
-- environment): messages at a level, from rank 0 only as the seed's
-- logger.info_rank0 / debug_rank0, and the per-step measurements
-- (muon.step_stats) written every N steps to a file as CSV or JSON lines.
--
--   local L = require("muon.log")
--   L.check(log, trusted)              -- the config's log table, checked (raises EINVAL)
--   local lg = L.new(log, rank)        -- rank: this process's rank in the job (0 writes)
--   lg:say("info", "Reshape %s from %s to %s", ...)   -- on stderr when the level allows
--   lg:enabled("debug")                -- whether a level is shown (to skip building a message)
--   lg:due(step)                       -- whether step's stats go to the file
--   lg:row(step, values)               -- one record: values = ordered { { column, number }, ... }
--   lg:close()
local E = require("muon.errors")

local L = {}

-- The levels, quietest first; "warn" is the default.
L.LEVELS = { "error", "warn", "info", "debug" }
local RANK = {}
for i, l in ipairs(L.LEVELS) do RANK[l] = i end
L.KEYS = { every = true, file = true, format = true, level = true }

local function fail(fmt, ...) E.raise(E.EINVAL, fmt, ...) end

-- A sandboxed config's log file: a relative path below the working
-- directory (no "..", not absolute): what the host lets it write.
local function safe_path(p)
  if p:sub(1, 1) == "/" or p:sub(1, 1) == "~" then return false end
  for seg in p:gmatch("[^/]+") do
    if seg == ".." then return false end
  end
  return true
end

local function level_ok(v) return RANK[v] ~= nil end

function L.check(log, trusted)
  if type(log) ~= "table" then fail("'log' must be a table { every = N, file = path, format = 'csv' | 'jsonl', "
    .. "level = 'error' | 'warn' | 'info' | 'debug' }, got %s", E.value(log)) end
  E.check_keys(log, L.KEYS, "log key", "log")
  if log.level ~= nil and not level_ok(log.level) then
    fail("log.level must be 'error', 'warn', 'info' or 'debug', got %s", E.value(log.level))
  end
  if log.format ~= nil and log.format ~= "csv" and log.format ~= "jsonl" then
    fail("log.format must be 'csv' or 'jsonl', got %s", E.value(log.format))
  end
  if log.every ~= nil and (type(log.every) ~= "number" or log.every < 1 or log.every ~= math.floor(log.every)) then
    fail("log.every must be an integer >= 1 (steps), got %s", E.value(log.every))
  end
  if log.file ~= nil then
    if type(log.file) ~= "string" or log.file == "" then fail("log.file must be a path, got %s", E.value(log.file)) end
    if not trusted and not safe_path(log.file) then
      fail("log.file = %q: a sandboxed config writes its log below the working directory (a relative path "
        .. "without '..'); load it trusted to write elsewhere", log.file)
    end
  elseif log.every ~= nil then
    fail("log.every needs log.file (where the rows go)")
  end
end

-- The level shown: MUON_LOG when set (a level name), else the config's,
-- else "warn".
local function level_of(log)
  local env = os.getenv("MUON_LOG")
  if env and env ~= "" then
    if not level_ok(env) then
      io.stderr:write(("muon: MUON_LOG=%s is not a level (error, warn, info, debug); using warn\n"):format(env))
      return "warn"
    end
    return env
  end
  return log and log.level or "warn"
end

local Log = {}
Log.__index = Log

function L.new(log, rank)
  local self = setmetatable({ level = level_of(log), rank = rank or function() return 0 end }, Log)
  if log and log.file then
    self.file, self.every, self.format = log.file, log.every or 1, log.format or (log.file:match("%.jsonl?$") and "jsonl"
      or "csv")
  end
  return self
end

function Log:enabled(level) return RANK[level] <= RANK[self.level] and self.rank() == 0 end

function Log:say(level, fmt, ...)
  if not self:enabled(level) then return end
  local msg = select("#", ...) > 0 and fmt:format(...) or fmt
  io.stderr:write("muon: ", level == "warn" and "warning: " or (level .. ": "), msg, "\n")
end

function Log:due(step) return self.file ~= nil and step % self.every == 0 and self.rank() == 0 end

local function num(v)
  if v == nil then return "" end
  if v ~= v or v == math.huge or v == -math.huge then return tostring(v) end
  return ("%.9g"):format(v)
end

local function json_num(v)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return "null" end
  return ("%.9g"):format(v)
end

local function json_str(s) return '"' .. s:gsub('[%c"\\]', function(c) return ("\\u%04x"):format(c:byte()) end) .. '"' end

-- Append one record; the file is opened (appended to: a resumed run
-- continues it) on the first, the CSV header written when it is empty.
function Log:row(values)
  if not self.fh then
    local fh, err = io.open(self.file, "a")
    if not fh then
      E.raise(E.EIO, "log.file '%s' cannot be written: %s", self.file, tostring(err))
    end
    self.fh = fh
    if self.format == "csv" and fh:seek("end") == 0 then
      local cols = {}
      for i, v in ipairs(values) do cols[i] = v[1] end
      fh:write(table.concat(cols, ","), "\n")
    end
  end
  local parts = {}
  if self.format == "csv" then
    for i, v in ipairs(values) do parts[i] = num(v[2]) end
    self.fh:write(table.concat(parts, ","), "\n")
  else
    for i, v in ipairs(values) do parts[i] = json_str(v[1]) .. ":" .. json_num(v[2]) end
    self.fh:write("{", table.concat(parts, ","), "}\n")
  end
  self.fh:flush()
end

function Log:close()
  if self.fh then self.fh:close() end
  self.fh = nil
end

return L
