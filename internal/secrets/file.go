package secrets

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/csisupd/csisupd/internal/safefile"
)

// Class is a class of CSI operation: a block of a secrets file.
type Class string

// The classes of a secrets file, one block each.
const (
	Default     Class = "default"
	Controller  Class = "controller"
	NodeStage   Class = "node_stage"
	NodePublish Class = "node_publish"
	NodeExpand  Class = "node_expand"
	Snapshot    Class = "snapshot"
)

// classes are the blocks a secrets file may hold, in the order errors
// list them.
var classes = []Class{Default, Controller, NodeStage, NodePublish, NodeExpand, Snapshot}

// MaxFileSize caps a secrets file: secrets are tokens and keys, not data.
const MaxFileSize = 64 << 10

// File is one plugin's secrets file, read and checked.
type File struct {
	path    string
	classes map[Class]map[string]string
}

// Path is the file's path.
func (f *File) Path() string { return f.path }

// For returns the secrets of class c: c's block merged over default. The
// map is the caller's.
func (f *File) For(c Class) map[string]string {
	out := maps.Clone(f.classes[Default])
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, f.classes[c])
	return out
}

// Keys returns the attribute names of each block present, sorted: what
// status output and logs may show of a file.
func (f *File) Keys() map[Class][]string {
	out := make(map[Class][]string, len(f.classes))
	for c, kv := range f.classes {
		out[c] = slices.Sorted(maps.Keys(kv))
	}
	return out
}

// Load reads the secrets file at path after checking who may read it
// (package safefile, a private file): it must be a regular file of root
// or of this process's user, with no permission for group or others, in
// directories that only root or that user can change; a symlink is
// resolved and its target checked. A FIFO, device, socket or directory is
// refused before anything opens it, and the read is bounded in size
// (MaxFileSize) and time (safefile.DefaultTimeout).
func Load(path string) (*File, error) {
	src, err := safefile.Read(context.Background(), path, safefile.Spec{What: "secrets file", MaxSize: MaxFileSize, Private: true})
	if err != nil {
		return nil, err
	}
	return Parse(path, src)
}

// Parse reads a secrets file's content; name is its path in errors.
// Errors name the line and the block or attribute, never a value.
func Parse(name string, src []byte) (*File, error) {
	file, diags := hclsyntax.ParseConfig(src, name, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, diagError(diags)
	}
	body, ok := file.Body.(*hclsyntax.Body)
	if !ok {
		return nil, fmt.Errorf("secrets file %s: not HCL native syntax", name)
	}
	var errs []error
	for _, attr := range sortedAttributes(body) {
		errs = append(errs, fmt.Errorf("%s: %q: a secrets file holds only blocks (%s)", at(attr.NameRange), attr.Name, classList()))
	}
	f := &File{path: name, classes: map[Class]map[string]string{}}
	for _, b := range body.Blocks {
		c := Class(b.Type)
		if !slices.Contains(classes, c) {
			errs = append(errs, fmt.Errorf("%s: unknown block %q; the blocks are %s", at(b.TypeRange), b.Type, classList()))
			continue
		}
		if len(b.Labels) > 0 {
			errs = append(errs, fmt.Errorf("%s: block %q takes no label", at(b.TypeRange), b.Type))
			continue
		}
		if _, dup := f.classes[c]; dup {
			errs = append(errs, fmt.Errorf("%s: block %q given twice", at(b.TypeRange), b.Type))
			continue
		}
		kv, err := blockSecrets(b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f.classes[c] = kv
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("secrets file %s: %w", name, err)
	}
	return f, nil
}

// blockSecrets returns the string attributes of b.
func blockSecrets(b *hclsyntax.Block) (map[string]string, error) {
	var errs []error
	for _, nested := range b.Body.Blocks {
		errs = append(errs, fmt.Errorf("%s: block %q holds attributes only, not block %q", at(nested.TypeRange), b.Type, nested.Type))
	}
	kv := make(map[string]string, len(b.Body.Attributes))
	for _, attr := range sortedAttributes(b.Body) {
		v, diags := attr.Expr.Value(nil)
		switch {
		case diags.HasErrors():
			errs = append(errs, fmt.Errorf("%s: %s.%s: not a constant string", at(attr.NameRange), b.Type, attr.Name))
		case v.IsNull() || !v.IsKnown() || v.Type() != cty.String:
			errs = append(errs, fmt.Errorf("%s: %s.%s: must be a string", at(attr.NameRange), b.Type, attr.Name))
		default:
			kv[attr.Name] = v.AsString()
		}
	}
	return kv, errors.Join(errs...)
}

// sortedAttributes returns body's attributes in file order, so that
// errors come in the order the file reads.
func sortedAttributes(body *hclsyntax.Body) []*hclsyntax.Attribute {
	out := slices.Collect(maps.Values(body.Attributes))
	slices.SortFunc(out, func(a, b *hclsyntax.Attribute) int { return a.NameRange.Start.Byte - b.NameRange.Start.Byte })
	return out
}

// at names a place in a file as line:column.
func at(r hcl.Range) string { return fmt.Sprintf("line %d:%d", r.Start.Line, r.Start.Column) }

// diagError turns HCL's syntax errors into one error of places and
// summaries: a diagnostic's detail may quote the source, which holds
// secret values.
func diagError(diags hcl.Diagnostics) error {
	var errs []error
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		place := "secrets file"
		if d.Subject != nil {
			place = fmt.Sprintf("secrets file %s: %s", d.Subject.Filename, at(*d.Subject))
		}
		errs = append(errs, fmt.Errorf("%s: %s", place, d.Summary))
	}
	return errors.Join(errs...)
}

func classList() string {
	names := make([]string, len(classes))
	for i, c := range classes {
		names[i] = string(c)
	}
	return strings.Join(names, ", ")
}
