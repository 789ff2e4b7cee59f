package iptables

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestStepsLiveInTheirFeatureFile holds the layout docs/rule-features.md describes: each step
// type is declared in a step_*.go file with every one of its methods (constructor, iptables and
// nftables renderings side by side), and the renderers (XTRules, NFT) name no step type, so a
// feature is one file, not a case in each renderer.
func TestStepsLiveInTheirFeatureFile(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	typeFile := map[string]string{}      // type name -> file declaring it
	methodFiles := map[string][]string{} // receiver type -> files declaring its methods
	renders := map[string]bool{}         // types with an xtRules method: the steps
	idents := map[string]map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		idents[name] = map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok {
				idents[name][id.Name] = true
			}
			return true
		})
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok {
						typeFile[ts.Name.Name] = name
					}
				}
			case *ast.FuncDecl:
				if d.Recv != nil {
					if id, ok := d.Recv.List[0].Type.(*ast.Ident); ok {
						methodFiles[id.Name] = append(methodFiles[id.Name], name)
						renders[id.Name] = renders[id.Name] || d.Name.Name == "xtRules"
					}
				}
			}
		}
	}
	var steps []string
	for recv := range renders {
		if renders[recv] {
			steps = append(steps, recv)
		}
	}
	if len(steps) < 10 {
		t.Fatalf("found %d step types (%v); want one per kind of step", len(steps), steps)
	}
	for _, s := range steps {
		file := typeFile[s]
		if !strings.HasPrefix(file, "step_") {
			t.Errorf("step type %s is declared in %s, not in its feature's step_*.go file", s, file)
		}
		for _, mf := range methodFiles[s] {
			if mf != file {
				t.Errorf("step type %s is declared in %s but has a method in %s", s, file, mf)
			}
		}
		for _, renderer := range []string{"nft.go", "ruleset.go"} {
			if idents[renderer][s] {
				t.Errorf("%s names the step type %s: renderers loop over steps, each feature renders itself", renderer, s)
			}
		}
	}
}
