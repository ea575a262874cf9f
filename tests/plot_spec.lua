-- muon.plot (`muon plot`, the demo's loss plot): CSV columns as SVG lines.
local H = require("helpers")
local plot = require("muon.plot")
local engine = require("muon.engine")
local T = H.muon.tensor

local ROOT = (debug.getinfo(1, "S").source:match("^@(.*)/tests/[^/]*$")) or "."
local MUON = ROOT .. "/" .. (os.getenv("MUON_BUILD") or "build") .. "/muon"

local function count(s, pat) return select(2, s:gsub(pat, "")) end

describe("muon.plot", function()
  local dir = H.tmpdir()
  local csv = dir .. "/loss.csv"
  H.write_file(csv, "step,a_train,a_held,b_train,b_held\n1,3,,3.2,\n2,2.5,2.6,2.9,3\n3,2,,2.7,\n4,1.5,1.8,2.5,2.6\n")

  it("reads a CSV with empty cells as nil", function()
    local d = assert(plot.read_csv(csv))
    assert.are.same({ "step", "a_train", "a_held", "b_train", "b_held" }, d.header)
    assert.are.equal(4, #d.rows)
    assert.is_nil(d.rows[1][3])
    assert.are.equal(2.6, d.rows[2][3])
  end)

  it("draws one line per series; labels sharing a first word share a color; sparse series are marked", function()
    local svg = plot.svg(assert(plot.read_csv(csv)), { title = "T & t", ylabel = "loss", smooth = 2,
      series = { { "a_train", "a train" }, { "a_held", "a held-out" }, { "b_train", "b train" }, { "b_held", "b held-out" } } })
    assert.are.equal(4, count(svg, "<polyline"))
    assert.are.equal(4, count(svg, "<circle")) -- the two held-out series' points
    H.has(svg, "a train (moving average, 2 steps)")
    H.has(svg, "a held-out (last 1.8)")
    H.has(svg, ">T &amp; t<")
    H.has(svg, ">step<")
    local colors = {}
    for c in svg:gmatch('<polyline[^>]-stroke="(#%x+)"') do colors[#colors + 1] = c end
    assert.are.equal(colors[1], colors[2])
    assert.are.equal(colors[3], colors[4])
    assert.are_not.equal(colors[1], colors[3])
    -- the moving average of a_train at step 2 is 2.75: its point lies between 3 and 2.5 on the y axis
    assert.truthy(svg:find('stroke%-dasharray="6 4" points="'), svg:sub(1, 200))
  end)

  it("names a column that is not there", function()
    local ok, err = pcall(plot.svg, assert(plot.read_csv(csv)), { series = { { "c_train", "c" } } })
    assert.is_false(ok)
    H.has(err, "plot: no column 'c_train' (columns: step, a_train, a_held, b_train, b_held)")
  end)

  it("muon plot plots a run's log (config log = { every, file }); usage errors exit 2", function()
    local log = dir .. "/run.csv"
    local eng = engine.new({ groups = { { name = "hidden", min_dim = 2 }, { name = "rest", optimizer = "adamw" } },
      log = { every = 1, file = log } })
    eng:add_param("w", T.randn({ 8, 6 }, 1), T.randn({ 8, 6 }, 2))
    eng:add_param("b", T.randn({ 8 }, 3), T.randn({ 8 }, 4))
    for _ = 1, 4 do eng:step() end
    eng.log:close()
    local out, status = require("readme").run_status(("%s plot %s --y grad_norm --y update_rms:hidden --log-y"):format(MUON,
      log))
    assert.are.equal(0, status, out)
    H.has(out, "wrote " .. dir .. "/run.svg")
    local svg = H.read_file(dir .. "/run.svg")
    assert.are.equal(2, count(svg, "<polyline"))
    H.has(svg, "(log scale)")
    out, status = require("readme").run_status(MUON .. " plot " .. log .. " --smooth x")
    assert.are.equal(2, status, out)
    H.has(out, "muon plot: --smooth needs an integer >= 1")
    out, status = require("readme").run_status(MUON .. " plot " .. log .. " --y nope")
    assert.are.equal(1, status, out)
    H.has(out, "muon plot: plot: no column 'nope'")
  end)

  teardown(function() H.rmrf(dir) end)
end)
