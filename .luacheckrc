-- luacheck (Debian's lua-check) settings; `.ci/run` runs `luacheck .`.
std = "luajit"
max_line_length = false
exclude_files = { "build/**", "build-san/**", "tests/fuzz/corpus/**", "tests/fuzz/regressions/**" }
-- Tests: `local ok, err = pcall(...)` re-assigned down a spec is the idiom.
files["tests/**"] = { ignore = { "311", "231", "241", "212", "213" } }
-- Specs run under busted: describe, it, assert, setup, pending, ... are its globals.
files["tests/**/*_spec.lua"] = { std = "+busted" }
-- Hooks keep the seed's full argument lists.
files["examples/**"] = { ignore = { "212" } }
