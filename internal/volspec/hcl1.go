package volspec

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/csisupd/csisupd/internal/hcldiag"
	hcl1ast "github.com/hashicorp/hcl/hcl/ast"
	hcl1parser "github.com/hashicorp/hcl/hcl/parser"
	hcl1strconv "github.com/hashicorp/hcl/hcl/strconv"
	hcl1token "github.com/hashicorp/hcl/hcl/token"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// parseHCL1 parses src as HCL 1, the syntax Nomad reads volume files in,
// and returns it as the HCL 2 body the decoder reads, with the positions
// of the file. Problems of the conversion (a key set twice, a value HCL
// 2 has no literal for) come back as file errors; an error means src is
// not HCL 1 either.
func parseHCL1(filename string, src []byte) (body *hclsyntax.Body, errs []fileError, err error) {
	defer func() {
		// HCL 1's parser and its token values panic on some malformed
		// input; such a file is simply not HCL 1.
		if r := recover(); r != nil {
			body, errs, err = nil, nil, fmt.Errorf("%s: not HCL: %v", filename, r)
		}
	}()
	file, err := hcl1parser.Parse(src)
	if err != nil {
		var pe *hcl1parser.PosError
		if errors.As(err, &pe) {
			// HCL 1 repeats the position in some messages ("Unknown
			// token: 8:13 IDENT foo"); the line leads already.
			msg := tokenPos.ReplaceAllString(pe.Err.Error(), "")
			return nil, nil, fmt.Errorf("%s:%d: %s", filename, pe.Pos.Line, msg)
		}
		return nil, nil, fmt.Errorf("%s: %w", filename, err)
	}
	list, ok := file.Node.(*hcl1ast.ObjectList)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not a volume specification: the file is not a list of keys", filename)
	}
	c := &hcl1conv{filename: filename}
	return c.body(list, hcl.Range{Filename: filename, Start: hcl.InitialPos, End: hcl.InitialPos}), c.errs, nil
}

// tokenPos matches the "line:column " HCL 1 puts before a token it
// quotes in an error.
var tokenPos = regexp.MustCompile(`\b\d+:\d+ `)

// hcl1conv converts HCL 1's syntax tree into HCL 2's.
type hcl1conv struct {
	filename string
	errs     []fileError
}

func (c *hcl1conv) errorf(at hcl.Range, format string, args ...any) {
	c.errs = append(c.errs, fileError{at, fmt.Errorf("%s: "+format, append([]any{hcldiag.Pos(at)}, args...)...)})
}

// rng returns the range of a token of length n starting at p.
func (c *hcl1conv) rng(p hcl1token.Pos, n int) hcl.Range {
	start := hcl.Pos{Line: p.Line, Column: p.Column, Byte: p.Offset}
	end := hcl.Pos{Line: p.Line, Column: p.Column + n, Byte: p.Offset + n}
	return hcl.Range{Filename: c.filename, Start: start, End: end}
}

// key returns the text of an object key, without its quotes.
func (c *hcl1conv) key(k *hcl1ast.ObjectKey) (string, hcl.Range, error) {
	at := c.rng(k.Token.Pos, len(k.Token.Text))
	if k.Token.Type == hcl1token.STRING {
		s, err := hcl1strconv.Unquote(k.Token.Text)
		if err != nil {
			return "", at, fmt.Errorf("key %s: %w", k.Token.Text, err)
		}
		return s, at, nil
	}
	return k.Token.Text, at, nil
}

// body converts a list of items: an item with "=" is an argument, one
// without is a block whose further keys are its labels.
func (c *hcl1conv) body(list *hcl1ast.ObjectList, whole hcl.Range) *hclsyntax.Body {
	b := &hclsyntax.Body{Attributes: hclsyntax.Attributes{}, SrcRange: whole, EndRange: whole}
	for _, item := range list.Items {
		if len(item.Keys) == 0 {
			continue
		}
		names := make([]string, len(item.Keys))
		ranges := make([]hcl.Range, len(item.Keys))
		bad := false
		for i, k := range item.Keys {
			var err error
			names[i], ranges[i], err = c.key(k)
			if err != nil {
				c.errorf(ranges[i], "%v", err)
				bad = true
			}
		}
		if bad {
			continue
		}
		obj, isObj := item.Val.(*hcl1ast.ObjectType)
		if isObj && !item.Assign.IsValid() {
			inner := c.rng(obj.Lbrace, 1)
			inner.End = c.rng(obj.Rbrace, 1).End
			b.Blocks = append(b.Blocks, &hclsyntax.Block{
				Type: names[0], Labels: names[1:], Body: c.body(obj.List, inner),
				TypeRange: ranges[0], LabelRanges: ranges[1:],
				OpenBraceRange: c.rng(obj.Lbrace, 1), CloseBraceRange: c.rng(obj.Rbrace, 1),
			})
			continue
		}
		if len(names) > 1 {
			c.errorf(ranges[0], "%s: a key followed by %q takes a block, not a value", names[0], names[1])
			continue
		}
		if first, dup := b.Attributes[names[0]]; dup {
			c.errorf(ranges[0], "duplicate %s (first at line %d): set it once", names[0], first.NameRange.Start.Line)
			continue
		}
		expr, ok := c.expr(item.Val, names[0])
		if !ok {
			continue
		}
		b.Attributes[names[0]] = &hclsyntax.Attribute{
			Name: names[0], Expr: expr, NameRange: ranges[0],
			SrcRange: hcl.RangeBetween(ranges[0], expr.Range()),
		}
	}
	return b
}

// expr converts a value: a literal, a list or an object. key names it in
// errors.
func (c *hcl1conv) expr(n hcl1ast.Node, key string) (hclsyntax.Expression, bool) {
	switch v := n.(type) {
	case *hcl1ast.LiteralType:
		at := c.rng(v.Token.Pos, len(v.Token.Text))
		val, err := literal(v.Token)
		if err != nil {
			c.errorf(at, "%s: %v", key, err)
			return nil, false
		}
		return &hclsyntax.LiteralValueExpr{Val: val, SrcRange: at}, true
	case *hcl1ast.ListType:
		at := c.rng(v.Lbrack, 1)
		at.End = c.rng(v.Rbrack, 1).End
		return tuple(at, c.rng(v.Lbrack, 1), v.List, key, c.expr)
	case *hcl1ast.ObjectType:
		at := c.rng(v.Lbrace, 1)
		at.End = c.rng(v.Rbrace, 1).End
		obj := &hclsyntax.ObjectConsExpr{SrcRange: at, OpenRange: c.rng(v.Lbrace, 1)}
		seen := map[string]int{}
		for _, item := range v.List.Items {
			if len(item.Keys) != 1 {
				c.errorf(at, "%s: expected key = value pairs", key)
				return nil, false
			}
			name, kat, err := c.key(item.Keys[0])
			if err != nil {
				c.errorf(kat, "%s: %v", key, err)
				return nil, false
			}
			if line, dup := seen[name]; dup {
				c.errorf(kat, "%s: duplicate key %q (first at line %d)", key, name, line)
				return nil, false
			}
			seen[name] = kat.Start.Line
			val, ok := c.expr(item.Val, key+"."+name)
			if !ok {
				return nil, false
			}
			obj.Items = append(obj.Items, hclsyntax.ObjectConsItem{
				KeyExpr:   &hclsyntax.ObjectConsKeyExpr{Wrapped: &hclsyntax.LiteralValueExpr{Val: cty.StringVal(name), SrcRange: kat}},
				ValueExpr: val,
			})
		}
		return obj, true
	default:
		c.errorf(c.rng(n.Pos(), 1), "%s: unsupported value", key)
		return nil, false
	}
}

// literal returns the value of an HCL 1 literal token.
func literal(t hcl1token.Token) (cty.Value, error) {
	switch t.Type {
	case hcl1token.STRING:
		s, err := hcl1strconv.Unquote(t.Text)
		if err != nil {
			return cty.NilVal, fmt.Errorf("string %s: %w", t.Text, err)
		}
		return cty.StringVal(s), nil
	case hcl1token.HEREDOC:
		s, ok := t.Value().(string)
		if !ok {
			return cty.NilVal, errors.New("heredoc does not hold a string")
		}
		return cty.StringVal(s), nil
	case hcl1token.NUMBER, hcl1token.FLOAT:
		v, err := cty.ParseNumberVal(t.Text)
		if err != nil {
			return cty.NilVal, fmt.Errorf("number %s: %w", t.Text, err)
		}
		return v, nil
	case hcl1token.BOOL:
		return cty.BoolVal(t.Text == "true"), nil
	default:
		return cty.NilVal, fmt.Errorf("%s is not a value: quote strings (%q)", t.Text, strings.Trim(t.Text, `"`))
	}
}

// tuple converts the elements of a list with conv into a tuple expression
// at at, opened at open; key[i] names each element in errors.
func tuple[E any](at, open hcl.Range, elems []E, key string, conv func(E, string) (hclsyntax.Expression, bool)) (hclsyntax.Expression, bool) {
	t := &hclsyntax.TupleConsExpr{SrcRange: at, OpenRange: open}
	for i, e := range elems {
		x, ok := conv(e, fmt.Sprintf("%s[%d]", key, i))
		if !ok {
			return nil, false
		}
		t.Exprs = append(t.Exprs, x)
	}
	return t, true
}
