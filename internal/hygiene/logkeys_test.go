package hygiene

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// logKeyStyle is the one style of slog attribute keys (CONTRIBUTING.md's Style): snake_case,
// lower-case words joined by '_', as `close_wait_secs` and `api_requests`.
var logKeyStyle = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// keyArgsFrom is, for each slog.Logger method (and log/slog function) taking key-value pairs,
// the index of its first pair's key: after the message, and the context and level before it.
var keyArgsFrom = map[string]int{
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log":  3,
	"With": 0,
}

// attrConstructors are log/slog's functions whose first argument is an attribute's key.
var attrConstructors = map[string]bool{
	"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true, "Bool": true,
	"Time": true, "Duration": true, "Any": true, "Group": true,
}

// logKey is a string literal written as an slog attribute key.
type logKey struct {
	pos token.Position
	key string
}

// logKeys returns the string-literal keys of the slog calls in one Go file. It reads syntax
// only, no types: a call counts when its method is one of keyArgsFrom's (on any receiver but an
// imported package other than log/slog, such as http.Error, and the *testing.T, B, F or TB
// parameters of the file), or log/slog's attribute constructors, or a slog.Attr literal, or a
// []any literal given a name, and the appends to that name (pairs built up for a log call). Keys
// that are not literals (a constant), or that pass through a helper's ...any parameter, are not
// seen.
func logKeys(fset *token.FileSet, f *ast.File) []logKey {
	slogName, imported := "", map[string]bool{}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		if path == "log/slog" {
			slogName = name
		} else {
			imported[name] = true
		}
	}
	testingVars := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if field, ok := n.(*ast.Field); ok && isTestingType(field.Type) {
			for _, name := range field.Names {
				testingVars[name.Name] = true
			}
		}
		return true
	})
	isSlog := func(sel *ast.SelectorExpr) bool { // slog.Name
		x, ok := sel.X.(*ast.Ident)
		return ok && slogName != "" && x.Name == slogName
	}
	isSlogCall := func(e ast.Expr) bool { // slog.String("k", v) and the like: an Attr
		c, ok := e.(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := c.Fun.(*ast.SelectorExpr)
		return ok && isSlog(sel)
	}
	// pairSlices are the names given a []any literal (`args := []any{"pod", name}`): slices of
	// pairs built up for a log call, whose appends add pairs too.
	pairSlices := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == len(as.Rhs) {
			for i, rhs := range as.Rhs {
				if id, ok := as.Lhs[i].(*ast.Ident); ok && isAnySliceLit(rhs) {
					pairSlices[id.Name] = true
				}
			}
		}
		return true
	})
	var keys []logKey
	literal := func(e ast.Expr) {
		if l, ok := e.(*ast.BasicLit); ok && l.Kind == token.STRING {
			s, err := strconv.Unquote(l.Value)
			if err == nil {
				keys = append(keys, logKey{fset.Position(l.Pos()), s})
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			if sel, ok := n.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Attr" && isSlog(sel) {
				for _, elt := range n.Elts {
					if kv, ok := elt.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Key" {
							literal(kv.Value)
						}
					}
				}
			}
		case *ast.AssignStmt:
			for i, rhs := range n.Rhs {
				if id, ok := n.Lhs[min(i, len(n.Lhs)-1)].(*ast.Ident); ok && pairSlices[id.Name] && isAnySliceLit(rhs) {
					for j := 0; j < len(rhs.(*ast.CompositeLit).Elts); j += 2 {
						literal(rhs.(*ast.CompositeLit).Elts[j])
					}
				}
			}
		case *ast.CallExpr:
			if fn, ok := n.Fun.(*ast.Ident); ok && fn.Name == "append" && len(n.Args) > 1 {
				if x, ok := n.Args[0].(*ast.Ident); ok && pairSlices[x.Name] {
					for i := 1; i < len(n.Args); i += 2 {
						literal(n.Args[i])
					}
				}
				return true
			}
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if isSlog(sel) && attrConstructors[sel.Sel.Name] && len(n.Args) > 0 {
				literal(n.Args[0])
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && (imported[x.Name] || testingVars[x.Name]) {
				return true
			}
			from, ok := keyArgsFrom[sel.Sel.Name]
			if !ok {
				return true
			}
			// slog's pairing: a string is a key and the next argument its value; an Attr stands
			// alone. A non-literal that is not one of slog's constructors is taken for a key.
			for i := from; i < len(n.Args); i += 2 {
				if isSlogCall(n.Args[i]) {
					i--
					continue
				}
				literal(n.Args[i])
			}
		}
		return true
	})
	return keys
}

// isAnySliceLit says whether e is a []any (or []interface{}) literal.
func isAnySliceLit(e ast.Expr) bool {
	c, ok := e.(*ast.CompositeLit)
	if !ok {
		return false
	}
	arr, ok := c.Type.(*ast.ArrayType)
	if !ok || arr.Len != nil {
		return false
	}
	switch elt := arr.Elt.(type) {
	case *ast.Ident:
		return elt.Name == "any"
	case *ast.InterfaceType:
		return len(elt.Methods.List) == 0
	}
	return false
}

// isTestingType says whether a parameter's type is *testing.T, *testing.B, *testing.F or
// testing.TB, whose Error and Log methods are not slog's.
func isTestingType(e ast.Expr) bool {
	if star, ok := e.(*ast.StarExpr); ok {
		e = star.X
	}
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "testing" && strings.Contains(" T B F TB ", " "+sel.Sel.Name+" ")
}

// logKeyProblems names every key in src (a Go file called name) that is not in logKeyStyle.
func logKeyProblems(name string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	keys := logKeys(fset, f)
	slices.SortFunc(keys, func(a, b logKey) int { return a.pos.Offset - b.pos.Offset })
	var problems []string
	for _, k := range keys {
		if !logKeyStyle.MatchString(k.key) {
			problems = append(problems, fmt.Sprintf("%s: log key %q is not snake_case (lower-case words joined by _, CONTRIBUTING.md's Style)", k.pos, k.key))
		}
	}
	return problems, nil
}

func TestLogKeyProblems(t *testing.T) {
	src := `package p

import (
	"log/slog"
	"net/http"
	"testing"
)

func f(log *slog.Logger, w http.ResponseWriter, t *testing.T) {
	log.Info("rules written", "api_requests", 0, "closeWaitSecs", 0)
	log.With("runtimePath", "/run").Debug("m", slog.String("containerID", "c"), "pod", "web", "Bad Key", 1)
	log.Log(nil, slog.LevelInfo, "m", "trace_id", "x", "podGET", 1)
	slog.Warn("m", "lockFiles", 2)
	_ = slog.Attr{Key: "auditPeriod"}
	http.Error(w, "The API server is down", 503)
	t.Error("got", "NotAKey")
	log.Error("m", "error", nil)
	args := []any{"pod", "web", "namespaceError", "x"}
	args = append(args, "retry_in", 1, "hintText", "y")
	log.Info("m", args...)
	argv := []string{"-w"}
	argv = append(argv, "--Wait", "1")
}
`
	got, err := logKeyProblems("p.go", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`p.go:10:47: log key "closeWaitSecs"`,
		`p.go:11:11: log key "runtimePath"`,
		`p.go:11:57: log key "containerID"`,
		`p.go:11:92: log key "Bad Key"`,
		`p.go:12:53: log key "podGET"`,
		`p.go:13:17: log key "lockFiles"`,
		`p.go:14:21: log key "auditPeriod"`,
		`p.go:18:30: log key "namespaceError"`,
		`p.go:19:37: log key "hintText"`,
	}
	if len(got) != len(want) {
		t.Fatalf("problems:\n%s\nwant %d, beginning:\n%s", strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]+" is not snake_case") {
			t.Errorf("problem %d = %q, want %q...", i, got[i], want[i])
		}
	}
}

// TestLogKeysSnakeCase holds every tracked Go file's slog keys to logKeyStyle.
func TestLogKeysSnakeCase(t *testing.T) {
	paths := trackedFiles(t, "../..")
	files := 0
	for _, p := range paths {
		if !strings.HasSuffix(p, ".go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join("../..", p))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		files++
		problems, err := logKeyProblems(p, src)
		if err != nil {
			t.Errorf("parse %s: %v", p, err)
		}
		for _, msg := range problems {
			t.Error(msg)
		}
	}
	if files < 100 {
		t.Fatalf("read %d Go files; not the repository", files)
	}
}
