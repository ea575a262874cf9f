-- tests/heartbeat.bash, which keeps `make test` and `make bench` from
-- staying silent: a heartbeat line after each quiet interval, and every
-- line of the output whole (tests/run.sh counts "ok"/"not ok" lines; a
-- line cut by a heartbeat would not be counted).
local ROOT = (debug.getinfo(1, "S").source:match("^@(.*)/tests/[^/]*$")) or "."

local function heartbeat(producer)
  local cmd = ("bash -c '. %s/tests/heartbeat.bash; (%s) | HEARTBEAT_SECONDS=1 heartbeat t'"):format(ROOT, producer)
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  f:close()
  return out
end

describe("the heartbeat of make test and make bench", function()
  it("speaks after a quiet second and never cuts a line arriving in parts", function()
    local out = heartbeat([[printf "ok 1 - a\no"; sleep 2.3; printf "k 2 - b\nnot"; sleep 1.3; printf " ok 3 - c\nlast"]])
    local lines = {}
    for l in (out .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = l end
    local kept = {}
    local beats = 0
    for _, l in ipairs(lines) do
      if l:match("^# t: still running %(%d+ s%)$") then beats = beats + 1 else kept[#kept + 1] = l end
    end
    assert.are.same({ "ok 1 - a", "ok 2 - b", "not ok 3 - c", "last" }, kept)
    assert.is_true(beats >= 3, out)
  end)

  it("copies a quick output as it is, with no heartbeat", function()
    assert.are.equal("a\nb\nc", heartbeat([[printf "a\nb\nc"]]))
  end)
end)
