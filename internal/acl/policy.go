package acl

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/csisupd/csisupd/internal/hcldiag"
)

// MaxPolicyBytes caps the HCL source of one policy. Policies are kept in
// the replicated state; real ones are a few lines.
const MaxPolicyBytes = 64 << 10

// maxPolicyName is the longest policy name.
const maxPolicyName = 128

// policyArg is the one argument of a rule block.
const policyArg = "policy"

// Policy is a parsed policy: a name, a description and one level per
// resource it has a rule for. Rules hold no LevelNone entries.
type Policy struct {
	Name        string
	Description string
	Rules       map[Resource]Level
}

// ValidatePolicyName checks a policy name: 1 to 128 letters, digits, '_'
// and '-', starting with a letter or digit.
func ValidatePolicyName(name string) error {
	if name == "" {
		return errors.New("acl: policy name is empty")
	}
	if len(name) > maxPolicyName {
		return fmt.Errorf("acl: policy name %q is %d characters, at most %d are allowed", name, len(name), maxPolicyName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			return fmt.Errorf("acl: policy name %q: character %q at %d is not allowed (letters, digits, '_' and '-', starting with a letter or digit)", name, c, i)
		}
	}
	return nil
}

// ParsePolicy parses the HCL rules src of the policy name; filename names
// src in errors. Each problem is reported as "filename:line: ..." naming
// the block and argument: a resource that is not one of Resources, an
// argument other than policy, a block label, a nested block, a resource's
// second block, a missing policy argument and a level other than deny,
// read or write. All problems are returned, joined, in file order. Empty
// rules are valid: the policy denies everything.
func ParsePolicy(name, filename string, src []byte) (*Policy, error) {
	if err := ValidatePolicyName(name); err != nil {
		return nil, err
	}
	if len(src) > MaxPolicyBytes {
		return nil, fmt.Errorf("%s: policy %s is %d bytes, at most %d are allowed", filename, name, len(src), MaxPolicyBytes)
	}
	file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, hcldiag.ErrorIn(filename, "", diags)
	}
	body, ok := file.Body.(*hclsyntax.Body)
	if !ok {
		return nil, fmt.Errorf("%s: not in HCL native syntax", filename)
	}
	p := &Policy{Name: name, Rules: map[Resource]Level{}}
	var errs []posError
	for _, attr := range body.Attributes {
		errs = append(errs, posError{attr.NameRange, fmt.Errorf("%s: unsupported argument %q: a policy has only rule blocks (%s)",
			hcldiag.Pos(attr.NameRange), attr.Name, resourceList())})
	}
	seen := map[Resource]hcl.Range{}
	for _, blk := range body.Blocks {
		r := Resource(blk.Type)
		switch {
		case !r.valid():
			errs = append(errs, posError{blk.TypeRange, fmt.Errorf("%s: unsupported block %q: the resources are %s",
				hcldiag.Pos(blk.TypeRange), blk.Type, resourceList())})
			continue
		case len(blk.Labels) > 0:
			errs = append(errs, posError{blk.LabelRanges[0], fmt.Errorf("%s: block %s takes no labels",
				hcldiag.Pos(blk.LabelRanges[0]), blk.Type)})
			continue
		}
		if first, dup := seen[r]; dup {
			errs = append(errs, posError{blk.TypeRange, fmt.Errorf("%s: duplicate block %s (first at line %d): one rule per resource",
				hcldiag.Pos(blk.TypeRange), blk.Type, first.Start.Line)})
			continue
		}
		seen[r] = blk.TypeRange
		l, blkErrs := parseRule(blk)
		errs = append(errs, blkErrs...)
		if l != LevelNone {
			p.Rules[r] = l
		}
	}
	if len(errs) > 0 {
		sort.SliceStable(errs, func(i, j int) bool { return errs[i].at.Start.Byte < errs[j].at.Start.Byte })
		joined := make([]error, len(errs))
		for i, e := range errs {
			joined[i] = e.err
		}
		return nil, errors.Join(joined...)
	}
	return p, nil
}

// parseRule reads the level of one rule block.
func parseRule(blk *hclsyntax.Block) (Level, []posError) {
	var errs []posError
	for _, inner := range blk.Body.Blocks {
		errs = append(errs, posError{inner.TypeRange, fmt.Errorf("%s: unsupported block %q in block %s: a rule has only the argument %s",
			hcldiag.Pos(inner.TypeRange), inner.Type, blk.Type, policyArg)})
	}
	level := LevelNone
	found := false
	for _, attr := range blk.Body.Attributes {
		if attr.Name != policyArg {
			errs = append(errs, posError{attr.NameRange, fmt.Errorf("%s: unsupported argument %q in block %s: a rule has only the argument %s",
				hcldiag.Pos(attr.NameRange), attr.Name, blk.Type, policyArg)})
			continue
		}
		found = true
		// An expression that does not evaluate (a reference, a function
		// call) is reported once, not again as a value of the wrong type.
		var s string
		_, diags := attr.Expr.Value(nil)
		if !diags.HasErrors() {
			diags = gohcl.DecodeExpression(attr.Expr, nil, &s)
		}
		if diags.HasErrors() {
			for _, err := range unjoin(hcldiag.ErrorIn(attr.Expr.Range().Filename, blk.Type+"."+policyArg, diags)) {
				errs = append(errs, posError{attr.Expr.Range(), err})
			}
			continue
		}
		l, err := ParseLevel(s)
		if err != nil {
			errs = append(errs, posError{attr.Expr.Range(), fmt.Errorf("%s: %s.%s: %w", hcldiag.Pos(attr.Expr.Range()), blk.Type, policyArg, err)})
			continue
		}
		level = l
	}
	if !found {
		errs = append(errs, posError{blk.TypeRange, fmt.Errorf("%s: block %s: missing argument %s (deny, read or write)",
			hcldiag.Pos(blk.TypeRange), blk.Type, policyArg)})
	}
	return level, errs
}

// FormatRules writes rules as the HCL of a policy, one block per resource
// in the order of Resources; LevelNone entries and unknown resources are
// left out. ParsePolicy of the result gives the same rules.
func FormatRules(rules map[Resource]Level) string {
	var b strings.Builder
	for _, r := range Resources() {
		l, ok := rules[r]
		if !ok || l == LevelNone || l > LevelWrite {
			continue
		}
		fmt.Fprintf(&b, "%s {\n  %s = %q\n}\n", r, policyArg, l.String())
	}
	return b.String()
}

// posError is a problem at a position of a policy.
type posError struct {
	at  hcl.Range
	err error
}

// resourceList names every resource for error messages.
func resourceList() string {
	rs := Resources()
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// unjoin returns the errors joined in err by errors.Join, or err alone.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
