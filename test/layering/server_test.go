package layering

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// serverDir is internal/server, from this package's directory.
var serverDir = filepath.Join("..", "..", "internal", "server")

// The shape of the server role that the import table cannot see: the
// Server type stays the wiring of services, forwarding and the leader
// loop, the volume operations stay behind interfaces, and no file grows
// into a hub again.
const (
	maxServerMethods = 30
	maxServerLines   = 600
)

// TestVolumeOpsKnowsNoServer checks that the volume operations import
// neither the server nor gRPC's connections: they reach the agents only
// through their client interfaces.
func TestVolumeOpsKnowsNoServer(t *testing.T) {
	var found bool
	for _, p := range goList(t) {
		if p.path != "internal/server/volumeops" {
			continue
		}
		found = true
		if slices.Contains(p.imports, "internal/server") {
			t.Errorf("internal/server/volumeops imports internal/server: the server wires the volume operations, never the other way")
		}
		if slices.Contains(p.outside, "google.golang.org/grpc") {
			t.Errorf("internal/server/volumeops imports google.golang.org/grpc: its clients are interfaces, and the server implements them with gRPC")
		}
	}
	if !found {
		t.Fatal("go list does not show internal/server/volumeops")
	}
}

// TestVolumeOpsClientsAreInterfaces checks that the fields of
// volumeops.Config through which the operations reach the agents and the
// leader's node record are interfaces declared in volumeops.
func TestVolumeOpsClientsAreInterfaces(t *testing.T) {
	types := map[string]ast.Expr{}
	var config *ast.StructType
	for _, f := range parseDir(t, filepath.Join(serverDir, "volumeops")) {
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				types[ts.Name.Name] = ts.Type
				if st, ok := ts.Type.(*ast.StructType); ok && ts.Name.Name == "Config" {
					config = st
				}
			}
			return true
		})
	}
	if config == nil {
		t.Fatal("internal/server/volumeops declares no Config struct")
	}
	fields := map[string]ast.Expr{}
	for _, f := range config.Fields.List {
		for _, n := range f.Names {
			fields[n.Name] = f.Type
		}
	}
	for _, name := range []string{"Controllers", "NodeVolumes", "Nodes"} {
		typ, ok := fields[name]
		if !ok {
			t.Errorf("volumeops.Config has no field %s", name)
			continue
		}
		id, ok := typ.(*ast.Ident)
		if !ok {
			t.Errorf("volumeops.Config.%s is not a type named in volumeops", name)
			continue
		}
		if _, ok := types[id.Name].(*ast.InterfaceType); !ok {
			t.Errorf("volumeops.Config.%s is of type %s, which is not an interface declared in volumeops", name, id.Name)
		}
	}
}

// TestServerMethods counts the methods of Server in the hand-written
// files of internal/server: the volume work lives in volumeops.
func TestServerMethods(t *testing.T) {
	var methods []string
	for name, f := range parseDir(t, serverDir) {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			typ := fn.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if id, ok := typ.(*ast.Ident); ok && id.Name == "Server" {
				methods = append(methods, filepath.Base(name)+": "+fn.Name.Name)
			}
		}
	}
	if len(methods) == 0 {
		t.Fatal("found no method of Server in internal/server")
	}
	if len(methods) > maxServerMethods {
		slices.Sort(methods)
		t.Errorf("Server has %d methods, more than %d: move the work to the package that does it\n    %s",
			len(methods), maxServerMethods, strings.Join(methods, "\n    "))
	}
}

// TestServerFileLengths checks that no hand-written non-test file under
// internal/server is longer than maxServerLines.
func TestServerFileLengths(t *testing.T) {
	var checked int
	err := filepath.WalkDir(serverDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(data, []byte("\n// Code generated ")) || bytes.HasPrefix(data, []byte("// Code generated ")) {
			return nil
		}
		checked++
		if n := bytes.Count(data, []byte("\n")); n > maxServerLines {
			t.Errorf("%s has %d lines, more than %d: split it by what its parts do", path, n, maxServerLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatalf("found no hand-written Go file under %s", serverDir)
	}
}

// parseDir parses the non-test Go files of one directory, by path.
func parseDir(t *testing.T, dir string) map[string]*ast.File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string]*ast.File{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = f
	}
	return out
}
