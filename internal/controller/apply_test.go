package controller

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// Every write of the reconcilers goes through apply.go, so that how each kind of object is
// written (applied, created, patched under its resourceVersion, status by owner) is decided once.
func TestWritesOnlyInApplyGo(t *testing.T) {
	writes := map[string]bool{"Create": true, "Update": true, "Patch": true, "Delete": true, "DeleteAllOf": true, "Apply": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if name == "apply.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && writes[sel.Sel.Name] {
					t.Errorf("%s: %s outside apply.go", fset.Position(call.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
