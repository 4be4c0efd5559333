package volspec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/csisupd/csisupd/internal/hcldiag"
)

// isJSON reports whether a file is a volume specification in JSON, as
// Nomad tells them apart: its first character other than white space is
// "{", which no HCL native file starts with, or its name ends in ".json".
func isJSON(filename string, src []byte) bool {
	t := bytes.TrimLeft(src, " \t\r\n")
	return strings.HasSuffix(strings.ToLower(filename), ".json") || (len(t) > 0 && t[0] == '{')
}

// jsonBlocks are the keys whose value, an object or a list of objects, is
// one block or a block each, in whatever object they appear: JSON has no
// blocks, and Nomad reads
//
//	"capability": [{"access_mode": "single-node-writer", ...}]
//
// as two capability blocks would be written in HCL. Every other object is
// an argument's value: the map keys (parameters, secrets, ...) and
// segments, which the decoder takes as arguments or blocks alike.
var jsonBlocks = []string{"capability", "mount_options", "topology_request", "required", "preferred", "topology"}

// parseJSON parses src as a JSON volume specification and returns it as
// the HCL 2 body the decoder reads, with the positions of the file, so
// that its problems are reported at their lines as an HCL file's are.
// Problems of the conversion (a key set twice, a null) come back as file
// errors; an error means src is not JSON.
func parseJSON(filename string, src []byte) (*hclsyntax.Body, []fileError, error) {
	p := &jsonParser{filename: filename, src: src, dec: json.NewDecoder(bytes.NewReader(src))}
	p.dec.UseNumber()
	if !utf8.Valid(src) {
		i := 0
		for i < len(src) {
			r, n := utf8.DecodeRune(src[i:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			i += n
		}
		return nil, nil, fmt.Errorf("%s: not valid UTF-8 (at byte %d)", hcldiag.Pos(p.rng(i, i)), i)
	}
	top, err := p.value()
	if err != nil {
		return nil, nil, err
	}
	if top.kind != '{' {
		return nil, nil, fmt.Errorf("%s: not a volume specification: a JSON file holds one object", hcldiag.Pos(top.at))
	}
	if _, err := p.dec.Token(); err != io.EOF {
		at := p.rng(p.next(), p.next())
		return nil, nil, fmt.Errorf("%s: more after the object that holds the volume specification", hcldiag.Pos(at))
	}
	c := &jsonConv{}
	return c.body(top), c.errs, nil
}

// jsonValue is one value of a JSON file: a literal, an object or an
// array, with where it is.
type jsonValue struct {
	at hcl.Range
	// kind is '{' for an object, '[' for an array, 'n' for null and 0
	// for a literal (val).
	kind    byte
	val     cty.Value
	members []jsonMember
	elems   []*jsonValue
}

// jsonMember is one key of an object and its value.
type jsonMember struct {
	name  string
	at    hcl.Range
	value *jsonValue
}

// jsonParser reads a JSON file into jsonValues. encoding/json reads the
// tokens; the parser keeps their positions.
type jsonParser struct {
	filename string
	src      []byte
	dec      *json.Decoder
}

// next returns the offset where the next token starts: past the white
// space and the separators encoding/json reads with the token.
func (p *jsonParser) next() int {
	i := int(p.dec.InputOffset())
	for i < len(p.src) && strings.IndexByte(" \t\r\n:,", p.src[i]) >= 0 {
		i++
	}
	return i
}

// rng returns the range of the bytes from start to end.
func (p *jsonParser) rng(start, end int) hcl.Range {
	return hcl.Range{Filename: p.filename, Start: p.pos(start), End: p.pos(end)}
}

// pos returns the line and column of a byte offset.
func (p *jsonParser) pos(offset int) hcl.Pos {
	offset = min(offset, len(p.src))
	before := p.src[:offset]
	line := bytes.Count(before, []byte("\n")) + 1
	col := utf8.RuneCount(before[bytes.LastIndexByte(before, '\n')+1:]) + 1
	return hcl.Pos{Line: line, Column: col, Byte: offset}
}

// token reads one token and its range. A syntax error names the line it
// is on.
func (p *jsonParser) token() (json.Token, hcl.Range, error) {
	start := p.next()
	tok, err := p.dec.Token()
	if err != nil {
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			// Offset is at or past the byte that broke the syntax, and
			// no earlier than where the token starts.
			bad := max(start, int(se.Offset)-1)
			at := p.rng(bad, bad+1)
			return nil, at, fmt.Errorf("%s: not JSON: %s", hcldiag.Pos(at), se.Error())
		case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF):
			at := p.rng(len(p.src), len(p.src))
			return nil, at, fmt.Errorf("%s: not JSON: the file ends inside an object or a list", hcldiag.Pos(at))
		}
		return nil, hcl.Range{}, fmt.Errorf("%s: not JSON: %w", p.filename, err)
	}
	return tok, p.rng(start, int(p.dec.InputOffset())), nil
}

// value reads one value, whole.
func (p *jsonParser) value() (*jsonValue, error) {
	tok, at, err := p.token()
	if err != nil {
		return nil, err
	}
	v := &jsonValue{at: at}
	switch t := tok.(type) {
	case json.Delim:
		if t != '{' && t != '[' {
			return nil, fmt.Errorf("%s: not JSON: unexpected %q", hcldiag.Pos(at), string(t))
		}
		v.kind = byte(t)
		if err := p.contents(v); err != nil {
			return nil, err
		}
	case string:
		v.val = cty.StringVal(t)
	case json.Number:
		n, err := cty.ParseNumberVal(t.String())
		if err != nil {
			return nil, fmt.Errorf("%s: number %s: %w", hcldiag.Pos(at), t, err)
		}
		v.val = n
	case bool:
		v.val = cty.BoolVal(t)
	case nil:
		v.kind = 'n'
	}
	return v, nil
}

// contents reads the members of an object or the elements of an array
// up to its closing bracket.
func (p *jsonParser) contents(v *jsonValue) error {
	for p.dec.More() {
		if v.kind == '[' {
			e, err := p.value()
			if err != nil {
				return err
			}
			v.elems = append(v.elems, e)
			continue
		}
		tok, at, err := p.token()
		if err != nil {
			return err
		}
		name, _ := tok.(string) // encoding/json reads only strings as keys
		e, err := p.value()
		if err != nil {
			return err
		}
		v.members = append(v.members, jsonMember{name: name, at: at, value: e})
	}
	_, end, err := p.token()
	if err != nil {
		return err
	}
	v.at.End = end.End
	return nil
}

// jsonConv converts jsonValues into HCL 2's syntax tree.
type jsonConv struct {
	errs []fileError
}

func (c *jsonConv) errorf(at hcl.Range, format string, args ...any) {
	c.errs = append(c.errs, fileError{at, fmt.Errorf("%s: "+format, append([]any{hcldiag.Pos(at)}, args...)...)})
}

// body converts an object into a body: the members jsonBlocks names are
// blocks, the others arguments.
func (c *jsonConv) body(obj *jsonValue) *hclsyntax.Body {
	b := &hclsyntax.Body{Attributes: hclsyntax.Attributes{}, SrcRange: obj.at, EndRange: obj.at}
	for _, m := range obj.members {
		if slices.Contains(jsonBlocks, m.name) {
			if blocks, ok := c.blocks(m); ok {
				b.Blocks = append(b.Blocks, blocks...)
				continue
			}
		}
		if first, dup := b.Attributes[m.name]; dup {
			c.errorf(m.at, "duplicate %s (first at line %d): set it once", m.name, first.NameRange.Start.Line)
			continue
		}
		expr, ok := c.expr(m.value, m.name)
		if !ok {
			continue
		}
		b.Attributes[m.name] = &hclsyntax.Attribute{
			Name: m.name, Expr: expr, NameRange: m.at, SrcRange: hcl.RangeBetween(m.at, expr.Range()),
		}
	}
	return b
}

// blocks returns the blocks a member holds: one for an object, one per
// element for a list of objects. false means the value is neither, and is
// an argument's (which the decoder refuses with a hint).
func (c *jsonConv) blocks(m jsonMember) ([]*hclsyntax.Block, bool) {
	objs := []*jsonValue{m.value}
	if m.value.kind == '[' {
		objs = m.value.elems
	}
	for _, o := range objs {
		if o.kind != '{' {
			return nil, false
		}
	}
	blocks := make([]*hclsyntax.Block, len(objs))
	for i, o := range objs {
		blocks[i] = &hclsyntax.Block{
			Type: m.name, Body: c.body(o), TypeRange: m.at,
			OpenBraceRange: o.at, CloseBraceRange: o.at,
		}
	}
	return blocks, true
}

// expr converts an argument's value; key names it in errors.
func (c *jsonConv) expr(v *jsonValue, key string) (hclsyntax.Expression, bool) {
	switch v.kind {
	case 'n':
		c.errorf(v.at, "%s: null is not a value: leave the key out", key)
		return nil, false
	case '[':
		return tuple(v.at, v.at, v.elems, key, c.expr)
	case '{':
		obj := &hclsyntax.ObjectConsExpr{SrcRange: v.at, OpenRange: v.at}
		seen := map[string]int{}
		for _, m := range v.members {
			if line, dup := seen[m.name]; dup {
				c.errorf(m.at, "%s: duplicate key %q (first at line %d)", key, m.name, line)
				return nil, false
			}
			seen[m.name] = m.at.Start.Line
			x, ok := c.expr(m.value, key+"."+m.name)
			if !ok {
				return nil, false
			}
			obj.Items = append(obj.Items, hclsyntax.ObjectConsItem{
				KeyExpr:   &hclsyntax.ObjectConsKeyExpr{Wrapped: &hclsyntax.LiteralValueExpr{Val: cty.StringVal(m.name), SrcRange: m.at}},
				ValueExpr: x,
			})
		}
		return obj, true
	}
	return &hclsyntax.LiteralValueExpr{Val: v.val, SrcRange: v.at}, true
}
