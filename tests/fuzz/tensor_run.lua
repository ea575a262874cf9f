-- make fuzz (target "tensor"): the tensor view fuzzer (tests/fuzz/tensor_fuzz.lua)
-- for a time budget, on the ASan + UBSan library. Args: seconds [seed].
-- Prints the seed, so a finding replays with the same seed.
local F = require("tensor_fuzz")
local seconds = tonumber(arg[1]) or 60
local seed = tonumber(arg[2]) or os.time() % 2147483646
local total = { ops = 0, accepted = 0, rejected = 0 }
local deadline = os.clock() + seconds
local runs = 0
while os.clock() < deadline do
  local s = seed + runs
  local ok, res = pcall(F.run, { seed = s, iterations = 5000, seconds = deadline - os.clock() })
  if not ok then
    io.stderr:write("FUZZ FINDING (replay: luajit tests/fuzz/tensor_run.lua 5 ", s, "): ", tostring(res), "\n")
    os.exit(1)
  end
  for k, v in pairs(res) do total[k] = total[k] + v end
  runs = runs + 1
end
print(("tensor fuzz: seeds %d..%d, %d ops (%d accepted, %d rejected cleanly)"):format(seed, seed + runs - 1,
  total.ops, total.accepted, total.rejected))
print("stat::number_of_executed_units: " .. total.ops)
