-- The roof of Newton-Schulz on this machine (`make bench`): builds and runs
-- tests/bench/ns_roof.c (in-register float32 FMA and bfloat16 dot peaks,
-- the same-run OpenBLAS sgemm and oneDNN bf16 matmul rates, Newton-Schulz
-- in float32 and bfloat16 as a fraction of each, per shape), printing each
-- line as it is measured.
--   luajit tests/bench/ns_roof_bench.lua [SHAPE ...]
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua")
local prog = B.build("ns_roof", "ns_roof_bench", "needs libdnnl-dev")
if not prog then return end
local args = {}
for i, a in ipairs(arg) do args[i] = "'" .. a:gsub("'", "") .. "'" end
local p = assert(io.popen(prog .. " " .. table.concat(args, " ") .. " 2>&1"))
for line in p:lines() do
  print(line)
  io.stdout:flush()
end
local ok = p:close()
if not ok then error("ns_roof failed") end
