-- The demo model (`make demo`: 300 steps at its default size) trained with
-- configs/muon.lua in float32 and again with state_dtype = "bfloat16" (both
-- groups) and with ns_dtype = "bfloat16" (the Muon group; "n/a" until the
-- build has the option): final train and held-out losses, their
-- differences from float32 (the issue asks <= 0.01 nats), and state_bytes
-- over examples/demo_shapes.txt's parameters.
--   luajit tests/bench/demo_dtype_bench.lua [STEPS]
local D = require("demo_dtype")

local steps = tonumber(arg[1]) or 300
local HIDDEN, BATCH = 384, 512 -- demo_trainer's defaults

print(("demo model, %d steps, hidden %d, batch %d (same seed and batches)"):format(steps, HIDDEN, BATCH))
print(("%-26s %8s %9s %9s %9s %12s"):format("variant", "train", "held-out", "d train", "d held", "state_bytes"))
local bytes32 = D.state_bytes(D.CONFIG)
local fail = false
local variants = {
  { "state_dtype = bfloat16", { state_dtype = "bfloat16" } },
  { "ns_dtype = bfloat16", { ns_dtype = "bfloat16" }, "muon" },
}
local printed32 = false
for _, v in ipairs(variants) do
  local name, opts, only = v[1], v[2], v[3]
  local opt = next(opts)
  if not D.takes(opt, opts[opt]) then
    print(("%-26s %8s %9s %9s %9s %12s"):format(name, "n/a", "n/a", "n/a", "n/a", "n/a"))
  else
    local path = D.variant(opts, only)
    local f32, r = D.train(path, steps, HIDDEN, BATCH)
    local bytes = D.state_bytes(path)
    os.remove(path)
    if not printed32 then
      print(("%-26s %8.4f %9.4f %9s %9s %12d"):format("float32 (configs/muon.lua)", f32.train, f32.heldout, "", "", bytes32))
      printed32 = true
    end
    local dt, dh = r.train - f32.train, r.heldout - f32.heldout
    print(("%-26s %8.4f %9.4f %+9.4f %+9.4f %12d"):format(name, r.train, r.heldout, dt, dh, bytes))
    if math.abs(dt) > 0.01 or math.abs(dh) > 0.01 then
      print("  FAIL: more than 0.01 nats from float32")
      fail = true
    end
  end
end
if fail then os.exit(1) end
