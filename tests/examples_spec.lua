-- The examples and the CLI, run as a user would (build/muon, the demo
-- trainer), asserting on the numbers they print. Needs `make` first.
-- Every command runs in a fresh temporary directory outside the source tree,
-- with absolute paths to the programs and examples: they must not depend on
-- the working directory, and what they write lands in that directory.
local R = require("readme") -- shell helpers shared with the README's runner
local sh_quote, capture = R.sh_quote, R.capture

local ROOT = capture("cd " .. sh_quote((debug.getinfo(1, "S").source:match("^@(.*)/tests/[^/]*$")) or ".")
  .. " && pwd"):match("[^\n]+")
local BUILD = os.getenv("MUON_BUILD") or "build" -- build-san under make test SAN=1
local MUON = ROOT .. "/" .. BUILD .. "/muon"
local DEMO = ROOT .. "/" .. BUILD .. "/examples/demo_trainer"
local MINIMAL = ROOT .. "/" .. BUILD .. "/examples/minimal_trainer"
local EX = ROOT .. "/examples/"
local CONFIGS = ROOT .. "/configs/"

local function tmpdir()
  return capture("mktemp -d"):match("[^\n]+")
end

local CWD -- the current test's working directory (see before_each)

-- Runs a command line in CWD; returns stdout+stderr text and the exit status.
local function run(cmd) return R.run_status("cd " .. sh_quote(CWD) .. " && " .. cmd) end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

before_each(function() CWD = tmpdir() end)
after_each(function() os.execute("rm -rf " .. sh_quote(CWD)) end)

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function num(out, key)
  return tonumber(out:match(key .. "%s+([%-%d%.e+]+)"))
end

describe("examples (build/muon run examples/*.lua)", function()
  it("qkv_split: ns_transform_fn on a fused QKV equals three separate parameters", function()
    local out, status = run(MUON .. " run " .. EX .. "qkv_split.lua 4 12")
    assert.are.equal(0, status, out)
    local split, plain = num(out, "split_vs_separate"), num(out, "unsplit_vs_separate")
    assert.is_true(split <= 1e-6, out)     -- same numbers as three parameters
    assert.is_true(plain > 1e-4, out)      -- NS on the fused matrix is different
    assert.truthy(out:find("OK:", 1, true), out)
  end)

  it("per_head_ns: reshape_fn runs Newton-Schulz per head", function()
    local out, status = run(MUON .. " run " .. EX .. "per_head_ns.lua 3")
    assert.are.equal(0, status, out)
    assert.is_true(num(out, "hook_vs_heads") <= 1e-6, out)
    assert.is_true(num(out, "whole_vs_heads") > 1e-4, out)
    -- rows of one head's orthogonalized update are nearly orthogonal
    assert.is_true(num(out, "head1_max_row_cos") < 0.2, out)
  end)

  it("post_update_clip: logs update RMS = lr * matched_adamw_rms and clips norms", function()
    local out, status = run(MUON .. " run " .. EX .. "post_update_clip.lua 6 33")
    assert.are.equal(0, status, out)
    assert.are.equal(18, num(out, "calls"))
    -- Muon's scale makes the update RMS about 0.2 * lr for every shape
    -- (NS is approximate: within 5%)
    local lo, hi = out:match("update_rms/lr min ([%d%.]+) max ([%d%.]+)")
    assert.is_true(math.abs(tonumber(lo) - 0.2) < 0.01 and math.abs(tonumber(hi) - 0.2) < 0.01, out)
    assert.is_true(num(out, "clipped") > 0, out)
    assert.is_true(num(out, "max_norm_after") <= 33.0001, out)
  end)

  -- The variant examples: each prints a "check:" line with its numbers.
  local function check_line(out)
    return out:match("check: ([^\n]*)")
  end
  it("normuon: NorMuon's update rows move alike (row RMS spread below Muon's)", function()
    local out, status = run(MUON .. " run " .. EX .. "normuon.lua 60")
    assert.are.equal(0, status, out)
    local nor, mu = check_line(out):match("NorMuon ([%d%.]+), Muon ([%d%.]+)")
    assert.is_true(tonumber(nor) < 0.7 * tonumber(mu), out)
  end)
  it("adamuon: AdaMuon's update RMS is 0.2 x lr exactly for every shape", function()
    local out, status = run(MUON .. " run " .. EX .. "adamuon.lua 20")
    assert.are.equal(0, status, out)
    local a, m = check_line(out):match("AdaMuon RMS off 0.2 by ([%d%.e+-]+), Muon by ([%d%.e+-]+)")
    assert.is_true(tonumber(a) < 1e-6 and tonumber(m) > 1e-4, out)
  end)
  it("newton_muon: right-preconditioning by the input second moment fits an anisotropic teacher", function()
    local out, status = run(MUON .. " run " .. EX .. "newton_muon.lua 300")
    assert.are.equal(0, status, out)
    local n, m = check_line(out):match("Newton%-Muon loss ([%d%.]+), Muon ([%d%.]+)")
    assert.is_true(tonumber(n) < 0.2 * tonumber(m), out)
  end)
  it("muonh: MuonH keeps each weight on its sphere while Muon's norms grow", function()
    local out, status = run(MUON .. " run " .. EX .. "muonh.lua 60")
    assert.are.equal(0, status, out)
    local h1, h2, s1, s2, m1 = check_line(out):match(
      "MuonH norms ([%d%.]+) ([%d%.]+) %(sphere ([%d%.]+) ([%d%.]+)%), Muon's ([%d%.]+)")
    assert.is_true(math.abs(h1 - s1) < 1e-4 and math.abs(h2 - s2) < 1e-4 and tonumber(m1) > tonumber(s1) * 1.3, out)
  end)
  it("cautious_decay: cautious decay fits the teacher better than decoupled decay", function()
    local out, status = run(MUON .. " run " .. EX .. "cautious_decay.lua 100")
    assert.are.equal(0, status, out)
    local c, d = check_line(out):match("cautious loss ([%d%.]+) < decoupled ([%d%.]+)")
    assert.is_true(tonumber(c) < 0.6 * tonumber(d), out)
  end)
  it("spectral_scale: the spectral norm of the update is sqrt(rows/cols) x lr", function()
    local out, status = run(MUON .. " run " .. EX .. "spectral_scale.lua")
    assert.are.equal(0, status, out)
    assert.is_true(tonumber(check_line(out):match("within ([%d%.]+)%%")) < 5, out)
  end)
  it("muonclip: QK-clip holds the max attention logit near tau while Muon's grows", function()
    local out, status = run(MUON .. " run " .. EX .. "muonclip.lua")
    assert.are.equal(0, status, out)
    local clip, plain = check_line(out):match("steps ([%d%.]+) stays near tau %(Muon reached ([%d%.]+)%)")
    assert.is_true(tonumber(clip) < 103 and tonumber(plain) > 115, out)
  end)
  it("conv_flatten: flattening a conv weight fits better than 128 separate 3x3 kernels", function()
    local out, status = run(MUON .. " run " .. EX .. "conv_flatten.lua 60")
    assert.are.equal(0, status, out)
    local f, b = check_line(out):match("flatten loss ([%d%.]+) < batch loss ([%d%.]+)")
    assert.is_true(tonumber(f) < 0.7 * tonumber(b), out)
  end)

  it("dist_hsdp: one process trains, and saves its checkpoint in the working directory", function()
    local out, status = run(MUON .. " run " .. EX .. "dist_hsdp.lua")
    assert.are.equal(0, status, out)
    local l1, l30 = tonumber(out:match("step  1  loss ([%d%.]+)")), tonumber(out:match("step 30  loss ([%d%.]+)"))
    assert.is_true(l30 < 0.9 * l1, out) -- 15778 -> 13742 (the warmup holds lr low)
    assert.truthy(out:find("saved dist_hsdp.safetensors", 1, true), out)
    assert.is_true(exists(CWD .. "/dist_hsdp.safetensors"))
  end)

  it("the examples also run under plain luajit", function()
    local lp = ROOT .. "/lua/?.lua;" .. ROOT .. "/lua/?/init.lua;;"
    local out, status = run("LUA_PATH=" .. sh_quote(lp) .. " luajit " .. EX .. "qkv_split.lua 2 8")
    assert.are.equal(0, status, out)
    assert.truthy(out:find("OK:", 1, true), out)
  end)
end)

describe("muon CLI", function()
  it("info prints the version, BLAS core and MPI", function()
    local out, status = run(MUON .. " info")
    assert.are.equal(0, status, out)
    assert.truthy(out:match("version%s+%d+%.%d+%.%d+"), out)
    assert.truthy(out:match("blas core%s+%S+"), out)
    assert.truthy(out:match("blas threads%s+%d+"), out)
    assert.truthy(out:match("\nmpi%s+%S"), out)
  end)

  it("--help and --version exit 0; unknown commands and options are usage errors", function()
    local out, status = run(MUON .. " --help")
    assert.are.equal(0, status)
    assert.truthy(out:find("usage: muon", 1, true))
    out, status = run(MUON .. " --version")
    assert.are.equal(0, status)
    assert.truthy(out:match("^muon %d+%.%d+%.%d+"))
    out, status = run(MUON .. " frobnicate")
    assert.are.equal(2, status)
    assert.truthy(out:find("unknown command 'frobnicate'", 1, true), out)
    out, status = run(MUON .. " --frob")
    assert.are.equal(2, status)
    out, status = run(MUON)
    assert.are.equal(2, status)
    out, status = run(MUON .. " run --nope x.lua")
    assert.are.equal(2, status)
    out, status = run(MUON .. " check " .. CONFIGS .. "muon.lua --bogus")
    assert.are.equal(2, status)
    assert.truthy(out:find("--bogus", 1, true), out)
  end)

  it("every subcommand takes --help (usage on stdout, exit 0); --version prints the library's version", function()
    for _, c in ipairs({ "run", "check", "info" }) do
      for _, flag in ipairs({ "--help", "-h" }) do
        local out, status = run(MUON .. " " .. c .. " " .. flag)
        assert.are.equal(0, status, c .. " " .. flag .. ": " .. out)
        assert.truthy(out:find("^usage: muon " .. c), out)
      end
    end
    local out, status = run(MUON .. " --version")
    assert.are.equal(0, status, out)
    write(CWD .. "/version.lua", "print(require('muon')._VERSION)\n")
    local lua_version = capture("cd " .. sh_quote(CWD) .. " && " .. MUON .. " run version.lua")
    assert.are.equal("muon " .. lua_version, out)
    -- a script's own options go after the script, untouched
    write(CWD .. "/args.lua", "print(table.concat(arg, ','))\n")
    out, status = run(MUON .. " run args.lua --help -x")
    assert.are.equal(0, status, out)
    assert.are.equal("--help,-x\n", out)
  end)

  it("check reads shapes only: a model of terabytes is checked without allocating it", function()
    write(CWD .. "/shapes.txt", "embed.weight 50257 768\nhidden.0.weight 1000000 1000000\n"
      .. "hidden.1.weight 16384 16384\nhead.bias 300000000\n")
    local script = [[
      local function vm_peak_kb()
        for line in io.lines("/proc/self/status") do
          local kb = line:match("^VmPeak:%s+(%d+)")
          if kb then return tonumber(kb) end
        end
      end
      local check = require("muon.check")
      local before = vm_peak_kb()
      local text, problems = check.run(arg[1], "shapes.txt")
      io.write(text)
      print(("problems %d  vm_peak_growth_mb %.1f"):format(#problems, (vm_peak_kb() - before) / 1024))
    ]]
    write(CWD .. "/peak.lua", script)
    local out, status = run(MUON .. " run peak.lua " .. CONFIGS .. "muon.lua")
    assert.are.equal(0, status, out)
    assert.truthy(out:match("\nhidden%.0%.weight%s+%[1000000, 1000000%]%s+1 %(hidden%)%s+muon"), out)
    assert.truthy(out:match("\nhead%.bias%s+%[300000000%]%s+2 %(rest%)%s+adamw"), out)
    assert.are.equal(0, num(out, "problems"), out)
    -- the declared parameters hold 4 TB (float32); a value and a gradient
    -- for hidden.1 and head.bias alone would add 4.2 GiB of address space
    -- (hidden.0 could not be allocated at all). Threads started on first use
    -- (BLAS, malloc arenas) may reserve some: about 130 MB seen.
    assert.is_true(num(out, "vm_peak_growth_mb") < 1024, out)
  end)

  it("run: arguments, exit status from the script, errors with traceback exit 1", function()
    local d = tmpdir()
    write(d .. "/ok.lua", "local muon = require('muon')\n"
      .. "print('args', arg[0] ~= nil, ...)\n"
      .. "return math.floor(muon.tensor.from({6, 8}, {2}):norm())\n")
    local out, status = run(MUON .. " run " .. d .. "/ok.lua a b")
    assert.are.equal(10, status, out)
    assert.truthy(out:find("args\ttrue\ta\tb", 1, true), out)
    write(d .. "/bad.lua", "local function inner() error('deliberate failure') end\ninner()\n")
    out, status = run(MUON .. " run " .. d .. "/bad.lua")
    assert.are.equal(1, status)
    assert.truthy(out:find("bad.lua:1: deliberate failure", 1, true), out)
    assert.truthy(out:find("stack traceback", 1, true), out)
    out, status = run(MUON .. " run " .. d .. "/missing.lua")
    assert.are.equal(1, status)
    -- a script that cannot be read or compiled: one clean line, no traceback
    assert.are.equal(("muon: script '%s/missing.lua' (resolved %s/missing.lua): No such file or directory\n")
      :format(d, d), out)
    write(d .. "/syntax.lua", "local x = \n")
    out, status = run(MUON .. " run " .. d .. "/syntax.lua")
    assert.are.equal(1, status)
    assert.are.equal(("muon: script '%s/syntax.lua': syntax error: %s/syntax.lua:2: unexpected symbol near '<eof>'\n")
      :format(d, d), out)
    write(d .. "/bc.lua", string.dump(function() return 0 end))
    out, status = run(MUON .. " run --trust " .. d .. "/bc.lua")
    assert.are.equal(1, status)
    assert.are.equal(("muon: script '%s/bc.lua': precompiled bytecode is not accepted (source text only)\n"):format(d), out)
    out, status = run(MUON .. " run " .. d)
    assert.are.equal(1, status)
    assert.are.equal(("muon: script '%s' (resolved %s): Is a directory\n"):format(d, d), out)
    os.execute("rm -rf " .. sh_quote(d))
  end)

  it("run: the exit status is what the script returns, read as os.exit reads it; other values fail naming them", function()
    local d = tmpdir()
    -- returned value -> exit status; nil means the value is refused (exit 1 with a message naming it)
    local cases = {
      { "", 0 }, { "return", 0 }, { "return nil", 0 }, { "return true", 0 }, { "return false", 1 },
      { "return 0", 0 }, { "return 3", 3 }, { "return 255", 255 }, { "return '7'", 7 },
      { "return 256", nil, "256" }, { "return -1", nil, "-1" }, { "return 3.5", nil, "3.5" },
      { "return 0/0", nil, "nan" }, { "return 1/0", nil, "inf" }, { "return -1/0", nil, "-inf" },
      { "return 'abc'", nil, "'abc'" }, { "return {}", nil, "a table" }, { "return print", nil, "a function" },
    }
    for i, c in ipairs(cases) do
      local path = ("%s/r%d.lua"):format(d, i)
      write(path, c[1] .. "\n")
      local out, status = run(MUON .. " run " .. path)
      if c[2] then
        assert.are.equal(c[2], status, c[1] .. ": " .. out)
        assert.are.equal("", out, c[1])
      else
        assert.are.equal(1, status, c[1] .. ": " .. out)
        assert.are.equal(("muon: %s returned %s: an exit status is nothing, true, false or an integer 0..255\n")
          :format(path, c[3]), out:gsub("%-nan", "nan"), c[1])
      end
    end
    -- an empty path is a usage error with a message, as a missing one
    local out, status = run(MUON .. " run ''")
    assert.are.equal(2, status, out)
    assert.truthy(out:find("^muon: run: the script path is empty\n"), out)
    os.execute("rm -rf " .. sh_quote(d))
  end)

  it("run: recursion until the Lua or the C stack runs out ends in a clean error, exit 1", function()
    local d = tmpdir()
    write(d .. "/deep.lua", "local function f() return 1 + f() end\nf()\n")
    local out, status = run(MUON .. " run " .. d .. "/deep.lua")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("^muon: out of Lua stack: calls nested too deeply %(.*deep%.lua:1: stack overflow%)"), out)
    -- gsub's replacement calling gsub nests C frames: on the script's own C
    -- stack, LuaJIT's Lua-stack limit comes first (no SIGSEGV)
    write(d .. "/gsub.lua", "local function f() return (('ab'):gsub('.', f)) end\nf()\n")
    out, status = run(MUON .. " run " .. d .. "/gsub.lua")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("^muon: out of Lua stack: calls nested too deeply %(stack overflow%)"), out)
    os.execute("rm -rf " .. sh_quote(d))
  end)

  it("check: table of parameter -> group, optimizer, options; problems exit 1", function()
    local out, status = run(MUON .. " check " .. CONFIGS .. "muon.lua --params " .. EX .. "demo_shapes.txt")
    assert.are.equal(0, status, out)
    local function row(name) return out:match("\n" .. name:gsub("%.", "%%.") .. "%s+([^\n]*)") end
    assert.truthy(row("hidden.1.weight"):match("^%[256, 256%]%s+1 %(hidden%)%s+muon%s+lr=0%.02 "), out)
    assert.truthy(row("embed.weight"):match("^%[27, 16%]%s+2 %(rest%)%s+adamw%s+lr=0%.003 "), out)
    assert.truthy(row("hidden.0.bias"):match("adamw"), out)
    assert.truthy(out:find("no problems found", 1, true), out)

    local d = tmpdir()
    write(d .. "/cfg.lua", "return { groups = { { name = 'mats', optimizer = 'muon', match = '^layers' } } }\n")
    write(d .. "/shapes.txt", "# comment\nlayers.0.w 4 8\nlayers.0.b 8\nother 3 3\nbroken 3 x\n")
    out, status = run(MUON .. " check " .. d .. "/cfg.lua --params " .. d .. "/shapes.txt")
    assert.are.equal(1, status, out)
    assert.truthy(out:match("\nlayers%.0%.w%s+%[4, 8%]%s+1 %(mats%)%s+muon"), out)
    assert.truthy(out:find("3 problems", 1, true), out)
    assert.truthy(out:find("'layers.0.b' is 1-D", 1, true), out)
    assert.truthy(out:find("'other' (shape [3, 3]) matches no group", 1, true), out)
    assert.truthy(out:find("bad dimension 'x' for parameter 'broken'", 1, true), out)
    -- bytecode, a directory, a FIFO: one problem each, naming the file, no crash, no hang
    write(d .. "/bc.lua", string.dump(assert(loadstring("return { groups = { { optimizer = 'adamw' } } }"))))
    out, status = run(MUON .. " check " .. d .. "/bc.lua --params " .. d .. "/shapes.txt")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("config '" .. d .. "/bc.lua': precompiled bytecode is not accepted", 1, true), out)
    write(d .. "/badbc.lua", "#!/usr/bin/env muon\n\27LJ\2\255\255junk")
    out, status = run(MUON .. " check --trust " .. d .. "/badbc.lua --params " .. d .. "/shapes.txt")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("config '" .. d .. "/badbc.lua': precompiled bytecode is not accepted", 1, true), out)
    os.execute("mkfifo " .. sh_quote(d .. "/fifo.lua"))
    for _, c in ipairs({ { d, "Is a directory" }, { d .. "/fifo.lua", "not a regular file (a FIFO)" } }) do
      out, status = run(MUON .. " check " .. c[1] .. " --params " .. d .. "/shapes.txt")
      assert.are.equal(1, status, out)
      assert.truthy(out:find(("config '%s' (resolved %s): %s"):format(c[1], c[1], c[2]), 1, true), out)
    end
    -- a broken config is one problem, not a crash
    write(d .. "/bad.lua", "return { groups = { { optimizer = 'muon', match = '.*', lr = 'fast' } } }\n")
    out, status = run(MUON .. " check " .. d .. "/bad.lua --params " .. d .. "/shapes.txt")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("lr", 1, true), out)
    os.execute("rm -rf " .. sh_quote(d))
  end)
end)

describe("minimal C trainer (examples/minimal_trainer.c)", function()
  it("fits its target with configs/muon.lua and with configs/adamw.lua, saving in the working directory", function()
    for _, cfg in ipairs({ "muon.lua", "adamw.lua" }) do
      local out, status = run(MINIMAL .. " " .. CONFIGS .. cfg)
      assert.are.equal(0, status, out)
      local first = tonumber(out:match("step%s+1%s+loss ([%d%.]+)"))
      local last = tonumber(out:match("step 1000%s+loss ([%d%.]+)"))
      assert.are.equal(25, first) -- sum over i = 0..11 of (i % 5 - 2)^2
      assert.is_true(last < 0.1 * first, out)
      assert.truthy(out:find("saved minimal_opt.safetensors", 1, true), out)
      assert.is_true(exists(CWD .. "/minimal_opt.safetensors"))
    end
  end)

  it("exits 1 with the engine's message when a call fails, 2 on usage errors", function()
    local out, status = run(MINIMAL .. " missing.lua")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("mu_engine_open: config 'missing.lua' %(resolved .-/missing.lua%): No such file or directory"), out)
    -- a checkpoint that cannot be written is a failure too, after training
    out, status = run(MINIMAL .. " " .. CONFIGS .. "muon.lua no/such/dir/opt.safetensors")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("step 1000", 1, true), out)
    assert.truthy(out:find("mu_engine_save: .*no/such/dir/opt.safetensors"), out)
    -- a failing step: a config whose lr is NaN from the schedule
    write(CWD .. "/nan.lua", "return { groups = { { optimizer = 'muon', match = '.*' } },\n"
      .. "  schedule = function() return 0 / 0 end }\n")
    out, status = run(MINIMAL .. " nan.lua")
    assert.are.equal(1, status, out)
    assert.truthy(out:find("mu_engine_step: ", 1, true), out)
    assert.is_falsy(out:find("step  250", 1, true), out)
    out, status = run(MINIMAL)
    assert.are.equal(2, status, out)
    assert.truthy(out:find("usage: minimal_trainer", 1, true), out)
  end)
end)

describe("demo trainer (examples/demo_trainer.c)", function()
  it("backward pass matches central finite differences", function()
    local out, status = run(DEMO .. " --gradcheck")
    assert.are.equal(0, status, out)
    local err = tonumber(out:match("max relative error ([%d%.e+-]+)"))
    assert.is_true(err < 1e-2, out)
    assert.truthy(out:find("gradcheck ok", 1, true))
  end)

  it("a short run trains both configs and writes the CSV and SVG", function()
    -- from a directory outside the tree: the shipped configs are found from
    -- the program's location, the output goes to ./muon-demo
    local out, status = run(DEMO .. " --steps 40 --hidden 32 --batch 64 --eval-every 20 --print-every 20")
    assert.are.equal(0, status, out)
    local d = CWD .. "/muon-demo"
    -- loss starts near ln(27) = 3.30 and goes down for both runs
    local rows = {}
    local f = assert(io.open(d .. "/loss.csv"))
    local header = f:read("*l")
    assert.are.equal("step,muon_train_loss,muon_heldout_loss,muon_lr,adamw_train_loss,adamw_heldout_loss,adamw_lr", header)
    for line in f:lines() do rows[#rows + 1] = line end
    f:close()
    assert.are.equal(40, #rows)
    local first = {}
    for v in (rows[1] .. ","):gmatch("([^,]*),") do first[#first + 1] = v end
    assert.is_true(math.abs(tonumber(first[2]) - math.log(27)) < 0.1, rows[1])
    local muon_final, adamw_final = out:match("\nmuon%s+%S+%s+[%d%.]+%s+([%d%.]+)"), out:match("\nadamw%s+%S+%s+[%d%.]+%s+([%d%.]+)")
    assert.is_true(tonumber(muon_final) < 3.15 and tonumber(adamw_final) < 3.15, out) -- ln 27 = 3.296
    local svg = assert(io.open(d .. "/loss.svg")):read("*a")
    assert.truthy(svg:find("<svg", 1, true))
    assert.are.equal(4, select(2, svg:gsub("<polyline", "")))   -- train + held-out per run
    assert.truthy(svg:find(">step<", 1, true))
    assert.truthy(svg:find("muon train", 1, true) and svg:find("adamw held-out", 1, true))
    assert.truthy(out:match("samples %(muon%): %a"), out)
    os.execute("rm -rf " .. sh_quote(d))
  end)

  it("a bad config is reported with the engine's message", function()
    local d = tmpdir()
    write(d .. "/bad.lua", "return { groups = { { optimizer = 'muon', match = '^nothing' } } }\n")
    local out, status = run(DEMO .. " --steps 2 --hidden 8 --muon-config " .. d .. "/bad.lua --out " .. d)
    assert.are.equal(1, status, out)
    assert.truthy(out:find("embed.weight' (shape [27, 16]) matches no group", 1, true), out)
    os.execute("rm -rf " .. sh_quote(d))
  end)
end)
