// Wrapper module for the Lua health runner (main.go), built by tools/lua-health/build.sh into a
// cache outside the repository (as tools/promtool/build.sh does for promtool).
module metis.invalid/tools/lua-health

go 1.24.0

require github.com/yuin/gopher-lua v1.1.2
