package volspec

import (
	"errors"
	"fmt"
	"sort"

	"github.com/csisupd/csisupd/internal/hcldiag"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// value evaluates an argument: constants only, no variables or functions.
func (d *decoder) value(attr *hclsyntax.Attribute, key string) (cty.Value, bool) {
	val, diags := attr.Expr.Value(nil)
	if diags.HasErrors() {
		d.errs = append(d.errs, fileError{attr.SrcRange, hcldiag.Error(key, diags)})
		return cty.NilVal, false
	}
	if !val.IsWhollyKnown() {
		d.errorf(attr.SrcRange, "%s: the value is not known", key)
		return cty.NilVal, false
	}
	if val.IsNull() {
		d.errorf(attr.SrcRange, "%s: null; remove the key instead", key)
		return cty.NilVal, false
	}
	return val, true
}

// str evaluates an argument to a string.
func (d *decoder) str(attr *hclsyntax.Attribute, key string) (string, bool) {
	val, ok := d.value(attr, key)
	if !ok {
		return "", false
	}
	s, err := toString(val)
	if err != nil {
		d.errorf(attr.SrcRange, "%s: %v", key, err)
		return "", false
	}
	return s, true
}

// toString converts a primitive value to a string; numbers and bools
// become their text, as HCL 1 read them into Nomad's string maps.
func toString(val cty.Value) (string, error) {
	if val.IsNull() {
		return "", errors.New("null; remove the key instead")
	}
	if !val.Type().IsPrimitiveType() {
		return "", fmt.Errorf("expected a string, got %s", describe(val))
	}
	v, err := convert.Convert(val, cty.String)
	if err != nil || !v.IsKnown() {
		return "", fmt.Errorf("expected a string, got %s", describe(val))
	}
	return v.AsString(), nil
}

// describe names the type of val, and its value when it is a primitive.
func describe(val cty.Value) string {
	t := val.Type()
	switch {
	case !val.IsKnown() || val.IsNull():
		return t.FriendlyName()
	case t == cty.String:
		return fmt.Sprintf("string %q", val.AsString())
	case t == cty.Number:
		return "number " + val.AsBigFloat().Text('g', -1)
	case t == cty.Bool:
		return fmt.Sprintf("bool %t", val.True())
	case t.IsTupleType() || t.IsListType() || t.IsSetType():
		return "a list"
	case t.IsObjectType() || t.IsMapType():
		return "an object"
	default:
		return t.FriendlyName()
	}
}

// sortedAttrs returns a body's arguments in file order: hclsyntax keeps
// them in a map, and problems are easier to read in the order written.
func sortedAttrs(attrs hclsyntax.Attributes) []*hclsyntax.Attribute {
	out := make([]*hclsyntax.Attribute, 0, len(attrs))
	for _, a := range attrs {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SrcRange.Start.Byte < out[j].SrcRange.Start.Byte })
	return out
}
