-- `make install PREFIX=<tmp>` then an out-of-tree C trainer built with only
-- `pkg-config --cflags --libs muon` trains with the engine, and the
-- installed CLI finds the installed Lua modules.
local ROOT = (debug.getinfo(1, "S").source:match("^@(.*)/tests/[^/]*$")) or "."

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"__status=$?\""))
  local out = p:read("*a")
  p:close()
  local status = tonumber(out:match("__status=(%d+)%s*$"))
  return out:gsub("__status=%d+%s*$", ""), status
end

local TRAINER = [[
#include <muon.h>
#include <stdio.h>

/* Fit W (4x3) to a target with loss ||W - T||^2 (gradient 2 (W - T)). */
int main(int argc, char **argv)
{
    mu_blas_fix_core(argv);
    float w[12] = {0}, g[12], target[12];
    for (int i = 0; i < 12; i++) target[i] = (float)(i % 5) - 2.0f;
    int64_t shape[2] = {4, 3};
    mu_engine *eng;
    if (mu_engine_open(&eng, argv[1]) != MU_OK) { fprintf(stderr, "open: %s\n", mu_last_error()); return 1; }
    if (mu_engine_add_param(eng, "layers.0.w", MU_F32, 2, shape, w, g) != MU_OK) {
        fprintf(stderr, "add: %s\n", mu_engine_error(eng));
        mu_engine_close(eng);
        return 1;
    }
    for (int step = 1; step <= 60; step++) {
        double loss = 0;
        for (int i = 0; i < 12; i++) { float d = w[i] - target[i]; loss += d * d; g[i] = 2 * d; }
        if (step == 1 || step == 60) printf("step %d loss %.6f\n", step, loss);
        if (mu_engine_step(eng) != MU_OK) { fprintf(stderr, "step: %s\n", mu_engine_error(eng)); return 1; }
    }
    mu_engine_close(eng);
    return 0;
}
]]

describe("make install", function()
  it("installs a library, header, Lua modules, CLI and muon.pc that an out-of-tree trainer builds with", function()
    local prefix = io.popen("mktemp -d"):read("*l")
    local out, status = run("make -s -C " .. sh_quote(ROOT) .. " install PREFIX=" .. sh_quote(prefix))
    assert.are.equal(0, status, out)
    for _, f in ipairs({ "lib/libmuon.so", "lib/libmuon.a", "include/muon.h", "bin/muon",
                         "lib/pkgconfig/muon.pc", "share/lua/5.1/muon/init.lua",
                         "share/lua/5.1/muon/engine.lua", "share/lua/5.1/muon/optim/muon.lua",
                         "share/muon/configs/muon.lua" }) do
      assert.is_true(io.open(prefix .. "/" .. f) ~= nil, "missing " .. f)
    end

    local src = prefix .. "/trainer.c"
    local f = assert(io.open(src, "w"))
    f:write(TRAINER)
    f:close()
    f = assert(io.open(prefix .. "/cfg.lua", "w"))
    f:write("return { groups = { { optimizer = 'muon', match = '.*', lr = 0.3, weight_decay = 0 } } }\n")
    f:close()
    -- a clean environment: nothing points at the source tree
    local env = "env -u MUON_LUA_PATH -u MUON_LIB -u LUA_PATH PKG_CONFIG_PATH=" .. sh_quote(prefix .. "/lib/pkgconfig")
    out, status = run("cd " .. sh_quote(prefix) .. " && " .. env
      .. " sh -c 'cc trainer.c $(pkg-config --cflags --libs muon) -o trainer'")
    assert.are.equal(0, status, out)
    out, status = run("cd /tmp && " .. env .. " " .. sh_quote(prefix .. "/trainer") .. " " .. sh_quote(prefix .. "/cfg.lua"))
    assert.are.equal(0, status, out)
    local l1 = tonumber(out:match("step 1 loss ([%d%.]+)"))
    local l60 = tonumber(out:match("step 60 loss ([%d%.]+)"))
    assert.are.equal(25.0, l1) -- sum over (i % 5 - 2)^2 for i = 0..11
    assert.is_true(l60 < 0.05 * l1, out); print("# install: loss " .. l1 .. " -> " .. l60)

    out, status = run("cd /tmp && " .. env .. " " .. sh_quote(prefix .. "/bin/muon") .. " info")
    assert.are.equal(0, status, out)
    assert.truthy(out:find("lua modules%s+" .. prefix:gsub("%p", "%%%0") .. "/share/lua/5%.1"), out)
    os.execute("rm -rf " .. sh_quote(prefix))
  end)
end)
