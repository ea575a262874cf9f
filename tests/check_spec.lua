-- `muon check CONFIG --params X` (lua/muon/check.lua): X is a shapes text
-- file or a safetensors checkpoint, told apart by content; the report's
-- Newton-Schulz shapes, totals per group and warnings, against values
-- computed here by hand. The checkpoint fixture is the state_dict of a
-- tiny GPT-like torch 1.13 model in bfloat16, with an int64 buffer, in the
-- file layout of safetensors.torch.save_file (written by
-- tests/fixtures/safetensors/make_gpt_tiny.py: torch without the
-- safetensors package, which is not installed here).
local H = require("helpers")
local check = require("muon.check")

local FIXTURE = "tests/fixtures/safetensors/gpt_tiny.safetensors"
local BUILD = os.getenv("MUON_BUILD") or "build"

local write_cfg = H.config_file

local CFG = "return { groups = { { name = 'hidden', optimizer = 'muon', lr = 0.02, min_dim = 2 }, "
  .. "{ name = 'rest', optimizer = 'adamw', lr = 3e-4 } } }"

-- Newton-Schulz flops of one symmetric standard step on an a x b matrix
-- (m the smaller side): X X^T (its triangle), A A (its triangle), B X.
local function ns_step_flops(a, b)
  local m, n = math.min(a, b), math.max(a, b)
  return m * m * n + m * m * m + 2 * m * m * n
end

local function capture(cmd)
  local f = assert(io.popen(cmd .. " 2>&1; echo \"exit=$?\""))
  local out = f:read("*a")
  f:close()
  return out, tonumber(out:match("exit=(%d+)%s*$"))
end

describe("muon check --params", function()
  it("reads a torch-written safetensors file's header: names, shapes; integer buffers left out with a note", function()
    local shapes, problems, notes = check.read_params(FIXTURE)
    assert.same({}, problems)
    local got = {}
    for _, s in ipairs(shapes) do got[s.name] = table.concat(s.shape, "x") end
    assert.same({ gate = "1x32", ["h0_attn.bias"] = "96", ["h0_attn.weight"] = "96x32", ["h0_proj.weight"] = "32x96",
      ["lm_head.weight"] = "256x32", ["ln_f.bias"] = "32", ["ln_f.weight"] = "32", ["stem.bias"] = "64",
      ["stem.weight"] = "64x3x3x3", ["wte.weight"] = "256x32" }, got)
    assert.equal(1, #notes)
    assert.truthy(notes[1]:find("'position_ids' (I64 [1, 64]) left out", 1, true), notes[1])
  end)

  it("detects the format by content, not by the file's name; a binary file is never read as names", function()
    local dir = H.tmpname(".d")
    os.execute("mkdir -p " .. dir)
    -- a checkpoint named .txt is a checkpoint
    H.write_file(dir .. "/model.txt", H.read_file(FIXTURE))
    local shapes = check.read_params(dir .. "/model.txt")
    assert.equal(10, #shapes)
    -- a text file named .safetensors is text
    H.write_file(dir .. "/shapes.safetensors", "w 4 3\n# c\nb 3\n")
    shapes = check.read_params(dir .. "/shapes.safetensors")
    assert.same({ { name = "w", shape = { 4, 3 } }, { name = "b", shape = { 3 } } }, shapes)
    -- binary: NUL bytes, a zip (torch.save), control bytes after a text start
    local cases = {
      { "\1\2\3\0\0\0\0\0garbage", "is neither a safetensors file nor a shapes text file (byte 1 is 0x01)" },
      { "PK\3\4\20\0\0\0", "a zip archive, as torch.save writes" },
      { "w 4 3\n" .. string.rep("x", 5000) .. "\n\0\1b 3\n", "is not a shapes text file: line 3 has the control byte 0x00" },
      -- a safetensors length prefix longer than the file: not taken as safetensors, and not text
      { "\255\0\0\0\0\0\0\0{}", "is neither a safetensors file nor a shapes text file" },
    }
    for i, c in ipairs(cases) do
      local p = ("%s/bin%d"):format(dir, i)
      H.write_file(p, c[1])
      local s, err = check.read_params(p)
      assert.is_nil(s)
      assert.truthy(err:find(c[2], 1, true), err)
    end
    -- a broken safetensors header is a problem naming the file
    H.write_file(dir .. "/broken", "\16\0\0\0\0\0\0\0{\"a\":1}        ")
    local s, err = check.read_params(dir .. "/broken")
    assert.is_nil(s)
    assert.truthy(err:find("params file '" .. dir .. "/broken'", 1, true), err)
    os.execute("rm -rf " .. dir)
  end)

  it("NS shape of each parameter: 2-D as is, conv-like 3-D, N-D batched or flattened (nd_mode)", function()
    assert.equal("[96, 32]", check.ns_shape({ 96, 32 }, "batch"))
    assert.equal("192 x [3, 3]: dims 1..2 batched; nd_mode=flatten gives [64, 27]", check.ns_shape({ 64, 3, 3, 3 }, "batch"))
    assert.equal("[64, 27] (dims 2..4 flattened: nd_mode=flatten)", check.ns_shape({ 64, 3, 3, 3 }, "flatten"))
    assert.equal("[16, 8] (conv-like [16, 1, 8])", check.ns_shape({ 16, 1, 8 }, "batch"))
    assert.equal("4 x [6, 5]: dims 1..1 batched; nd_mode=flatten gives [4, 30]", check.ns_shape({ 4, 6, 5 }, "batch"))
    assert.equal("-", check.ns_shape({ 7 }, "batch"))
  end)

  it("prints totals per group (parameters, elements, state bytes, NS flops per step) for the checkpoint", function()
    local cfg = write_cfg(CFG)
    local out, status = capture(BUILD .. "/muon check " .. cfg .. " --params " .. FIXTURE)
    assert.equal(0, status, out)
    -- muon: gate, h0_attn.weight, h0_proj.weight, lm_head, stem (64x3x3x3), wte; 5 NS steps each
    local elements = 32 + 96 * 32 * 2 + 256 * 32 * 2 + 64 * 27
    local flops = 5 * (ns_step_flops(1, 32) + 2 * ns_step_flops(96, 32) + 2 * ns_step_flops(256, 32)
      + 192 * ns_step_flops(3, 3))
    local row = out:match("\n1 %(hidden%)%s+muon%s+([^\n]+)")
    assert.truthy(row, out)
    local p, e, sb, fl = row:match("^(%d+)%s+(%d+)%s+(%d+) %(%S+ %a+%)%s+(%S+)$")
    assert.same({ 6, elements, 4 * elements }, { tonumber(p), tonumber(e), tonumber(sb) }, row)
    assert.equal(("%.3g"):format(flops), fl)
    -- adamw: two moments per element of the four 1-D tensors
    local arow = out:match("\n2 %(rest%)%s+adamw%s+([^\n]+)")
    assert.truthy(arow:match("^4%s+224%s+1792 %(1%.8 KiB%)%s+0$"), arow)
    local all = out:match("\nall%s+([^\n]+)")
    assert.truthy(all:match("^10%s+" .. (elements + 224) .. "%s"), all)
    -- the NS table: the conv's split, said
    assert.truthy(out:find("stem.weight     [64, 3, 3, 3]  192 x [3, 3]: dims 1..2 batched; nd_mode=flatten gives [64, 27]", 1, true), out)
    assert.truthy(out:find("'position_ids' (I64 [1, 64]) left out", 1, true), out)
    assert.truthy(out:find("no problems found", 1, true), out)
    os.remove(cfg)
  end)

  it("flags 1xN, Nx1, embedding-like (by name, or a side > 10x the other and > 32768) and batched convs routed to Muon", function()
    local engine = require("muon.engine")
    local cfg = { groups = { { name = "hidden", optimizer = "muon", min_dim = 2, match = "^[^f]" },
      { name = "flat", optimizer = "muon", nd_mode = "flatten", match = "^f" }, { optimizer = "adamw" } } }
    local rows = engine.check(cfg, {
      { name = "h.w", shape = { 64, 64 } }, { name = "row", shape = { 1, 50 } }, { name = "col", shape = { 50, 1 } },
      { name = "model.embed_tokens.weight", shape = { 100, 16 } }, { name = "big", shape = { 40000, 1024 } },
      { name = "wide", shape = { 40000, 4096 } }, { name = "conv", shape = { 8, 4, 3, 3 } },
      { name = "fconv", shape = { 8, 4, 3, 3 } }, { name = "bias", shape = { 64 } } })
    local w = check.warnings(rows)
    local text = table.concat(w, "\n")
    assert.equal(5, #w, text)
    assert.truthy(text:find("'row' ([1, 50], group 1) is a [1, 50] matrix for Newton-Schulz", 1, true), text)
    assert.truthy(text:find("'col' ([50, 1], group 1) is a [50, 1] matrix", 1, true), text)
    assert.truthy(text:find("'model.embed_tokens.weight' ([100, 16], group 1) looks like an embedding or output head "
      .. "(its name has 'embed')", 1, true), text)
    assert.truthy(text:find("'big' ([40000, 1024], group 1) looks like an embedding or output head ([40000, 1024]: one "
      .. "side > 10x the other and > 32768)", 1, true), text)
    assert.truthy(text:find("'conv' ([8, 4, 3, 3], group 1) is orthogonalized as 32 separate [3, 3] matrices", 1, true), text)
    -- not flagged: a square hidden matrix, 40000x4096 (< 10x), the flattened conv, an AdamW bias
    for _, name in ipairs({ "'h.w'", "'wide'", "'fconv'", "'bias'" }) do assert.is_nil(text:find(name, 1, true), name) end
    -- nothing flagged in AdamW groups
    local r2 = engine.check({ groups = { { optimizer = "adamw" } } }, { { name = "wte", shape = { 1, 40000 } } })
    assert.same({}, check.warnings(r2))
  end)

  it("totals: bfloat16 state halves the state bytes; a zeropower_fn hook has no NS flops", function()
    local engine = require("muon.engine")
    local rows = engine.check({ groups = { { name = "a", optimizer = "muon", state_dtype = "bfloat16", match = "^a" },
      { name = "z", optimizer = "muon", match = "^z", zeropower_fn = function(g) return g end } } },
      { { name = "a.w", shape = { 10, 6 } }, { name = "z.w", shape = { 4, 4 } } })
    local t = check.totals(rows)
    assert.same({ 1, 60, 120, 5 * ns_step_flops(10, 6) }, { t[1].params, t[1].elements, t[1].state_bytes, t[1].flops })
    assert.same({ 1, 16, 64 }, { t[2].params, t[2].elements, t[2].state_bytes })
    assert.is_nil(t[2].flops)
    assert.equal("all", t[3].label)
    assert.is_nil(t[3].flops)
    assert.equal(184, t[3].state_bytes)
  end)
end)
