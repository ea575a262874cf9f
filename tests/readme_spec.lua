-- The README as a newcomer uses it: its marked blocks (tests/readme.lua)
-- run exactly as printed, from directories outside the source tree; it
-- stays short (the reference lives next to the code), gives every hook's
-- contract and names only files that exist.
local R = require("readme")

local README = R.read(R.root .. "/README.md")
local blocks = R.blocks(README)

-- The first loop's output as the README prints it, checked for what every
-- CPU and OpenBLAS core agrees on: the same lines; step 1's loss (before any
-- update: one product of the data) to 1e-5 and every lr exactly (the
-- schedule is pure arithmetic); after that the losses of this chaotic
-- trajectory differ between cores by 10-20% (rounding in the products
-- grows over 300 steps), so they are checked to fall, by 100x at the end.
local function assert_first_loop_output(expected, out)
  local function rows(text)
    local r = {}
    for step, loss, lr in text:gmatch("step%s+(%d+)%s+loss%s+([%d.e+-]+)%s+lr%s+([%d.]+)") do
      r[#r + 1] = { step = tonumber(step), loss = tonumber(loss), lr = lr }
    end
    return r
  end
  local want, got = rows(expected), rows(out)
  assert.are.equal(#want, #got, "README output:\n" .. expected .. "\nactual:\n" .. out)
  assert.is_true(#want >= 3, "README output has its step lines")
  for i = 1, #want do
    assert.are.equal(want[i].step, got[i].step, out)
    assert.are.equal(want[i].lr, got[i].lr, out)
    if i > 1 then assert.is_true(got[i].loss < got[i - 1].loss, "the loss falls:\n" .. out) end
  end
  assert.is_true(math.abs(got[1].loss - want[1].loss) <= 1e-5 * want[1].loss, out)
  assert.is_true(got[#got].loss < 0.01 * got[1].loss, out)
  local first, last = out:match("loss ([%d.]+) %-> ([%d.]+); saved first_loop.safetensors")
  assert.is_truthy(first, out)
  assert.are.equal(tonumber(first), got[1].loss)
  assert.are.equal(tonumber(last), got[#got].loss)
end

-- Every number printed matches the README's sample output to rel_tol (a
-- converging run: every core agrees on these digits).
local function assert_output_like(expected, out, rel_tol)
  local want, got = R.numbers(expected), R.numbers(out)
  assert.are.equal(#want, #got, "README output:\n" .. expected .. "\nactual:\n" .. out)
  for i = 1, #want do
    local tol = rel_tol * math.max(math.abs(want[i]), 1e-3)
    assert.is_true(math.abs(want[i] - got[i]) <= tol,
      ("number %d: README %s, got %s\n%s"):format(i, want[i], got[i], out))
  end
end

describe("README", function()
  it("has every runnable block this spec needs", function()
    for _, name in ipairs({ "first-loop", "first-loop-run", "first-loop-output", "c-trainer",
                            "c-install", "c-build", "c-output", "python-loop" }) do
      assert.is_string(blocks[name], "missing block " .. name)
    end
  end)

  it("'Your first training loop in Lua' runs as printed from a directory outside the tree", function()
    local dir = R.tmpdir()
    R.write(dir .. "/first_loop.lua", blocks["first-loop"])
    local out, status = R.run_sh(blocks["first-loop-run"], dir, { "PATH=" .. R.sh_quote(R.build .. ":" .. os.getenv("PATH")) })
    assert.are.equal(0, status, out)
    assert_first_loop_output(blocks["first-loop-output"], out)
    assert.is_true(R.exists(dir .. "/first_loop.safetensors"), "the checkpoint goes to the working directory")
    os.execute("rm -rf " .. R.sh_quote(dir))
  end)

  it("the muon.safetensors example under 'Checkpoints' runs as printed", function()
    local dir = R.tmpdir()
    R.write(dir .. "/st.lua", blocks["safetensors"])
    local out, status = R.run_sh(R.sh_quote(R.build .. "/muon") .. " run st.lua", dir)
    assert.are.equal(0, status, out)
    assert.are.equal("w\tfloat32\t4x3\t64\n", out) -- 12 floats of w, 4 of b
    assert.is_true(R.exists(dir .. "/weights.safetensors"))
    os.execute("rm -rf " .. R.sh_quote(dir))
  end)

  it("the C trainer it prints is examples/minimal_trainer.c", function()
    assert.are.equal(R.read(R.root .. "/examples/minimal_trainer.c"), blocks["c-trainer"])
  end)

  it("'Your first C trainer' installs, builds and trains as printed", function()
    local home, dir = R.tmpdir(), R.tmpdir()
    -- a user's clean shell: nothing from this test run (make's variables
    -- such as SAN=1, the library and module paths) leaks into the recipe
    local env = { R.clean_env, "-u PKG_CONFIG_PATH", "HOME=" .. R.sh_quote(home) }
    local out, status = R.run_sh(blocks["c-install"], R.root, env)
    assert.are.equal(0, status, out)
    R.write(dir .. "/trainer.c", blocks["c-trainer"])
    out, status = R.run_sh(blocks["c-build"], dir, env)
    assert.are.equal(0, status, out)
    assert_output_like(blocks["c-output"], out, 0.01)
    assert.is_true(R.exists(dir .. "/minimal_opt.safetensors"), "the checkpoint goes to the working directory")
    -- a failing call makes the program exit 1 with the engine's message
    out, status = R.run_sh("./trainer nope.lua", dir, env)
    assert.are.equal(1, status, out)
    assert.truthy(out:find("mu_engine_open: .*nope%.lua"), out)
    -- "From PyTorch": the loop, saved anywhere, against the package installed
    -- with the library (Python finds ~/.local's site-packages by itself)
    local py = R.exists("/usr/bin/python3") and "/usr/bin/python3" or "python3"
    local _, has = R.run_status(R.sh_quote(py) .. " -c 'import torch, cffi'")
    if has == 0 then
      R.write(dir .. "/loop.py", blocks["python-loop"])
      out, status = R.run_sh(R.sh_quote(py) .. " loop.py", dir, { R.clean_env, "-u PYTHONPATH", "HOME=" .. R.sh_quote(home) })
      assert.are.equal(0, status, out)
      local rows = {}
      for st, loss, lr in out:gmatch("step (%d+)%s+loss ([%d.]+)%s+lr ([%d.]+)") do rows[#rows + 1] = { st, tonumber(loss), lr } end
      assert.are.same({ "100", "200", "300" }, { rows[1] and rows[1][1], rows[2] and rows[2][1], rows[3] and rows[3][1] }, out)
      assert.are.same({ "0.01971", "0.01854", "0.01661" }, { rows[1][3], rows[2][3], rows[3][3] }, out) -- the schedule
      assert.is_true(rows[3][2] < 0.01 * rows[1][2] and math.abs(rows[1][2] - 0.1242) < 0.01, out)
    end
    out, status = R.run_sh("make -s uninstall PREFIX=$HOME/.local", R.root, env)
    assert.are.equal(0, status, out)
    assert.are.equal("", R.capture("find " .. R.sh_quote(home .. "/.local") .. " -type f -o -type l"))
    os.execute("rm -rf " .. R.sh_quote(home) .. " " .. R.sh_quote(dir))
  end)

  it("is at most 1000 lines", function()
    local n = select(2, README:gsub("\n", "\n"))
    assert.is_true(n <= 1000, ("README.md has %d lines; keep the guide short and the reference next to the code"):format(n))
  end)

  it("gives the contract of every hook of K.HOOKS in its hooks table, and of no other", function()
    local K = require("muon.optim.kind")
    local section = README:match("\n## Hooks\n(.-)\n## ")
    assert.is_string(section, "README has a '## Hooks' section")
    local listed = {}
    for name in section:gmatch("\n| `([%w_]+)` |") do listed[#listed + 1] = name end
    local want = {}
    for _, h in ipairs(K.HOOKS) do want[#want + 1] = h[1] end
    table.sort(listed)
    table.sort(want)
    assert.are.same(want, listed)
    -- and every state rule
    for _, r in ipairs(K.HOOK_STATE_RULES) do
      assert.truthy(section:find('"' .. r[1] .. '"', 1, true), "hook_state rule " .. r[1])
    end
  end)

  it("names only files and directories that exist", function()
    local missing, n = {}, 0
    for path in README:gmatch("`([%w_%-./]+)`") do
      local top = path:match("^([%w_]+)/")
      if top == "src" or top == "lua" or top == "configs" or top == "examples" or top == "tests" then
        n = n + 1
        if not (R.exists(R.root .. "/" .. path) or R.capture("test -d " .. R.sh_quote(R.root .. "/" .. path)
            .. " && echo d") ~= "") then
          missing[#missing + 1] = path
        end
      end
    end
    assert.is_true(n > 30, "found only " .. n .. " paths")
    assert.are.same({}, missing)
  end)

  it("never points at files that are not in the repository", function()
    -- (the patterns are split so that this file does not match them)
    local function grep(dir)
      return R.capture("grep -rnI --exclude-dir=.git --exclude-dir=build --exclude-dir=build-san -e "
        .. R.sh_quote("DESIGN" .. "\\.md") .. " -e " .. R.sh_quote("STYLE" .. "\\.md") .. " -e "
        .. R.sh_quote("\\.\\./" .. "shared") .. " " .. R.sh_quote(dir) .. " 2>&1 || true")
    end
    assert.are.equal("", grep(R.root))
    -- the same grep finds such a mention when there is one
    local dir = R.tmpdir()
    R.write(dir .. "/x.md", "see " .. "DESIGN" .. ".md\n")
    assert.truthy(grep(dir):find("x.md:1:", 1, true))
    os.execute("rm -rf " .. R.sh_quote(dir))
  end)
end)
