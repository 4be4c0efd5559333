package hclnest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

func TestCheck(t *testing.T) {
	deep := func(n int, open, close string) string {
		return "x = " + strings.Repeat(open, n) + strings.Repeat(close, n) + "\n"
	}
	tests := []struct {
		name string
		src  string
		want string // "" for accepted
	}{
		{"empty", "", ""},
		{"a real config", "name = \"n\"\nplugin \"ebs\" {\n  mounts {\n    propagation = [\"rshared\"]\n  }\n}\n", ""},
		{"at the cap", deep(MaxDepth, "[", "]"), ""},
		{"one past the cap, lists", deep(MaxDepth+1, "[", "]"), "f.hcl:1: nested deeper than 32 levels"},
		{"objects", "\n\n" + deep(MaxDepth+1, "{a = ", "}"), "f.hcl:3: nested deeper than 32 levels"},
		{"parentheses", deep(MaxDepth+1, "(", ")"), "f.hcl:1: "},
		{"blocks", strings.Repeat("b {\n", MaxDepth+1), fmt.Sprintf("f.hcl:%d: ", MaxDepth+1)},
		{"brackets in strings do not count", "x = \"" + strings.Repeat("{", 100) + "\"\ny = \"\\\"" + strings.Repeat("[", 100) + "\"\n", ""},
		{"brackets in comments do not count", "# " + strings.Repeat("{", 100) + "\n// " + strings.Repeat("[", 100) + "\n/* " + strings.Repeat("(", 100) + "\n*/\nx = 1\n", ""},
		{"lines counted through strings and comments", "/*\n*/\n# c\nx = \"s\"\n" + deep(MaxDepth+1, "[", "]"), "f.hcl:5: "},
		{"the 50,000 deep file", deep(50000, "[", "]"), "f.hcl:1: nested deeper than 32 levels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check("f.hcl", []byte(tt.src))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Check = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.want)):
				t.Fatalf("Check = %v, want an error starting %q", err, tt.want)
			}
		})
	}
}

// What Check accepts at the cap, HCL's parser parses without trouble, and
// Check refuses the 50,000 deep file without allocating.
func TestCheckIsCheap(t *testing.T) {
	src := []byte("x = " + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + "\n")
	if _, diags := hclsyntax.ParseConfig(src, "f.hcl", hcl.InitialPos); diags.HasErrors() {
		t.Fatalf("parse at the cap: %v", diags)
	}
	deep := []byte("x = " + strings.Repeat("{a = ", 50000) + strings.Repeat("}", 50000))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := Check("f.hcl", deep)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("Check accepted the 50,000 deep file")
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("Check allocated %d bytes", got)
	}
}
