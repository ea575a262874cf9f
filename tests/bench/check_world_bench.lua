-- Planning one rank of a large mesh without MPI (`muon check --world`),
-- `make bench`: a GPT-like model of 10,000 parameters (d = 1024), rank 17 of
-- 4096 on replicate:2,shard:2048; target: under 1 s of CPU and 200 MB peak
-- RSS. Beside it the same parameters at world 2 (the plan's cost must not
-- grow with the world: tests/check_world_spec.lua checks that ratio, with
-- room for noise, and this file the absolute target). Then the GPT-3-like
-- shapes (tests/fixtures/gpt3_shapes.txt, configs/muon.lua: split
-- Newton-Schulz) at rank 0 of 4096: target under 2 s and 300 MB.
--   luajit tests/bench/check_world_bench.lua [params] [rounds]
local B = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua")
local n, rounds = tonumber(arg[1] or 10000), tonumber(arg[2] or 5)
local cli = (os.getenv("MUON_BUILD") or "build") .. "/muon"

local d, per = 1024, { { "attn.qkv.weight", 3072, 1024 }, { "attn.qkv.bias", 3072 }, { "attn.proj.weight", 1024, 1024 },
  { "attn.proj.bias", 1024 }, { "ln_1.weight", 1024 }, { "ln_1.bias", 1024 }, { "mlp.fc.weight", 4096, 1024 },
  { "mlp.fc.bias", 4096 }, { "mlp.proj.weight", 1024, 4096 }, { "mlp.proj.bias", 1024 }, { "ln_2.weight", 1024 },
  { "ln_2.bias", 1024 } }
local lines, layer = { ("embed.wte 50304 %d"):format(d), ("embed.wpe 2048 %d"):format(d) }, 0
while #lines < n do
  for _, t in ipairs(per) do
    if #lines < n then lines[#lines + 1] = ("h.%d.%s %s"):format(layer, t[1], table.concat({ unpack(t, 2) }, " ")) end
  end
  layer = layer + 1
end
local shapes = os.tmpname()
local f = assert(io.open(shapes, "w"))
f:write(table.concat(lines, "\n"), "\n")
f:close()

-- CPU seconds (user + system) and peak RSS (kB) of one plan.
local function plan(args)
  local tv = os.tmpname()
  os.execute(("/usr/bin/time -o %s -f 'cpu %%U %%S rss %%M' %s check %s >/dev/null"):format(tv, cli, args))
  local out = assert(io.open(tv)):read("*a")
  os.remove(tv)
  local u, s, rss = out:match("cpu ([%d.]+) ([%d.]+) rss (%d+)")
  assert(u, out)
  return tonumber(u) + tonumber(s), tonumber(rss)
end

local gpt = "configs/moonlight.lua --params " .. B.sh(shapes)
local cases = { { "world 2", gpt .. " --world 2 --rank 1 --mesh replicate:2" },
  { "world 4096", gpt .. " --world 4096 --rank 17 --mesh replicate:2,shard:2048" },
  { "GPT-3 split", "configs/muon.lua --params tests/fixtures/gpt3_shapes.txt --world 4096 --rank 0 "
    .. "--mesh replicate:2,shard:2048" } }
local cpu, rss = { {}, {}, {} }, { 0, 0, 0 }
for _ = 1, rounds do -- (interleaved rounds)
  for i, c in ipairs(cases) do
    local t, m = plan(c[2])
    cpu[i][#cpu[i] + 1] = t
    rss[i] = math.max(rss[i], m)
  end
end
os.remove(shapes)
for i = 1, 2 do
  print(("%-10s %d parameters: median %.2f s of CPU, peak RSS %.0f MB (%d rounds)")
    :format(cases[i][1], n, B.median(cpu[i]), rss[i] / 1024, rounds))
end
local ok = B.median(cpu[2]) < 1 and rss[2] < 200 * 1024
print(("rank 17 of 4096 / rank 1 of 2: %.2f; target under 1 s and 200 MB: %s")
  :format(B.median(cpu[2]) / B.median(cpu[1]), ok and "met" or "MISSED"))
local split_ok = B.median(cpu[3]) < 2 and rss[3] < 300 * 1024
print(("GPT-3-like shapes, rank 0 of 4096, split Newton-Schulz: median %.2f s of CPU, peak RSS %.0f MB; "
  .. "target under 2 s and 300 MB: %s"):format(B.median(cpu[3]), rss[3] / 1024, split_ok and "met" or "MISSED"))
