package hygiene

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// notProduct are the directories, relative to the module root, whose code no product binary
// links: the test harness (test/) and the release tooling (tools/, a module of its own). Their
// functions are not held to MaxFuncLines.
var notProduct = []string{
	"test",
	"tools",
}

// longFunc is one function whose body runs past MaxFuncLines.
type longFunc struct {
	pos   token.Position
	name  string
	lines int
}

func (f longFunc) String() string {
	return fmt.Sprintf("%s:%d: %s runs %d lines (at most %d)", f.pos.Filename, f.pos.Line, f.name, f.lines, MaxFuncLines)
}

// bodyLines counts the lines strictly between a body's braces.
func bodyLines(fset *token.FileSet, body *ast.BlockStmt) int {
	open, close := fset.Position(body.Lbrace).Line, fset.Position(body.Rbrace).Line
	return max(close-open-1, 0)
}

// funcName names a declared function as a reader searches for it: Recv.Name for a method.
func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	t := d.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch r := t.(type) {
	case *ast.IndexExpr: // a generic receiver, T[P]
		t = r.X
	case *ast.IndexListExpr:
		t = r.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + d.Name.Name
	}
	return d.Name.Name
}

// longFuncs lists the functions and function literals of one file's source that run past max
// lines. A literal is named by its line and the function holding it, if any, so a long closure
// inside a short function is still found.
func longFuncs(filename string, src any, max int) ([]longFunc, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var found []longFunc
	check := func(name string, body *ast.BlockStmt) {
		if body == nil {
			return // an assembly or linkname declaration
		}
		if n := bodyLines(fset, body); n > max {
			found = append(found, longFunc{fset.Position(body.Lbrace), name, n})
		}
	}
	for _, decl := range f.Decls {
		prefix := "" // a literal in a package-level var is named by its line alone
		if d, ok := decl.(*ast.FuncDecl); ok {
			prefix = funcName(d) + "'s "
			check(funcName(d), d.Body)
		}
		ast.Inspect(decl, func(n ast.Node) bool {
			if lit, ok := n.(*ast.FuncLit); ok {
				check(fmt.Sprintf("%sfunc literal at line %d", prefix, fset.Position(lit.Body.Lbrace).Line), lit.Body)
			}
			return true
		})
	}
	return found, nil
}

func TestLongFuncs(t *testing.T) {
	long := func(n int) string { return strings.Repeat("\t_ = 0\n", n) }
	src := "package p\n\n" +
		"func Short() {\n" + long(MaxFuncLines) + "}\n\n" +
		"type T[P any] struct{}\n\n" +
		"func (t *T[P]) Long() {\n" + long(MaxFuncLines+1) + "}\n\n" +
		"func Holder() {\n\tf := func() {\n" + long(MaxFuncLines+2) + "\t}\n\t_ = f\n}\n\n" +
		"var v = func() {\n" + long(MaxFuncLines+3) + "}\n"
	got, err := longFuncs("p.go", src, MaxFuncLines)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range got {
		names = append(names, f.String())
	}
	// Holder itself is MaxFuncLines+5 lines: its literal makes it long too.
	want := []string{
		"p.go:88: T.Long runs 81 lines (at most 80)",
		"p.go:172: Holder runs 85 lines (at most 80)",
		"p.go:173: Holder's func literal at line 173 runs 82 lines (at most 80)",
		"p.go:260: func literal at line 260 runs 83 lines (at most 80)",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Errorf("longFuncs:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
}

// TestProductFuncLength holds every product function (outside _test.go files and notProduct) to
// MaxFuncLines, naming each one that runs past it.
func TestProductFuncLength(t *testing.T) {
	const root = "../.."
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator)))
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "bin") {
				return filepath.SkipDir
			}
			for _, p := range notProduct {
				if rel == p {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		checked++
		found, err := longFuncs(path, nil, MaxFuncLines)
		if err != nil {
			return err
		}
		for _, f := range found {
			f.pos.Filename = rel
			t.Error(f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked %d Go files under %s; not the repository", checked, root)
	}
}
