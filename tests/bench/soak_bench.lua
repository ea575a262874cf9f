-- Soak: 10,000 engine steps on a mixed parameter set (Muon for matrices,
-- conv-like and float64 weights; AdamW for embeddings and 1-D) with a
-- checkpoint save + load every 500 steps. Prints resident memory (VmRSS)
-- and open file descriptors after warm-up and at the end, and fails if
-- either grows (RSS by more than 8 MiB, descriptors by any).
--   luajit tests/bench/soak_bench.lua [steps] [save_every]
local T = require("muon.tensor")
local engine = require("muon.engine")

local STEPS = tonumber(arg and arg[1]) or 10000
local EVERY = tonumber(arg and arg[2]) or 500
local WARMUP = 2 * EVERY

local function rss_kib()
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("*a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)"))
end

local function fd_count()
  local p = assert(io.popen("ls /proc/" .. (function()
    local f = assert(io.open("/proc/self/stat"))
    local pid = f:read("*l"):match("^(%d+)")
    f:close()
    return pid
  end)() .. "/fd"))
  local n = 0
  for _ in p:lines() do n = n + 1 end
  p:close()
  return n - 1 -- the pipe of this popen
end

local eng = engine.new({
  groups = {
    { name = "hidden", optimizer = "muon", min_dim = 2, exclude = { "embed", "head" }, lr = 0.02,
      weight_decay = 0.01, nonfinite = "skip" },
    { name = "rest", optimizer = "adamw", lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0 },
  },
  schedule = function(step, g) return g.base_lr * (0.5 + 0.5 * math.cos(step / 1000)) end,
})
local specs = {
  { "embed", { 128, 32 } }, { "head", { 32, 128 } },
  { "layers.0.attn", { 32, 96 } }, { "layers.0.mlp.up", { 64, 32 } }, { "layers.0.mlp.down", { 32, 64 } },
  { "layers.1.attn", { 32, 96 } }, { "layers.1.mlp.up", { 64, 32 } }, { "layers.1.mlp.down", { 32, 64 } },
  { "conv.w", { 16, 1, 9 } }, { "heads.w", { 4, 8, 16 } }, { "f64.w", { 24, 24 }, "float64" },
  { "layers.0.ln", { 32 } }, { "layers.1.ln", { 32 } }, { "bias", { 64 } },
}
local grads, gsets = {}, {}
local nparams = 0
for i, s in ipairs(specs) do
  local w, g = T.randn(s[2], i, s[3]), T.zeros(s[2], s[3])
  eng:add_param(s[1], w, g)
  grads[i] = g
  gsets[i] = {}
  for k = 1, 4 do gsets[i][k] = T.randn(s[2], 1000 * k + i, s[3]):to(w:dtype()) end
  nparams = nparams + w:numel()
end

local path = os.tmpname() .. ".safetensors"
local function step(n)
  for i, g in ipairs(grads) do g:copy(gsets[i][n % 4 + 1]) end
  eng:step()
  if n % EVERY == 0 then
    eng:save(path)
    eng:load(path)
  end
end

for n = 1, WARMUP do step(n) end
collectgarbage()
local rss0, fd0, lua0 = rss_kib(), fd_count(), collectgarbage("count")
local t0 = os.clock()
local wall0 = os.time()
local samples = {}
for n = WARMUP + 1, WARMUP + STEPS do
  step(n)
  if (n - WARMUP) % (STEPS / 4) == 0 then
    samples[#samples + 1] = ("%.1f"):format(rss_kib() / 1024)
    print(("soak: step %d of %d: RSS %s MiB"):format(n - WARMUP, STEPS, samples[#samples]))
  end
end
local cpu = os.clock() - t0
collectgarbage()
local rss1, fd1, lua1 = rss_kib(), fd_count(), collectgarbage("count")
os.remove(path)

print(("soak: %d steps (+%d warm-up) on %d params (%d elements; Muon + AdamW), save+load every %d steps: %.1f s CPU, %.3f ms/step")
  :format(STEPS, WARMUP, #specs, nparams, EVERY, cpu, 1000 * cpu / STEPS))
print(("soak: RSS %.1f MiB after warm-up -> %.1f MiB at the end (%+.2f MiB); Lua heap %.0f -> %.0f KiB")
  :format(rss0 / 1024, rss1 / 1024, (rss1 - rss0) / 1024, lua0, lua1))
print("soak: RSS (MiB) every " .. STEPS / 4 .. " steps: " .. table.concat(samples, " "))
print(("soak: open file descriptors %d -> %d; wall %d s; stats: %d steps, muon skipped %d")
  :format(fd0, fd1, os.time() - wall0, eng:stats().steps, eng:stats().muon.skipped_nonfinite))
local ok = (rss1 - rss0) <= 8 * 1024 and fd1 <= fd0
print(ok and "soak: OK (constant memory, no descriptor leak)" or "soak: FAILED (memory or descriptors grew)")
if not ok then os.exit(1) end
