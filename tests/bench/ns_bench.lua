-- Newton-Schulz benchmark (`make bench`): per shape, in one run, ms per
-- call (median of interleaved rounds) of our standard iteration (symmetric
-- and plain paths), the Gram iteration and auto (ns_method "auto": which one
-- it picks) in float32, and standard and auto in bfloat16 (dtype =
-- "bfloat16"; "n/a" on a build without it); the seed's function in torch
-- (tests/bench/ns_torch.py, 2 threads, same OpenBLAS core) in float32 and in
-- bfloat16 as the seed runs it; the same-run rates of OpenBLAS sgemm and of
-- torch's bf16 matmul (oneDNN) on the iteration's largest product; the
-- ratios seed/ours; max abs errors from the float64 standard iteration. The
-- first lines name the CPU, its AVX512_BF16/AMX flags and the libraries.
-- Then the same shapes again while a competing 2-thread load runs (two busy
-- processes this bench starts and stops; MU_BENCH_LOAD=0 skips it): ours
-- and the seed's in float32 and bfloat16, interleaved, and their ratios.
--   luajit tests/bench/ns_bench.lua [SHAPE ...]   (SHAPE like 768x768, 12x768x768)
-- Ours runs MU_NS_THREADS workers when set, else one per OpenBLAS thread;
-- every BLAS call is single-threaded and its tiles are fixed by the shape,
-- so the results are the same bits whatever the worker count.
local ffi = require("ffi")
local muon = require("muon")
local T = muon.tensor
local ns = require("muon.ns")

ffi.cdef [[
void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
]]
local now = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/lib.lua").now

-- The library links OpenBLAS; its symbols resolve through the loaded copy.
local blas = ffi.load("libopenblas.so.0")

local function H_max_abs_diff(a, b)
  local d = T.sub(a:to("float64"), b):abs()
  return d:amax()
end

local STEPS = 5
-- (issue 19's shapes; others on the command line, e.g. 4096x4096 1024x2048 6x768x3072)
local SHAPES = { "768x768", "2048x2048", "768x3072", "3072x768", "1024x4096", "12x768x768" }
if #arg > 0 then SHAPES = arg end

local function parse(s)
  local t = {}
  for v in s:gmatch("%d+") do t[#t + 1] = tonumber(v) end
  return t
end

-- Medians (seconds) of the functions fns[k], timed in interleaved rounds
-- (one call of each per round) after a warm-up; rounds adapt to the budget.
-- A function that returns a number has timed itself (seconds): the torch
-- calls, which exclude the pipe.
local function timed(fn)
  local t0 = now()
  local t = fn()
  return type(t) == "number" and t or now() - t0
end
local function median_times(fns, budget)
  local first = 0
  for _, fn in ipairs(fns) do first = first + timed(fn) end
  local rounds = math.max(first > 12 and 2 or 3, math.min(9, math.floor(budget / math.max(first, 1e-6))))
  local times = {}
  for k = 1, #fns do times[k] = {} end
  for i = 1, rounds do
    for k, fn in ipairs(fns) do times[k][i] = timed(fn) end
  end
  local med, best = {}, {}
  for k = 1, #fns do
    table.sort(times[k])
    med[k] = times[k][math.floor(rounds / 2) + 1]
    best[k] = times[k][1]
  end
  return med, best, rounds
end

-- Median seconds of fn(), with a warm-up; runs adapt to a per-item budget.
local function median_time(fn, budget)
  local t0 = now()
  fn()
  local first = now() - t0
  local runs = math.max(first > 3 and 2 or 3, math.min(7, math.floor((budget or 1.5) / math.max(first, 1e-6))))
  local times = {}
  for i = 1, runs do
    t0 = now()
    fn()
    times[i] = now() - t0
  end
  table.sort(times)
  return times[math.floor(runs / 2) + 1], runs
end

-- Standalone sgemm rate (flop/s) on the shape of NS's largest product
-- (n x n) * (n x m), measured in this run.
local sgemm_rate_cache = {}
local function sgemm_rate(n, m)
  local key = n .. "x" .. m
  if sgemm_rate_cache[key] then return sgemm_rate_cache[key] end
  local a, b, c = T.randn({ n, n }, 3), T.randn({ n, m }, 4), T.zeros({ n, m })
  local pa, pb, pc = a:ptr(), b:ptr(), c:ptr()
  local t = median_time(function()
    blas.cblas_sgemm(101, 111, 111, n, m, n, 1, pa, n, pb, m, 0, pc, m)
  end, 0.5)
  local rate = 2 * n * n * m / t
  sgemm_rate_cache[key] = rate
  return rate
end

-- The seed's function in torch, served by one python process
-- (ns_torch.py --serve) that reads requests from a FIFO: server.call(shape,
-- kind) runs one call ("f32", "bf16" or "gemm") and returns its seconds, so
-- that torch runs in the same interleaved rounds as ours. nil + reason when
-- /usr/bin/python3 has no torch.
local function torch_server()
  local py = "/usr/bin/python3"
  local f = io.open(py, "r")
  if not f then return nil, "no /usr/bin/python3" end
  f:close()
  local ok = os.execute(py .. " -c 'import torch' >/dev/null 2>&1")
  if ok ~= 0 and ok ~= true then return nil, "python3 cannot import torch" end
  local dir = (debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$")) or "tests/bench"
  local fifo = os.tmpname()
  os.remove(fifo)
  if os.execute("mkfifo '" .. fifo .. "'") ~= 0 then return nil, "mkfifo failed" end
  -- Same OpenBLAS core as ours (Debian's torch uses the system OpenBLAS).
  local core = muon.blas_info().core
  local p = io.popen(("OPENBLAS_CORETYPE=%s %s %s/ns_torch.py --serve < '%s' 2>&1"):format(core, py, dir, fifo))
  local w = assert(io.open(fifo, "w"))
  local first = p:read("*l") or ""
  local versions = first:match("^# (torch .*)$")
  if not versions then
    w:close()
    p:close()
    os.remove(fifo)
    return nil, "torch failed: " .. first
  end
  local server = { versions = versions }
  function server.call(shape, kind)
    w:write(shape, " ", kind, "\n")
    w:flush()
    local line = p:read("*l")
    local ms = tonumber(line or "")
    if not ms then error("ns_torch.py --serve: " .. tostring(line)) end
    return ms * 1e-3
  end
  function server.close()
    w:close()
    p:close()
    os.remove(fifo)
  end
  return server
end

-- Whether this build's Newton-Schulz takes dtype = "bfloat16", and how the
-- bench calls it: zeropower_into with a float32 or a bfloat16 workspace,
-- or none ("none"), or else ns.zeropower itself ("call").
local function bf16_support()
  local x, out = T.randn({ 8, 12 }, 1), T.zeros({ 8, 12 })
  local o = { steps = STEPS, variant = "asym5", dtype = "bfloat16" }
  local ok, ro = pcall(ns.resolve, o)
  if ok then
    for _, dt in ipairs({ "float32", "bfloat16" }) do
      local okw, ws = pcall(ns.workspace, dt, 8, 12)
      if okw and pcall(ns.zeropower_into, out, x, ro, ws) then return dt end
    end
    if pcall(ns.zeropower_into, out, x, ro, nil) then return "none" end
  end
  local okc, err = pcall(ns.zeropower, x, o)
  if okc then return "call" end
  return nil, tostring(err)
end

local info = muon.blas_info()
local workers = math.min(16, info.threads) -- MU__NS_MAX_SLOTS in src/ns.c
local env_workers = tonumber(os.getenv("MU_NS_THREADS") or "")
if env_workers and env_workers >= 1 and env_workers == math.floor(env_workers) then
  workers = math.min(16, env_workers)
end
local cpu, flags = "?", {}
local f = io.open("/proc/cpuinfo")
if f then
  for line in f:lines() do
    local v = line:match("^model name%s*:%s*(.-)%s*$")
    if v and cpu == "?" then cpu = v end
    local fl = line:match("^flags%s*:%s*(.-)%s*$")
    if fl and next(flags) == nil then
      for w in fl:gmatch("%S+") do flags[w] = true end
    end
  end
  f:close()
end
local bf16_ws, bf16_why = bf16_support()
print(("CPU %s; AVX512_BF16 %s, AMX %s; OpenBLAS core %s, %d threads; NS workers %d; %d steps, asym5"):format(cpu,
  flags.avx512_bf16 and "yes" or "no", (flags.amx_bf16 or flags.amx_tile) and "yes" or "no", info.core, info.threads,
  workers, STEPS))
print(("libraries: %s; %s; muon bf16 Newton-Schulz: %s"):format(info.config, jit.version,
  bf16_ws and "yes" or ("n/a (" .. tostring(bf16_why) .. ")")))

local torch, why = torch_server()
if torch then print("torch: " .. torch.versions .. " (the seed's function; bf16 matmuls on oneDNN)") end

local function ms(v) return v and ("%.1f"):format(v * 1e3) or "n/a" end
local function ratio(a, b) return (a and b) and ("%.2f"):format(a / b) or "n/a" end
local function tms(row, k) return row.res["seed " .. k] end

-- Each shape's two rows are printed as soon as it is measured: float32,
-- then bfloat16 (its columns under the second header line).
local F32 = "%-11s %8s %8s %8s %8s %8s %9s %9s %8s %8s %10s %9s %9s %8s"
local B16 = "%-11s %8s %8s %8s %8s %9s %9s %11s %11s %10s %8s %8s %8s %8s"
local function print_row(row)
  local r = row.res
  print(F32:format(row.s, ms(r.standard),
    ms(r.plain), ms(r.gram), ms(r.auto), row.pick, ms(tms(row, "f32")), ("%.0f"):format(row.sgemm / 1e9),
    ("%.2f"):format(r.standard / r.gram), ("%.2f"):format(row.model), ("%.2f"):format(r.standard / r.auto),
    ("%.2f (%d)"):format(row.min.standard / row.min.auto, row.rounds),
    ratio(tms(row, "f32"), r.auto), row.err and ("%.1e"):format(row.err) or "-"))
  local gf = r["bf16 auto"] and row.flops16 / r["bf16 auto"] or nil
  print(B16:format("  bf16", ms(r["bf16 standard"]),
    ms(r["bf16 gram"]), ms(r["bf16 auto"]), row.pick16, ms(tms(row, "bf16")), ms(tms(row, "f32")),
    ratio(tms(row, "bf16"), r["bf16 standard"]), ratio(tms(row, "bf16"), r["bf16 auto"]),
    ratio(tms(row, "bf16"), r.auto), row.gemm and ("%.0f"):format(row.gemm / 1e9) or "n/a",
    gf and ("%.0f"):format(gf / 1e9) or "n/a", ratio(gf, row.gemm), row.err16 and ("%.1e"):format(row.err16) or "-"))
end
print()
print("ms; ratios same run. float32 columns:")
print(F32:format("shape", "std", "plain", "gram", "auto",
  "auto", "seed f32", "sgemm GF", "std/gram", "model", "std/auto", "(best of)", "seed/auto", "err"))
print("bfloat16 columns (the second line of each shape):")
print(B16:format("", "std", "gram", "auto", "auto",
  "seed bf16", "seed f32", "seed16/std", "seed16/auto", "seed16/f32", "mm GF", "auto GF", "auto/mm", "err"))
-- Without bf16 kernels (below AVX-512) oneDNN has no bf16 matmul: torch's
-- falls back to a scalar loop (minutes per large call) and ours widens to
-- sgemm; comparing them says nothing, so the seed's bf16 runs are skipped.
local seed16 = torch and not info.bf16:find("no bf16 kernels", 1, true)
if torch and not seed16 then print("seed bf16: n/a (no bf16 kernels on this CPU: " .. info.bf16 .. ")") end

-- One run per shape: ours and the seed's in interleaved rounds, then the
-- same-run sgemm and bf16 gemm rates.
local METHODS = { "standard", "plain", "gram", "auto" }
local BF16 = { "standard", "gram", "auto" }
local rows = {}
for _, s in ipairs(SHAPES) do
  local shape = parse(s)
  local b = #shape == 3 and shape[1] or 1
  local r, c = shape[#shape - 1], shape[#shape]
  local n, m = math.min(r, c), math.max(r, c)
  local x = T.randn(shape, 1)
  local out = T.zeros(shape)
  local ws = ns.workspace("float32", r, c)
  local opts = {
    standard = { steps = STEPS, variant = "asym5" },
    plain = { steps = STEPS, variant = "asym5", path = "plain" },
    gram = { steps = STEPS, variant = "asym5", method = "gram" },
    auto = { steps = STEPS, variant = "asym5", method = "auto" },
  }
  local fns, labels = {}, {}
  for _, name in ipairs(METHODS) do
    local ro = ns.resolve(opts[name])
    fns[#fns + 1] = function() ns.zeropower_into(out, x, ro, ws) end
    labels[#labels + 1] = name
  end
  local bws = (bf16_ws == "float32" or bf16_ws == "bfloat16") and ns.workspace(bf16_ws, r, c) or nil
  if bf16_ws then
    for _, name in ipairs(BF16) do
      local o = {}
      for k, v in pairs(opts[name]) do o[k] = v end
      o.dtype = "bfloat16"
      if bf16_ws == "call" then
        fns[#fns + 1] = function() ns.zeropower(x, o) end
      else
        local ro = ns.resolve(o)
        fns[#fns + 1] = function() ns.zeropower_into(out, x, ro, bws) end
      end
      labels[#labels + 1] = "bf16 " .. name
    end
  end
  if torch then
    for _, kind in ipairs({ "f32", "bf16" }) do
      if kind == "f32" or seed16 then
        fns[#fns + 1] = function() return torch.call(s, kind) end
        labels[#labels + 1] = "seed " .. kind
      end
    end
  end
  local med, best, rounds = median_times(fns, 12.0)
  local res, min = {}, {}
  for k, name in ipairs(labels) do res[name], min[name] = med[k], best[k] end
  -- accuracy against the float64 standard iteration (same input; skipped
  -- above 2048x2048, where float64 takes long)
  local err, err16
  if b * n * m <= 2048 * 2048 then
    local ref = ns.zeropower(x:to("float64"), opts.standard)
    err = H_max_abs_diff(ns.zeropower(x, opts.auto), ref)
    if bf16_ws then
      err16 = H_max_abs_diff(ns.zeropower(x, { steps = STEPS, variant = "asym5", method = "auto", dtype = "bfloat16" }),
        ref)
    end
  end
  -- the cost model (muon.ns.cost): standard flops / gram flops, and the
  -- flops bfloat16 auto performs (its rate against torch's bf16 matmul)
  local model = ns.cost(r, c, opts.standard) / ns.cost(r, c, opts.gram)
  local flops16 = b * ns.cost(r, c, { steps = STEPS, variant = "asym5", method = "auto", dtype = "bfloat16" })
  local gemm
  if seed16 then
    local g = {}
    torch.call(s, "gemm")
    for i = 1, 5 do g[i] = torch.call(s, "gemm") end
    table.sort(g)
    gemm = 2 * n * n * m / g[3]
  end
  rows[#rows + 1] = { s = s, res = res, gemm = gemm, pick = ns.method_for(r, c, opts.auto), sgemm = sgemm_rate(n, m),
    err = err, err16 = err16, model = model, min = min, rounds = rounds, flops16 = flops16,
    pick16 = ns.method_for(r, c, { steps = STEPS, variant = "asym5", method = "auto", dtype = "bfloat16" }), x = x,
    out = out, ws = ws, bws = bws }
  print_row(rows[#rows])
end

-- The same shapes under a competing 2-thread load: two busy processes,
-- started and stopped here (only their own pids are killed).
local function start_load()
  local p = io.popen("for i in 1 2; do luajit -e 'while true do end' >/dev/null 2>&1 & echo $!; done")
  local pids = {}
  for line in p:lines() do pids[#pids + 1] = tonumber(line) end
  p:close()
  return pids
end
local function stop_load(pids)
  for _, pid in ipairs(pids) do os.execute("kill " .. pid .. " 2>/dev/null") end
end
local loaded = os.getenv("MU_BENCH_LOAD") ~= "0"
if loaded then
  print()
  print("under a competing 2-thread load (ms; ratios same run; each row as measured)")
  local LOADED = "%-11s %8s %9s %10s %8s %9s %11s"
  print(LOADED:format("shape", "auto", "seed f32", "seed32/auto", "bf16", "seed bf16", "seed16/bf16"))
  local pids = start_load()
  local ok, err = pcall(function()
    for _, row in ipairs(rows) do
      local fns, labels = {}, {}
      local auto = ns.resolve({ steps = STEPS, variant = "asym5", method = "auto" })
      fns[1], labels[1] = function() ns.zeropower_into(row.out, row.x, auto, row.ws) end, "auto"
      if bf16_ws and bf16_ws ~= "call" then
        local a16 = ns.resolve({ steps = STEPS, variant = "asym5", method = "auto", dtype = "bfloat16" })
        fns[#fns + 1] = function() ns.zeropower_into(row.out, row.x, a16, row.bws) end
        labels[#labels + 1] = "bf16 auto"
      end
      if torch then
        for _, kind in ipairs({ "f32", "bf16" }) do
          if kind == "f32" or seed16 then
            fns[#fns + 1] = function() return torch.call(row.s, kind) end
            labels[#labels + 1] = "seed " .. kind
          end
        end
      end
      local med = median_times(fns, 8.0)
      local l = {}
      for k, name in ipairs(labels) do l[name] = med[k] end
      row.loaded = l
      print(LOADED:format(row.s, ms(l.auto), ms(l["seed f32"]), ratio(l["seed f32"], l.auto),
        ms(l["bf16 auto"]), ms(l["seed bf16"]), ratio(l["seed bf16"], l["bf16 auto"])))
    end
  end)
  stop_load(pids)
  if not ok then error(err, 0) end
end

if torch then torch.close() end

print("sgemm GF: this run's standalone OpenBLAS sgemm rate on the (n x n)(n x m) product (n = smaller dim);")
print("mm GF: torch's bf16 matmul (oneDNN) on the same product; auto GF: bfloat16 auto in the flops it performs")
print("(muon.ns.cost), auto/mm its fraction of mm GF. seed f32 / seed bf16: the seed's function in torch on")
print("float32 / bfloat16 input (2 threads). seed16/f32: seed bf16 over our float32 auto.")
print("model: standard / gram flops of the cost model (auto picks gram when model > 1.15 and n >= 64).")
print("ms: medians of interleaved rounds (ours and the seed's, one call each per round); (best of): std/auto of")
print("the fastest round of each, and the rounds.")
print("err: max abs difference of auto's result (float32 / bfloat16) from the float64 standard iteration.")
if not torch then print("torch: n/a (" .. tostring(why) .. ")") end
if not bf16_ws then print("bfloat16 columns: n/a (" .. tostring(bf16_why) .. ")") end

-- Targets. Issue 3: symmetric >= 1.25x plain on the big/batched shapes;
-- >= 1.4x faster than the seed's float32 torch function on every shape.
-- Issue 12: auto >= 1.4x the standard iteration and >= 2.0x torch float32 on
-- the aspect-4 shapes, within 1e-5 of float64; auto no slower than standard
-- (>= 0.98) on square shapes. Issue 19: bfloat16 auto >= 1.6x the seed's
-- bf16 function on the aspect-4 shapes, >= 1.3x on 768^2, 2048^2,
-- 12x768^2; a lone 768x768 float32 auto no slower than torch float32.
-- Issue 30: those six >= 1.0x under a competing 2-thread load; bfloat16
-- auto at 768x3072 and 2048x2048 >= 80% of the same-run bf16 matmul rate.
local ASPECT4 = { ["768x3072"] = true, ["3072x768"] = true, ["1024x4096"] = true }
local SQUAREISH = { ["768x768"] = true, ["2048x2048"] = true, ["12x768x768"] = true }
local ROOF = { ["768x3072"] = true, ["2048x2048"] = true }
local bad = { sym = {}, torch = {}, auto = {}, auto_torch = {}, square = {}, err = {}, b16a = {}, b16s = {}, lone = {},
  b16l = {}, roof = {} }
local ran = {}
for _, row in ipairs(rows) do
  local r = row.res
  ran[row.s] = true
  local big = ({ ["2048x2048"] = true, ["4096x4096"] = true, ["12x768x768"] = true })[row.s]
  if big and r.plain / r.standard < 1.25 then bad.sym[#bad.sym + 1] = row.s end
  local t32, t16 = tms(row, "f32"), tms(row, "bf16")
  if t32 and t32 / r.auto < 1.4 then bad.torch[#bad.torch + 1] = row.s end
  if ASPECT4[row.s] then
    if r.standard / r.auto < 1.4 then bad.auto[#bad.auto + 1] = row.s end
    if t32 and t32 / r.auto < 2.0 then bad.auto_torch[#bad.auto_torch + 1] = row.s end
    if row.err and row.err > 1e-5 then bad.err[#bad.err + 1] = row.s end
    if t16 and r["bf16 auto"] and t16 / r["bf16 auto"] < 1.6 then bad.b16a[#bad.b16a + 1] = row.s end
  end
  if SQUAREISH[row.s] and t16 and r["bf16 auto"] and t16 / r["bf16 auto"] < 1.3 then bad.b16s[#bad.b16s + 1] = row.s end
  local l = row.loaded
  if l and l["seed bf16"] and l["bf16 auto"] and l["seed bf16"] / l["bf16 auto"] < 1.0 then
    bad.b16l[#bad.b16l + 1] = row.s
  end
  if ROOF[row.s] and row.gemm and r["bf16 auto"] and row.flops16 / r["bf16 auto"] < 0.8 * row.gemm then
    bad.roof[#bad.roof + 1] = row.s
  end
  if row.s == "768x768" and t32 and t32 / r.auto < 1.0 then bad.lone[#bad.lone + 1] = row.s end
  local shape = parse(row.s)
  if shape[#shape] == shape[#shape - 1] and r.standard / r.auto < 0.98 then bad.square[#bad.square + 1] = row.s end
end
local function verdict(list, shapes)
  local any = shapes == nil
  for s in pairs(shapes or {}) do any = any or ran[s] end
  if not any then return "n/a (shapes not run)" end
  return #list == 0 and "met" or ("NOT met on " .. table.concat(list, ", "))
end
print("target plain/std >= 1.25 (2048^2, 4096^2, 12x768^2): "
  .. verdict(bad.sym, { ["2048x2048"] = true, ["4096x4096"] = true, ["12x768x768"] = true }))
print("target std/auto >= 1.4 (768x3072, 3072x768, 1024x4096): " .. verdict(bad.auto, ASPECT4))
print("target err <= 1e-5 (768x3072, 3072x768, 1024x4096): " .. verdict(bad.err, ASPECT4))
print("target std/auto >= 0.98 (square shapes): " .. verdict(bad.square))
if torch then
  print("target seed f32/auto >= 1.4 (every shape): " .. verdict(bad.torch))
  print("target seed f32/auto >= 2.0 (768x3072, 3072x768, 1024x4096): " .. verdict(bad.auto_torch, ASPECT4))
  print("target seed f32/auto >= 1.0 (lone 768x768): " .. verdict(bad.lone, { ["768x768"] = true }))
  if bf16_ws and not seed16 then
    print("targets against the seed's bf16 function and torch's bf16 matmul: n/a (no bf16 kernels on this CPU)")
  elseif bf16_ws then
    print("target seed bf16/bf16 auto >= 1.6 (768x3072, 3072x768, 1024x4096): " .. verdict(bad.b16a, ASPECT4))
    print("target seed bf16/bf16 auto >= 1.3 (768^2, 2048^2, 12x768^2): " .. verdict(bad.b16s, SQUAREISH))
    if loaded then
      local all = {}
      for k in pairs(ASPECT4) do all[k] = true end
      for k in pairs(SQUAREISH) do all[k] = true end
      print("target seed bf16/bf16 auto >= 1.0 under a 2-thread load (those six): " .. verdict(bad.b16l, all))
    end
    print("target bf16 auto >= 80% of torch's bf16 matmul rate, its flops (768x3072, 2048x2048): "
      .. verdict(bad.roof, ROOF))
  else
    print("target seed bf16/bf16 auto (1.6x aspect-4, 1.3x square): n/a (no bfloat16 Newton-Schulz in this build)")
  end
end
