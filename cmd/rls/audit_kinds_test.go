package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/audit"
)

// moduleRoot is the sluice module's directory, from cmd/rls.
const moduleRoot = "../.."

// auditKindConsts returns the string constants named Kind* of package
// audit, by name.
func auditKindConsts(t *testing.T) map[string]string {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), filepath.Join(moduleRoot, "audit"), func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range pkgs["audit"].Files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && strings.HasPrefix(n.Name, "Kind") && lit.Kind == token.STRING {
						out[n.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
		}
	}
	if len(out) < 8 {
		t.Fatalf("package audit declares %d Kind constants, want at least 8: %v", len(out), out)
	}
	return out
}

// TestAuditKindAcceptsEveryKindWritten: every audit kind the module's code
// names (audit.KindX anywhere outside tests, and every Kind constant of
// package audit) is in audit.Kinds, accepted by rls audit --kind and listed
// in its help; no audit.Event is built with a literal kind. A kind added to
// the code but not to the list fails here, so --kind cannot drift from what
// the trail holds.
func TestAuditKindAcceptsEveryKindWritten(t *testing.T) {
	consts := auditKindConsts(t)
	used := map[string]string{} // kind → a file naming it
	for name, v := range consts {
		used[v] = "audit/" + name
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != moduleRoot && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || hasGoMod(path)) {
				return filepath.SkipDir // another module, or not code
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "audit" && strings.HasPrefix(x.Sel.Name, "Kind") && x.Sel.Name != "Kinds" {
					v, ok := consts[x.Sel.Name]
					if !ok {
						t.Errorf("%s: audit.%s is no string constant of package audit", fset.Position(x.Pos()), x.Sel.Name)
					}
					used[v] = fset.Position(x.Pos()).String()
				}
			case *ast.CompositeLit:
				if sel, ok := x.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Event" {
					for _, e := range x.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok && isIdent(kv.Key, "Kind") {
							if _, lit := kv.Value.(*ast.BasicLit); lit {
								t.Errorf("%s: audit.Event with a literal kind; use a Kind constant of package audit", fset.Position(kv.Pos()))
							}
						}
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := used[audit.KindAdaptiveTrigger]; !ok {
		t.Fatalf("the scan found no use of audit.KindAdaptiveTrigger: %v", used)
	}
	_, _, help := runRLS(t, nil, "audit", "-h")
	listed := map[string]bool{}
	for _, k := range audit.Kinds() {
		listed[k] = true
	}
	for kind, where := range used {
		if !listed[kind] {
			t.Errorf("kind %q (%s) is not in audit.Kinds()", kind, where)
		}
		if err := checkKind(kind); err != nil {
			t.Errorf("rls audit --kind %q (%s): %v", kind, where, err)
		}
		if !strings.Contains(help, kind) {
			t.Errorf("rls audit -h does not list kind %q (%s)", kind, where)
		}
	}
	if err := checkKind("adaptive.*"); err != nil {
		t.Errorf("--kind 'adaptive.*' (docs/adaptive.md): %v", err)
	}
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// hasGoMod reports whether dir holds a go.mod: a module of its own.
func hasGoMod(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	return err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module"))
}
