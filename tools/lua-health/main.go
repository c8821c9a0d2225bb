// lua-health runs an Argo CD resource health check (a Lua script, as held under
// resource.customizations.health.<group>_<kind> in argocd-cm) in gopher-lua, Argo CD's
// Lua runtime, on one Kubernetes object read as JSON on stdin, and prints what the
// script returns: {"status": "Healthy|Progressing|Degraded|Suspended|...", "message": "..."}.
//
// It sets the script up as Argo CD's util/lua does for a health check from argocd-cm:
// no standard libraries but package, base and table; the object as the global `obj`,
// maps as tables and arrays as 1-indexed tables; one second to run; a status outside
// Argo CD's codes read as Unknown.
//
// Usage: lua-health <script.lua> < object.json
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"
)

const invalidHealthStatus = "Lua returned an invalid health status"

var codes = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true,
	"Healthy": true, "Degraded": true, "Missing": true,
}

func main() {
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: lua-health <script.lua> < object.json"))
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var obj map[string]interface{}
	if err := json.Unmarshal(data, &obj); err != nil {
		fail(err)
	}
	status, message, err := run(obj, string(script))
	if err != nil {
		fail(err)
	}
	out, _ := json.Marshal(map[string]string{"status": status, "message": message})
	fmt.Println(string(out))
}

func run(obj map[string]interface{}, script string) (string, string, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		call := lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}
		if err := l.CallByParam(call, lua.LString(lib.name)); err != nil {
			return "", "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decode(l, obj))
	if err := l.DoString(script); err != nil {
		return "", "", err
	}
	hs, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("expect table output from Lua script, not %s", l.Get(-1).Type())
	}
	status := lua.LVAsString(hs.RawGetString("status"))
	if !codes[status] {
		return "Unknown", invalidHealthStatus, nil
	}
	return status, lua.LVAsString(hs.RawGetString("message")), nil
}

// decode turns a value of the decoded JSON into Lua as Argo CD's decodeValue does.
func decode(l *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []interface{}:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decode(l, item))
		}
		return arr
	case map[string]interface{}:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), decode(l, item))
		}
		return tbl
	}
	return lua.LNil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "lua-health:", err)
	os.Exit(1)
}
