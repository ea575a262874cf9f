-- The demo model (examples/demo_trainer.c, configs/muon.lua) trained with a
-- variant of the Muon config (state_dtype or ns_dtype = "bfloat16" in its
-- groups) beside the float32 config, from the same seed and batches: one
-- demo_trainer run whose first run is configs/muon.lua and whose second
-- ("adamw" in its table) is the variant at Muon's lr_scale. Shared by
-- tests/demo_dtype_spec.lua (a short run) and tests/bench/demo_dtype_bench.lua
-- (the 300-step demo).
local H = require("helpers")
local engine = require("muon.engine")

local D = {}

local ROOT = H.root
local BUILD = os.getenv("MUON_BUILD") or "build"
D.TRAINER = ROOT .. "/" .. BUILD .. "/examples/demo_trainer"
D.CONFIG = ROOT .. "/configs/muon.lua"

-- configs/muon.lua with `opts` (name -> string value) set in its groups of
-- optimizer `only` (nil: both groups), written to a temporary file; returns
-- its path.
function D.variant(opts, only)
  local text = H.read_file(D.CONFIG)
  local extra = {}
  local names = {}
  for k in pairs(opts) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do extra[#extra + 1] = ("%s = %q,"):format(k, opts[k]) end
  local n
  text, n = text:gsub('(optimizer = "(%a+)",)', function(s, kind)
    if only == nil or kind == only then return s .. " " .. table.concat(extra, " ") end
  end)
  assert(n == 2, "configs/muon.lua: expected two groups with optimizer = \"...\"")
  return H.config_file(text)
end

-- Whether a Muon group takes option `name` with value `value` on this build.
function D.takes(name, value)
  local ok, err = pcall(engine.new, { groups = { { optimizer = "muon", [name] = value } } })
  return ok or not tostring(err):find("unexpected keyword arguments: " .. name .. ";", 1, true), err
end

-- Trains the float32 config and the variant (path) for `steps`; returns
-- { train, heldout } of each and the trainer's output.
function D.train(variant, steps, hidden, batch)
  local out_dir = H.tmpname("")
  local cmd = ("%s --steps %d --hidden %d --batch %d --adamw-config %s --adamw-lr-scale 0.5 --eval-every %d "
    .. "--print-every %d --out %s 2>&1"):format(D.TRAINER, steps, hidden, batch, variant, steps, steps, out_dir)
  local f = io.popen(cmd)
  local out = f:read("*a")
  f:close()
  os.execute("rm -rf '" .. out_dir .. "'")
  local function row(run)
    local tr, ho = out:match("\n" .. run .. "%s+%S+%s+([%d%.]+)%s+([%d%.]+)")
    assert(tr, "demo_trainer output has no final row for " .. run .. ":\n" .. out)
    return { train = tonumber(tr), heldout = tonumber(ho) }
  end
  return row("muon"), row("adamw"), out
end

-- state_bytes of an engine of config (path) over the demo's parameters
-- (examples/demo_shapes.txt) after one step.
function D.state_bytes(config)
  local T = H.T
  local eng = engine.new(config)
  local seed = 0
  for line in io.lines(ROOT .. "/examples/demo_shapes.txt") do
    local name, dims = line:match("^([%w%._]+)%s+([%d%s]+)$")
    if name then
      local shape = {}
      for d in dims:gmatch("%d+") do shape[#shape + 1] = tonumber(d) end
      seed = seed + 1
      eng:add_param(name, T.randn(shape, seed), T.randn(shape, seed + 100))
    end
  end
  eng:step()
  return eng:memory().state_bytes
end

return D
