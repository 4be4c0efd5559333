package layering

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestFaultTargetRunsEveryFaultTest keeps `make test-fault` honest. The
// target runs only what the fault build tag adds to the default suite: the
// tests named in the Makefile's FAULT_TESTS, in the packages of FAULT_PKGS.
// This test finds those tests in the sources, whatever their names: each
// Test function declared in a file that builds only with the tag, and each
// Test function of an untagged file that uses (directly or through the
// package's functions) a name whose declaration differs with the tag. It
// fails when the Makefile's lists miss one or name one that is not, and
// when a file that is not a test depends on the tag (the fault tag must
// add tests, never change the code under test).
func TestFaultTargetRunsEveryFaultTest(t *testing.T) {
	root := filepath.Join("..", "..")
	vars := makeVars(t, filepath.Join(root, "Makefile"))
	listedPkgs := strings.Fields(vars["FAULT_PKGS"])
	listedTests := strings.Split(strings.Join(strings.Fields(vars["FAULT_TESTS"]), ""), "|")
	if len(listedPkgs) == 0 || len(listedTests) == 0 || listedTests[0] == "" {
		t.Fatalf("the Makefile defines no FAULT_PKGS or FAULT_TESTS")
	}

	found := map[string][]string{} // package directory (./x/y/) -> fault tests
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			tests, err := faultTests(t, path)
			if err != nil {
				return err
			}
			if len(tests) > 0 {
				rel, _ := filepath.Rel(root, path)
				found["./"+filepath.ToSlash(rel)+"/"] = tests
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	var want []string
	for pkg, tests := range found {
		if !slices.Contains(listedPkgs, pkg) {
			t.Errorf("package %s has fault tests %v: add it to FAULT_PKGS in the Makefile", pkg, tests)
		}
		for _, name := range tests {
			want = append(want, name)
			if !slices.Contains(listedTests, name) {
				t.Errorf("%s in %s runs differently with the fault tag: add it to FAULT_TESTS in the Makefile", name, pkg)
			}
		}
	}
	for _, pkg := range listedPkgs {
		if _, ok := found[pkg]; !ok {
			t.Errorf("FAULT_PKGS names %s, which has no test that depends on the fault tag", pkg)
		}
	}
	for _, name := range listedTests {
		if !slices.Contains(want, name) {
			t.Errorf("FAULT_TESTS names %s, which is no test that depends on the fault tag", name)
		}
	}
}

// makeVars returns the variables a Makefile sets with := or =, their
// continued lines joined.
func makeVars(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	set := regexp.MustCompile(`^([A-Z_]+)\s*:?=\s*(.*)$`)
	vars := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if m := set.FindStringSubmatch(line); m != nil {
			vars[m[1]] = m[2]
		}
	}
	return vars
}

// faultTests returns the Test functions of the Go files in dir (not its
// subdirectories) that depend on the fault tag, and fails the test for a
// non-test file that depends on it.
func faultTests(t *testing.T, dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	// Names declared with the tag and, differently, without it: what
	// untagged code can use and still see the tag's effect.
	withTag, withoutTag := map[string]bool{}, map[string]bool{}
	refs := map[string]map[string]bool{}   // function -> the names its body uses
	var onlyTagged, untaggedTests []string // Test functions by where they are declared
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		with, without := buildsWith(f, true), buildsWith(f, false)
		if !with && !without {
			continue // another tag's file
		}
		dependsOnTag := with != without
		if dependsOnTag && !strings.HasSuffix(e.Name(), "_test.go") {
			t.Errorf("%s is built differently with the fault tag: the tag must only add tests", path)
		}
		for _, decl := range f.Decls {
			for _, name := range declared(decl) {
				if dependsOnTag && with {
					withTag[name] = true
				}
				if dependsOnTag && without {
					withoutTag[name] = true
				}
			}
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !with {
				continue
			}
			refs[fn.Name.Name] = used(fn)
			if isTest(fn) {
				if dependsOnTag {
					onlyTagged = append(onlyTagged, fn.Name.Name)
				} else {
					untaggedTests = append(untaggedTests, fn.Name.Name)
				}
			}
		}
	}
	tagged := map[string]bool{}
	for name := range withTag {
		if withoutTag[name] {
			tagged[name] = true
		}
	}
	out := onlyTagged
	for _, name := range untaggedTests {
		if reaches(name, tagged, refs, map[string]bool{}) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// buildsWith reports whether f builds on this platform with the fault tag
// set or not; every other tag but the platform's is unset.
func buildsWith(f *ast.File, fault bool) bool {
	for _, group := range f.Comments {
		if group.Pos() >= f.Package {
			break
		}
		for _, c := range group.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			if err != nil {
				return false
			}
			return expr.Eval(func(tag string) bool {
				switch tag {
				case "fault":
					return fault
				case "linux", "unix", "amd64", "arm64", "gc":
					return true
				}
				return false
			})
		}
	}
	return true
}

// declared returns the package-level names decl declares.
func declared(decl ast.Decl) []string {
	var out []string
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			out = append(out, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			switch s := spec.(type) {
			case *ast.ValueSpec:
				for _, n := range s.Names {
					out = append(out, n.Name)
				}
			case *ast.TypeSpec:
				out = append(out, s.Name.Name)
			}
		}
	}
	return out
}

// used returns the identifiers fn's body names.
func used(fn *ast.FuncDecl) map[string]bool {
	out := map[string]bool{}
	if fn.Body == nil {
		return out
	}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			out[id.Name] = true
		}
		return true
	})
	return out
}

// isTest reports whether fn is a top-level TestXxx(t *testing.T).
func isTest(fn *ast.FuncDecl) bool {
	return strings.HasPrefix(fn.Name.Name, "Test") && fn.Name.Name != "TestMain" &&
		fn.Type.Params != nil && len(fn.Type.Params.List) == 1
}

// reaches reports whether function name uses a tagged name, directly or
// through the package's functions.
func reaches(name string, tagged map[string]bool, refs map[string]map[string]bool, seen map[string]bool) bool {
	if seen[name] {
		return false
	}
	seen[name] = true
	for ref := range refs[name] {
		if tagged[ref] {
			return true
		}
		if _, isFunc := refs[ref]; isFunc && reaches(ref, tagged, refs, seen) {
			return true
		}
	}
	return false
}
