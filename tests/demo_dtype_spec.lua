-- The demo model trained with bfloat16 state (state_dtype) and bfloat16
-- Newton-Schulz (ns_dtype) ends within 0.01 nats of the float32 run; bf16
-- state holds half the bytes. A short, small run here (seconds); the
-- 300-step demo at its default size runs in `make bench`
-- (tests/bench/demo_dtype_bench.lua). Needs `make` first.
local D = require("demo_dtype")

local STEPS, HIDDEN, BATCH = 150, 64, 128

local function check(opts, only)
  local path = D.variant(opts, only)
  local f32, v, out = D.train(path, STEPS, HIDDEN, BATCH)
  os.remove(path)
  assert.is_true(math.abs(v.train - f32.train) <= 0.01, out)
  assert.is_true(math.abs(v.heldout - f32.heldout) <= 0.01, out)
  -- it trained (ln 27 = 3.30)
  assert.is_true(f32.heldout < 2.9, out)
  return f32, v
end

describe("the demo model in bfloat16", function()
  it("state_dtype = 'bfloat16': within 0.01 nats of float32 after " .. STEPS .. " steps, half the state bytes", function()
    check({ state_dtype = "bfloat16" })
    local path = D.variant({ state_dtype = "bfloat16" })
    local b16, b32 = D.state_bytes(path), D.state_bytes(D.CONFIG)
    os.remove(path)
    -- Muon: 256x128 + 256x256 momentum; AdamW: two moments of the rest
    local muon_n = 256 * 128 + 256 * 256
    local adamw_n = 27 * 16 + 256 + 256 + 27 * 256 + 27
    assert.are.equal(4 * (muon_n + 2 * adamw_n), b32)
    assert.are.equal(b32 / 2, b16)
  end)

  it("ns_dtype = 'bfloat16': within 0.01 nats of float32 after " .. STEPS .. " steps", function()
    if not D.takes("ns_dtype", "bfloat16") then
      pending("ns_dtype is not a Muon option on this build (bf16 Newton-Schulz not merged yet)")
      return
    end
    check({ ns_dtype = "bfloat16" }, "muon")
  end)
end)
