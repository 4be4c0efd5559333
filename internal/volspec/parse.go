package volspec

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/csisupd/csisupd/internal/hcldiag"
	"github.com/csisupd/csisupd/internal/hclnest"
)

// MaxFileSize caps a specification file: real ones are a few hundred
// bytes, and the CLI should not read a mistaken path to a disk image.
const MaxFileSize = 1 << 20

// ParseFile reads and parses the specification file at path.
func ParseFile(path string) (*Spec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(path, f)
}

// Read parses the specification r holds, at most MaxFileSize bytes; name
// names it in errors.
func Read(name string, r io.Reader) (*Spec, error) {
	src, err := io.ReadAll(io.LimitReader(r, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(src) > MaxFileSize {
		return nil, fmt.Errorf("%s: larger than %d bytes: not a volume specification", name, MaxFileSize)
	}
	return Parse(name, src)
}

// The keys of a file, by where they may appear. A key set twice, a key
// in the wrong place and any other key are errors.
var (
	topStrings = []string{"id", "name", "namespace", "type", "plugin_id", "external_id", "snapshot_id", "clone_id"}
	topSizes   = []string{"capacity_min", "capacity_max"}
	// mapKeys may be written as a block (parameters { k = "v" }) or as an
	// argument with an object (parameters = { "a.b/c" = "v" }).
	mapKeys   = []string{"parameters", "secrets", "context", "mutable_parameters"}
	topBlocks = []string{"capability", "mount_options", "topology_request"}
)

// decoder collects the problems of one file while filling its Spec.
type decoder struct {
	spec *Spec
	errs []fileError
	// name is the file's name key, which names the volume too when
	// there is no id.
	name  string
	idSet bool
}

func (d *decoder) errorf(at hcl.Range, format string, args ...any) {
	d.errs = append(d.errs, fileError{at, fmt.Errorf("%s: "+format, append([]any{hcldiag.Pos(at)}, args...)...)})
}

// Parse decodes a volume specification in HCL native syntax, HCL 2 or
// Nomad's HCL 1, or in JSON (see isJSON); filename names the file in
// errors. It returns every
// problem of the file, each starting with "filename:line: ".
//
// A file is read as HCL 2 first, and as HCL 1 when HCL 2 refuses only
// lines in forms HCL 1 takes, so that what Nomad reads (one-line blocks
// holding several arguments or a block, quoted keys) reads the same
// here. A file neither reads gets HCL 2's syntax errors of its other
// lines, or HCL 1's.
func Parse(filename string, src []byte) (*Spec, error) {
	// A file nested absurdly deep would cost the parser memory per level.
	if err := hclnest.Check(filename, src); err != nil {
		return nil, err
	}
	body, errs, err := parseBody(filename, src)
	if err != nil {
		return nil, err
	}
	d := &decoder{spec: &Spec{File: filename, at: map[string]hcl.Range{}}, errs: errs}
	d.top(body)
	d.finish()
	d.errs = append(d.errs, d.spec.textProblems()...)
	if len(d.errs) > 0 {
		sort.SliceStable(d.errs, func(i, j int) bool { return d.errs[i].at.Start.Byte < d.errs[j].at.Start.Byte })
		errs := make([]error, len(d.errs))
		for i, e := range d.errs {
			errs[i] = e.err
		}
		return nil, errors.Join(errs...)
	}
	return d.spec, nil
}

// parseBody parses src as JSON, HCL 2 or HCL 1 (see Parse).
func parseBody(filename string, src []byte) (*hclsyntax.Body, []fileError, error) {
	if isJSON(filename, src) {
		return parseJSON(filename, src)
	}
	file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if !diags.HasErrors() {
		body, ok := file.Body.(*hclsyntax.Body)
		if !ok {
			return nil, nil, fmt.Errorf("%s: not in HCL native syntax", filename)
		}
		return body, nil, nil
	}
	// HCL 1 is lax (it drops an argument without a value at the end of
	// a file): it reads the file only when every one of HCL 2's errors is
	// on a line in a form only HCL 1 takes. Otherwise the errors of the
	// other lines are the file's.
	if rest := notHCL1Form(src, diags); len(rest) > 0 {
		return nil, nil, hcldiag.Error("", rest)
	}
	return parseHCL1(filename, src)
}

// top decodes the file's top level.
func (d *decoder) top(body *hclsyntax.Body) {
	s := d.spec
	known := slices.Concat(topStrings, topSizes, mapKeys)
	for _, attr := range sortedAttrs(body.Attributes) {
		switch {
		case slices.Contains(topStrings, attr.Name):
			v, ok := d.str(attr, attr.Name)
			if !ok {
				continue
			}
			d.setString(attr, v)
		case slices.Contains(topSizes, attr.Name):
			v, ok := d.str(attr, attr.Name)
			if !ok {
				continue
			}
			n, err := ParseSize(v)
			if err != nil {
				d.errorf(attr.SrcRange, "%s: %v", attr.Name, err)
				continue
			}
			if attr.Name == "capacity_min" {
				s.CapacityMin = n
			} else {
				s.CapacityMax = n
			}
			s.at[attr.Name] = attr.SrcRange
		case slices.Contains(mapKeys, attr.Name):
			if d.once(attr.Name, attr.NameRange) {
				d.setMap(attr.Name, d.objectMap(attr, attr.Name))
			}
		case slices.Contains(topBlocks, attr.Name):
			d.errorf(attr.NameRange, "%s is a block: write %s { ... }", attr.Name, attr.Name)
		default:
			d.errorf(attr.NameRange, "unsupported argument %q%s", attr.Name, suggest(attr.Name, append(known, topBlocks...)))
		}
	}
	for _, blk := range body.Blocks {
		if !d.noLabels(blk, "") {
			continue
		}
		switch {
		case blk.Type == "capability":
			d.capability(blk)
		case blk.Type == "mount_options":
			if d.once("mount_options", blk.TypeRange) {
				d.mountOptions(blk)
			}
		case blk.Type == "topology_request":
			if d.once("topology_request", blk.TypeRange) {
				d.topologyRequest(blk)
			}
		case slices.Contains(mapKeys, blk.Type):
			if d.once(blk.Type, blk.TypeRange) {
				d.setMap(blk.Type, d.blockMap(blk, blk.Type))
			}
		case slices.Contains(known, blk.Type):
			d.errorf(blk.TypeRange, "%s is an argument: write %s = ...", blk.Type, blk.Type)
		default:
			d.errorf(blk.TypeRange, "unsupported block %q%s", blk.Type, suggest(blk.Type, append(known, topBlocks...)))
		}
	}
}

// finish checks what involves more than one key.
func (d *decoder) finish() {
	s := d.spec
	switch {
	case d.name == "":
	case !d.idSet:
		s.ID = d.name
	case d.name != s.ID:
		s.Name = d.name
	}
	if s.SnapshotID != "" && s.CloneID != "" {
		later := s.at["clone_id"]
		if s.at["snapshot_id"].Start.Byte > later.Start.Byte {
			later = s.at["snapshot_id"]
		}
		d.errs = append(d.errs, fileError{later, fmt.Errorf("%s: %w", hcldiag.Pos(later), errExclusive)})
	}
	if s.CapacityMin > 0 && s.CapacityMax > 0 && s.CapacityMin > s.CapacityMax {
		at := s.at["capacity_max"]
		d.errorf(at, "capacity_max: %d bytes is less than capacity_min's %d", s.CapacityMax, s.CapacityMin)
	}
}

// setString stores a top-level string argument.
func (d *decoder) setString(attr *hclsyntax.Attribute, v string) {
	s := d.spec
	switch attr.Name {
	case "id":
		if v == "" {
			d.errorf(attr.SrcRange, "id: must not be empty")
			return
		}
		s.ID, d.idSet = v, true
	case "name":
		d.name = v
	case "namespace":
		if v != "" && v != "default" {
			d.errorf(attr.SrcRange, "namespace %q: csisupd has no namespaces; remove namespace or set it to \"default\"", v)
		}
	case "type":
		if v != "csi" {
			d.errorf(attr.SrcRange, "type %q: csisupd manages CSI volumes only; type must be \"csi\"", v)
		}
	case "plugin_id":
		s.PluginID = v
	case "external_id":
		s.ExternalID = v
	case "snapshot_id":
		s.SnapshotID = v
	case "clone_id":
		s.CloneID = v
	}
	s.at[attr.Name] = attr.SrcRange
}

// setMap stores one of the maps of mapKeys.
func (d *decoder) setMap(key string, m map[string]string) {
	switch key {
	case "parameters":
		d.spec.Parameters = m
	case "secrets":
		d.spec.Secrets = Secrets(m)
	case "context":
		d.spec.Context = m
	case "mutable_parameters":
		d.spec.MutableParameters = m
	}
}

// once records that key (a block, or a map's block or argument) was set at
// rng, and reports false, with an error, when it was set before.
func (d *decoder) once(key string, rng hcl.Range) bool {
	if first, dup := d.spec.at[key]; dup {
		// Arguments are decoded before blocks: name the later of the two.
		if rng.Start.Byte < first.Start.Byte {
			first, rng = rng, first
		}
		d.errorf(rng, "duplicate %s (first at line %d): merge them into one", key, first.Start.Line)
		return false
	}
	d.spec.at[key] = rng
	return true
}

// noLabels reports whether blk has no labels, with an error when it has.
func (d *decoder) noLabels(blk *hclsyntax.Block, in string) bool {
	if len(blk.Labels) == 0 {
		return true
	}
	d.errorf(blk.LabelRanges[0], "block %s takes no labels", in+blk.Type)
	return false
}

// capability decodes one capability block.
func (d *decoder) capability(blk *hclsyntax.Block) {
	var c Capability
	var haveMode, haveAttach bool
	for _, inner := range blk.Body.Blocks {
		d.errorf(inner.TypeRange, "unsupported block %q in block capability", inner.Type)
	}
	for _, attr := range sortedAttrs(blk.Body.Attributes) {
		key := "capability." + attr.Name
		switch attr.Name {
		case "access_mode":
			v, ok := d.str(attr, key)
			if !ok {
				continue
			}
			mode, known := AccessModes[v]
			if !known {
				d.errorf(attr.SrcRange, "%s %q: must be one of %s", key, v, strings.Join(slices.Sorted(maps.Keys(AccessModes)), ", "))
				continue
			}
			c.AccessMode, haveMode = mode, true
		case "attachment_mode":
			v, ok := d.str(attr, key)
			if !ok {
				continue
			}
			typ, known := AttachmentModes[v]
			if !known {
				d.errorf(attr.SrcRange, "%s %q: must be file-system or block-device", key, v)
				continue
			}
			c.AccessType, haveAttach = typ, true
		default:
			d.errorf(attr.NameRange, "unsupported argument %q in block capability%s", attr.Name, suggest(attr.Name, []string{"access_mode", "attachment_mode"}))
		}
	}
	if !haveMode && !hasAttr(blk, "access_mode") {
		d.errorf(blk.TypeRange, "capability: access_mode is not set (e.g. access_mode = \"single-node-writer\")")
	}
	if !haveAttach && !hasAttr(blk, "attachment_mode") {
		d.errorf(blk.TypeRange, "capability: attachment_mode is not set (file-system or block-device)")
	}
	if haveMode && haveAttach {
		d.spec.Capabilities = append(d.spec.Capabilities, c)
		if _, ok := d.spec.at["capability"]; !ok {
			d.spec.at["capability"] = blk.TypeRange
		}
	}
}

func hasAttr(blk *hclsyntax.Block, name string) bool {
	_, ok := blk.Body.Attributes[name]
	return ok
}

// mountOptions decodes the mount_options block.
func (d *decoder) mountOptions(blk *hclsyntax.Block) {
	mo := &MountOptions{}
	for _, inner := range blk.Body.Blocks {
		d.errorf(inner.TypeRange, "unsupported block %q in block mount_options", inner.Type)
	}
	for _, attr := range sortedAttrs(blk.Body.Attributes) {
		key := "mount_options." + attr.Name
		switch attr.Name {
		case "fs_type":
			if v, ok := d.str(attr, key); ok {
				mo.FSType = v
			}
		case "mount_flags":
			val, ok := d.value(attr, key)
			if !ok {
				continue
			}
			list, err := convert.Convert(val, cty.List(cty.String))
			if err != nil || !list.IsWhollyKnown() {
				d.errorf(attr.SrcRange, "%s: expected a list of strings, got %s", key, describe(val))
				continue
			}
			for i, e := range list.AsValueSlice() {
				if e.IsNull() {
					d.errorf(attr.SrcRange, "%s: element %d is null", key, i)
					continue
				}
				mo.MountFlags = append(mo.MountFlags, e.AsString())
			}
		default:
			d.errorf(attr.NameRange, "unsupported argument %q in block mount_options%s", attr.Name, suggest(attr.Name, []string{"fs_type", "mount_flags"}))
		}
	}
	d.spec.MountOptions = mo
}

// topologyRequest decodes the topology_request block.
func (d *decoder) topologyRequest(blk *hclsyntax.Block) {
	for _, attr := range sortedAttrs(blk.Body.Attributes) {
		if attr.Name == "required" || attr.Name == "preferred" {
			d.errorf(attr.NameRange, "topology_request.%s is a block: write %s { topology { segments = { ... } } }", attr.Name, attr.Name)
			continue
		}
		d.errorf(attr.NameRange, "unsupported argument %q in block topology_request%s", attr.Name, suggest(attr.Name, []string{"required", "preferred"}))
	}
	for _, inner := range blk.Body.Blocks {
		if !d.noLabels(inner, "topology_request.") {
			continue
		}
		key := "topology_request." + inner.Type
		switch inner.Type {
		case "required", "preferred":
			if !d.once(key, inner.TypeRange) {
				continue
			}
			segs := d.topologies(inner, key)
			if inner.Type == "required" {
				d.spec.Required = segs
			} else {
				d.spec.Preferred = segs
			}
		default:
			d.errorf(inner.TypeRange, "unsupported block %q in block topology_request%s", inner.Type, suggest(inner.Type, []string{"required", "preferred"}))
		}
	}
}

// topologies decodes the topology blocks of a required or preferred block.
func (d *decoder) topologies(blk *hclsyntax.Block, key string) []map[string]string {
	for _, attr := range sortedAttrs(blk.Body.Attributes) {
		d.errorf(attr.NameRange, "unsupported argument %q in block %s: write topology { segments = { ... } }", attr.Name, key)
	}
	var out []map[string]string
	for _, inner := range blk.Body.Blocks {
		if !d.noLabels(inner, key+".") {
			continue
		}
		if inner.Type != "topology" {
			d.errorf(inner.TypeRange, "unsupported block %q in block %s%s", inner.Type, key, suggest(inner.Type, []string{"topology"}))
			continue
		}
		if seg, ok := d.topology(inner, key+".topology"); ok {
			out = append(out, seg)
		}
	}
	if len(out) == 0 && !blockHas(blk, "topology") {
		d.errorf(blk.TypeRange, "%s: no topology block (write topology { segments = { zone = \"z1\" } })", key)
	}
	return out
}

func blockHas(blk *hclsyntax.Block, typ string) bool {
	for _, b := range blk.Body.Blocks {
		if b.Type == typ {
			return true
		}
	}
	return false
}

// topology decodes one topology block: its segments, as a block or as an
// argument.
func (d *decoder) topology(blk *hclsyntax.Block, key string) (map[string]string, bool) {
	var seg map[string]string
	var at *hcl.Range
	set := func(rng hcl.Range, m map[string]string) {
		if at != nil {
			d.errorf(rng, "duplicate %s.segments (first at line %d): merge them into one", key, at.Start.Line)
			return
		}
		at, seg = &rng, m
	}
	for _, attr := range sortedAttrs(blk.Body.Attributes) {
		if attr.Name != "segments" {
			d.errorf(attr.NameRange, "unsupported argument %q in block %s%s", attr.Name, key, suggest(attr.Name, []string{"segments"}))
			continue
		}
		set(attr.NameRange, d.objectMap(attr, key+".segments"))
	}
	for _, inner := range blk.Body.Blocks {
		if inner.Type != "segments" {
			d.errorf(inner.TypeRange, "unsupported block %q in block %s%s", inner.Type, key, suggest(inner.Type, []string{"segments"}))
			continue
		}
		if d.noLabels(inner, key+".") {
			set(inner.TypeRange, d.blockMap(inner, key+".segments"))
		}
	}
	if at == nil {
		d.errorf(blk.TypeRange, "%s: segments is not set (write segments = { zone = \"z1\" })", key)
		return nil, false
	}
	if len(seg) == 0 {
		d.errorf(*at, "%s.segments: empty; a segment names at least one topology key", key)
		return nil, false
	}
	return seg, true
}

// blockMap decodes a block whose arguments are a map's keys and values.
func (d *decoder) blockMap(blk *hclsyntax.Block, key string) map[string]string {
	for _, inner := range blk.Body.Blocks {
		d.errorf(inner.TypeRange, "unsupported block %q in block %s: it holds key = \"value\" pairs only", inner.Type, key)
	}
	m := make(map[string]string, len(blk.Body.Attributes))
	for _, attr := range sortedAttrs(blk.Body.Attributes) {
		val, ok := d.value(attr, key+"."+attr.Name)
		if !ok {
			continue
		}
		s, err := toString(val)
		if err != nil {
			d.errorf(attr.SrcRange, "%s.%s: %v", key, attr.Name, err)
			continue
		}
		m[attr.Name] = s
	}
	return m
}

// objectMap decodes an argument whose value is an object of strings.
func (d *decoder) objectMap(attr *hclsyntax.Attribute, key string) map[string]string {
	val, ok := d.value(attr, key)
	if !ok {
		return nil
	}
	t := val.Type()
	if !t.IsObjectType() && !t.IsMapType() {
		d.errorf(attr.SrcRange, "%s: expected an object such as { key = \"value\" }, got %s", key, describe(val))
		return nil
	}
	m := make(map[string]string, val.LengthInt())
	for it := val.ElementIterator(); it.Next(); {
		k, v := it.Element()
		s, err := toString(v)
		if err != nil {
			d.errorf(attr.SrcRange, "%s[%q]: %v", key, k.AsString(), err)
			continue
		}
		m[k.AsString()] = s
	}
	return m
}
