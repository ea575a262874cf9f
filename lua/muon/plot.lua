-- Line plots of a CSV file as SVG: `muon plot` (a run's log, muon.log)
-- and the demo's loss curves (examples/demo_trainer.c calls main).
--[=[ reference muon.plot
    Line plots of CSV columns against one column, as an SVG file (no
    dependency): what `muon plot` and make demo draw.
muon.plot.read_csv(path)
    { header = { names }, rows = { { number or nil per column } } } of a
    CSV file with a header line (empty or non-numeric cells are nil), or
    nil and a message.
muon.plot.svg(data, opts)
    The SVG text of data (read_csv's) plotted: opts.x = the first column
    (the x axis); opts.series = { { column, label }, ... } (default: every
    other column, labelled by name); opts.title; opts.ylabel; opts.smooth =
    1: a moving average over that many rows for the series without empty
    cells (and the range leaves out their first window); opts.log_y =
    false. Series whose labels share their first word share a color: the
    first solid, the others dashed; a series with empty cells is drawn
    through its points, each marked, its legend giving the last value.
    EINVAL naming a column that is not in the header.
muon.plot.main(args)
    `muon plot FILE.csv [--out FILE.svg] [--x COL] [--y COL[=LABEL]]...
    [--title T] [--ylabel T] [--smooth N] [--log-y]`: writes the SVG
    (default: FILE with .svg) and prints its path; returns the exit status
    (2 for a usage error).
]=]
local E = require("muon.errors")

local plot = {}

local COLORS = { "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f" }

local function split(line)
  local out = {}
  for cell in (line .. ","):gmatch("([^,]*),") do out[#out + 1] = cell end
  return out
end

function plot.read_csv(path)
  local f, err = io.open(path, "r")
  if not f then return nil, ("cannot read '%s': %s"):format(path, tostring(err)) end
  local header, rows = nil, {}
  for line in f:lines() do
    line = line:gsub("\r$", "")
    if line ~= "" then
      if not header then header = split(line)
      else
        local row = {}
        for i, c in ipairs(split(line)) do row[i] = tonumber(c) end
        rows[#rows + 1] = row
      end
    end
  end
  f:close()
  if not header then return nil, ("'%s' is empty: a CSV file with a header line is needed"):format(path) end
  return { header = header, rows = rows }
end

local function column(data, name)
  for i, h in ipairs(data.header) do
    if h == name then return i end
  end
  E.raise(E.EINVAL, "plot: no column '%s' (columns: %s)", tostring(name), table.concat(data.header, ", "))
end

local function esc(s) return (tostring(s):gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;")) end

-- A moving average over w rows (fewer at the start).
local function smooth(ys, w)
  local out, sum, n = {}, 0, 0
  for i, y in ipairs(ys) do
    sum, n = sum + y, n + 1
    if n > w then sum, n = sum - ys[i - w], w end
    out[i] = sum / n
  end
  return out
end

-- Five ticks from lo to hi, as short text.
local function tick_text(v)
  if v == 0 then return "0" end
  local a = math.abs(v)
  if a >= 1e4 or a < 1e-3 then return ("%.2g"):format(v) end
  return ((("%.4f"):format(v)):gsub("0+$", ""):gsub("%.$", ""))
end

function plot.svg(data, opts)
  opts = opts or {}
  local xi = column(data, opts.x or data.header[1])
  local series = opts.series
  if not series then
    series = {}
    for i, h in ipairs(data.header) do
      if i ~= xi then series[#series + 1] = { h, h } end
    end
  end
  local w = opts.smooth or 1
  local log_y = opts.log_y
  local lines, colors, first_word = {}, {}, {}
  local lo, hi, xmin, xmax = math.huge, -math.huge, math.huge, -math.huge
  for si, s in ipairs(series) do
    local ci = column(data, s[1])
    local xs, ys, dense = {}, {}, true
    for _, r in ipairs(data.rows) do
      local x, y = r[xi], r[ci]
      if x and y and (not log_y or y > 0) then
        xs[#xs + 1], ys[#ys + 1] = x, log_y and math.log10(y) or y
      elseif x then
        dense = false
      end
    end
    local shown = (dense and w > 1) and smooth(ys, w) or ys
    for i, y in ipairs(shown) do
      if not (dense and w > 1 and i <= w and #shown > w) then lo, hi = math.min(lo, y), math.max(hi, y) end
      xmin, xmax = math.min(xmin, xs[i]), math.max(xmax, xs[i])
    end
    local label = s[2] or s[1]
    local word = label:match("^(%S+)") or label
    if not first_word[word] then
      first_word[word] = COLORS[(#colors % #COLORS) + 1]
      colors[#colors + 1] = word
    end
    local same = 0
    for j = 1, si - 1 do if lines[j].word == word and lines[j].dense then same = same + 1 end end
    local last = ys[#ys]
    if log_y and last then last = 10 ^ last end
    lines[si] = { xs = xs, ys = shown, dense = dense, word = word, color = first_word[word], dashed = not dense or same > 0,
      label = label .. (dense and w > 1 and (" (moving average, %d steps)"):format(w) or
        (not dense and last and (" (last %.4g)"):format(last) or "")) }
  end
  if lo == math.huge then lo, hi = 0, 1 end
  if hi <= lo then lo, hi = lo - 0.5, hi + 0.5 end
  local pad = (hi - lo) * 0.05
  lo, hi = lo - pad, hi + pad
  if xmin == math.huge then xmin, xmax = 0, 1 end
  if xmax <= xmin then xmax = xmin + 1 end
  local W, Hh, L, Rm, Tm, B = 760, 460, 70, 20, 40, 55
  local pw, ph = W - L - Rm, Hh - Tm - B
  local function X(x) return L + pw * (x - xmin) / (xmax - xmin) end
  local function Y(y) return Tm + ph * (1 - (y - lo) / (hi - lo)) end
  local out = {}
  local function add(fmt, ...) out[#out + 1] = fmt:format(...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" '
    .. 'font-size="12">', W, Hh, W, Hh)
  add('<rect width="100%%" height="100%%" fill="white"/>')
  if opts.title then add('<text x="%.0f" y="22" text-anchor="middle" font-size="15">%s</text>', W / 2, esc(opts.title)) end
  for i = 0, 5 do
    local v = lo + (hi - lo) * i / 5
    local y = Y(v)
    add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>', L, y, L + pw, y)
    add('<text x="%.1f" y="%.1f" text-anchor="end">%s</text>', L - 6, y + 4, tick_text(log_y and 10 ^ v or v))
    local xv = xmin + (xmax - xmin) * i / 5
    local x = X(xv)
    add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>', x, Tm, x, Tm + ph)
    add('<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>', x, Tm + ph + 18, tick_text(xv))
  end
  add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="black"/>', L, Tm, pw, ph)
  add('<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>', L + pw / 2, Hh - 12, esc(data.header[xi]))
  if opts.ylabel or log_y then
    add('<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>', Tm + ph / 2, Tm + ph / 2,
      esc((opts.ylabel or "") .. (log_y and " (log scale)" or "")))
  end
  add('<clipPath id="plot"><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"/></clipPath>', L, Tm, pw, ph)
  for _, l in ipairs(lines) do
    local pts = {}
    for i = 1, #l.xs do pts[i] = ("%.1f,%.1f"):format(X(l.xs[i]), Y(l.ys[i])) end
    add('<polyline clip-path="url(#plot)" fill="none" stroke="%s" stroke-width="%s"%s points="%s"/>', l.color,
      l.dashed and "2" or "1.5", l.dashed and ' stroke-dasharray="6 4"' or "", table.concat(pts, " "))
    if not l.dense then
      for i = 1, #l.xs do
        add('<circle clip-path="url(#plot)" cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>', X(l.xs[i]), Y(l.ys[i]), l.color)
      end
    end
  end
  local lx, ly = L + pw - 290, Tm + 14
  add('<rect x="%.1f" y="%.1f" width="282" height="%d" fill="white" stroke="#999"/>', lx - 6, ly - 12, 18 * #lines + 6)
  for i, l in ipairs(lines) do
    local y = ly + (i - 1) * 18
    add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%s"%s/>', lx, y, lx + 26, y, l.color,
      l.dashed and "2" or "1.5", l.dashed and ' stroke-dasharray="6 4"' or "")
    add('<text x="%.1f" y="%.1f">%s</text>', lx + 32, y + 4, esc(l.label))
  end
  add("</svg>")
  return table.concat(out, "\n") .. "\n"
end

local USAGE = "usage: muon plot FILE.csv [--out FILE.svg] [--x COL] [--y COL[=LABEL]]... [--title T] [--ylabel T]\n"
  .. "                 [--smooth N] [--log-y]\n"
  .. "  Plots CSV columns (default: every one but the first) against --x (default: the first) as an SVG\n"
  .. "  (default: FILE.svg). A run's log (config log = { every = N, file = 'run.csv' }) plots as is.\n"

function plot.main(args)
  local path, opts, out = nil, { series = nil }, nil
  local i = 1
  local function value(flag)
    local v = args[i + 1]
    if v == nil then
      io.stderr:write("muon plot: " .. flag .. " needs a value\n" .. USAGE)
      return nil
    end
    i = i + 2
    return v
  end
  while i <= #args do
    local a = args[i]
    if a == "-h" or a == "--help" then
      io.write(USAGE)
      return 0
    elseif a == "--out" then out = value(a) if not out then return 2 end
    elseif a == "--x" then opts.x = value(a) if not opts.x then return 2 end
    elseif a == "--title" then opts.title = value(a) if not opts.title then return 2 end
    elseif a == "--ylabel" then opts.ylabel = value(a) if not opts.ylabel then return 2 end
    elseif a == "--smooth" then
      local v = value(a)
      opts.smooth = tonumber(v)
      if not v or not opts.smooth or opts.smooth < 1 or opts.smooth ~= math.floor(opts.smooth) then
        io.stderr:write("muon plot: --smooth needs an integer >= 1\n" .. USAGE)
        return 2
      end
    elseif a == "--y" then
      local v = value(a)
      if not v then return 2 end
      local col, label = v:match("^([^=]+)=(.*)$")
      opts.series = opts.series or {}
      opts.series[#opts.series + 1] = { col or v, label or v }
    elseif a == "--log-y" then
      opts.log_y = true
      i = i + 1
    elseif a:sub(1, 1) == "-" or path then
      io.stderr:write(("muon plot: %s '%s'\n"):format(path and "unexpected argument" or "unknown option", a) .. USAGE)
      return 2
    else
      path = a
      i = i + 1
    end
  end
  if not path then
    io.stderr:write("muon plot: missing FILE.csv\n" .. USAGE)
    return 2
  end
  local data, err = plot.read_csv(path)
  if not data then
    io.stderr:write("muon plot: " .. err .. "\n")
    return 1
  end
  local ok, svg = pcall(plot.svg, data, opts)
  if not ok then
    io.stderr:write("muon plot: " .. E.message(svg) .. "\n")
    return 1
  end
  out = out or (path:gsub("%.[^./]*$", "") .. ".svg")
  local f, ferr = io.open(out, "w")
  if not f then
    io.stderr:write(("muon plot: cannot write '%s': %s\n"):format(out, tostring(ferr)))
    return 1
  end
  f:write(svg)
  f:close()
  io.write("wrote ", out, "\n")
  return 0
end

return plot
