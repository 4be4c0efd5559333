package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strings"
	"time"

	"github.com/agext/levenshtein"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/csisupd/csisupd/internal/hcldiag"
	"github.com/csisupd/csisupd/internal/hclnest"
	"github.com/csisupd/csisupd/internal/ids"
)

// schema returns the keys a config file may set, as pointers into c: the
// top-level arguments, and the arguments of each block.
func (c *Config) schema() (top map[string]any, blocks map[string]map[string]any) {
	top = map[string]any{
		"name":           &c.Name,
		"data_dir":       &c.DataDir,
		"bind_addr":      &c.BindAddr,
		"advertise_addr": &c.AdvertiseAddr,
		"log_level":      &c.LogLevel,
		"log_json":       &c.LogJSON,
		"enable_debug":   &c.EnableDebug,
		"region":         &c.Region,
	}
	blocks = map[string]map[string]any{
		"ports": {
			"rpc":  &c.Ports.RPC,
			"http": &c.Ports.HTTP,
			"raft": &c.Ports.Raft,
		},
		"client": {
			"enabled":                              &c.Client.Enabled,
			"plugin_dir":                           &c.Client.PluginDir,
			"allow_insecure_plugin_dir":            &c.Client.AllowInsecurePluginDir,
			"plugin_owners":                        &c.Client.PluginOwners,
			"allow_mount_flags":                    &c.Client.AllowMountFlags,
			"probe_interval":                       &c.Client.ProbeInterval,
			"probe_timeout":                        &c.Client.ProbeTimeout,
			"fingerprint_interval":                 &c.Client.FingerprintInterval,
			"deregister_grace":                     &c.Client.DeregisterGrace,
			"rescan_interval":                      &c.Client.RescanInterval,
			"rpc_timeout":                          &c.Client.RPCTimeout,
			"volume_health_interval":               &c.Client.VolumeHealthInterval,
			"max_destructive_in_flight":            &c.Client.MaxDestructiveInFlight,
			"max_plugin_message_size":              &c.Client.MaxPluginMessageSize,
			"max_event_subscribers":                &c.Client.MaxEventSubscribers,
			"max_event_subscribers_per_connection": &c.Client.MaxEventSubscribersPerConn,
			"servers":                              &c.Client.Servers,
			"kubelet_registration_dir":             &c.Client.KubeletRegistrationDir,
			"kubelet_endpoint_dirs":                &c.Client.KubeletEndpointDirs,
		},
		"telemetry": {
			"prometheus_metrics": &c.Telemetry.PrometheusMetrics,
		},
		"server": {
			"enabled":                   &c.Server.Enabled,
			"bootstrap_expect":          &c.Server.BootstrapExpect,
			"retry_join":                &c.Server.RetryJoin,
			"raft_multiplier":           &c.Server.RaftMultiplier,
			"claim_gc_grace":            &c.Server.ClaimGCGrace,
			"claim_resume_timeout":      &c.Server.ClaimResumeTimeout,
			"volume_health_interval":    &c.Server.VolumeHealthInterval,
			"heartbeat_grace":           &c.Server.HeartbeatGrace,
			"min_heartbeat_ttl":         &c.Server.MinHeartbeatTTL,
			"max_heartbeats_per_second": &c.Server.MaxHeartbeatsPerSecond,
			"failover_heartbeat_ttl":    &c.Server.FailoverHeartbeatTTL,
			"server_stabilization_time": &c.Server.ServerStabilizationTime,
		},
		"consul": {
			"enabled":                &c.Consul.Enabled,
			"address":                &c.Consul.Address,
			"token":                  &c.Consul.Token,
			"service_name":           &c.Consul.ServiceName,
			"plugin_service_name":    &c.Consul.PluginServiceName,
			"tags":                   &c.Consul.Tags,
			"enable_tag_override":    &c.Consul.EnableTagOverride,
			"deregister_on_shutdown": &c.Consul.DeregisterOnShutdown,
			"sync_interval":          &c.Consul.SyncInterval,
			"check_interval":         &c.Consul.CheckInterval,
			"check_tls_server_name":  &c.Consul.CheckTLSServerName,
			"server_service_name":    &c.Consul.ServerServiceName,
			"server_auto_join":       &c.Consul.ServerAutoJoin,
			"client_auto_join":       &c.Consul.ClientAutoJoin,
			"discovery_wait":         &c.Consul.DiscoveryWait,
		},
		"tls": {
			"ca_file":                &c.TLS.CAFile,
			"cert_file":              &c.TLS.CertFile,
			"key_file":               &c.TLS.KeyFile,
			"verify_incoming":        &c.TLS.VerifyIncoming,
			"verify_outgoing":        &c.TLS.VerifyOutgoing,
			"verify_server_hostname": &c.TLS.VerifyServerHostname,
			"verify_node_name":       &c.TLS.VerifyNodeName,
		},
		"acl": {
			"enabled": &c.ACL.Enabled,
		},
		"docker": {
			"enabled":            &c.Docker.Enabled,
			"socket":             &c.Docker.Socket,
			"default_plugin":     &c.Docker.DefaultPlugin,
			"group":              &c.Docker.Group,
			"engine_socket":      &c.Docker.EngineSocket,
			"reconcile_interval": &c.Docker.ReconcileInterval,
			"lease":              &c.Docker.Lease,
		},
		// A nested block is named "outer.inner".
		"acl.tokens": {
			"agent": &c.ACL.AgentToken,
		},
	}
	return top, blocks
}

// fileError is an error at a position in a config file.
type fileError struct {
	at  hcl.Range
	err error
}

// decodeFile parses one HCL file and applies the keys it sets to c. It
// returns every problem in the file, in file order.
func (c *Config) decodeFile(filename string, src []byte) error {
	// A file nested absurdly deep would cost the parser memory per level.
	if err := hclnest.Check(filename, src); err != nil {
		return err
	}
	file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		return hcldiag.Error("", diags)
	}
	body, ok := file.Body.(*hclsyntax.Body)
	if !ok {
		return fmt.Errorf("%s: not in HCL native syntax", filename)
	}

	top, blocks := c.schema()
	errs := c.decodeAttrs(body.Attributes, "", top, blocks)
	seen := make(map[string]hcl.Range)
	for _, blk := range body.Blocks {
		if blk.Type == pluginBlock {
			errs = append(errs, c.decodePluginBlock(blk, seen)...)
			continue
		}
		fields, ok := blocks[blk.Type]
		switch {
		case !ok:
			errs = append(errs, unsupportedBlock(blk, "", top, blocks))
			continue
		case len(blk.Labels) > 0:
			errs = append(errs, fileError{blk.LabelRanges[0],
				fmt.Errorf("%s: block %s takes no labels", hcldiag.Pos(blk.LabelRanges[0]), blk.Type)})
			continue
		}
		if first, dup := seen[blk.Type]; dup {
			errs = append(errs, fileError{blk.TypeRange,
				fmt.Errorf("%s: duplicate block %s (first at line %d): merge them into one",
					hcldiag.Pos(blk.TypeRange), blk.Type, first.Start.Line)})
			continue
		}
		seen[blk.Type] = blk.TypeRange
		errs = append(errs, c.decodeBlock(blk, blk.Type, fields, blocks, seen)...)
	}

	sort.SliceStable(errs, func(i, j int) bool { return errs[i].at.Start.Byte < errs[j].at.Start.Byte })
	joined := make([]error, len(errs))
	for i, e := range errs {
		joined[i] = e.err
	}
	return errors.Join(joined...)
}

// pluginBlock is the labelled block of one plugin's settings:
// plugin "<id>" { ... }.
const pluginBlock = "plugin"

// pluginFields are the arguments of a plugin block, as pointers into p.
func pluginFields(p *PluginConfig) map[string]any {
	return map[string]any{
		"mount_dir":        &p.MountDir,
		"plugin_mount_dir": &p.PluginMountDir,
		"socket":           &p.Socket,
		"type":             &p.Type,
		"required":         &p.Required,
		"health_timeout":   &p.HealthTimeout,
		"secrets_file":     &p.SecretsFile,
	}
}

// decodePluginBlock applies one plugin "<id>" block. A later file's block
// for the same id sets its keys over the earlier one's.
func (c *Config) decodePluginBlock(blk *hclsyntax.Block, seen map[string]hcl.Range) []fileError {
	if len(blk.Labels) != 1 {
		return []fileError{{blk.TypeRange, fmt.Errorf("%s: block plugin takes one label, the plugin id: plugin \"<id>\" { ... }", hcldiag.Pos(blk.TypeRange))}}
	}
	id := blk.Labels[0]
	if !ids.ValidPluginID(id) {
		return []fileError{{blk.LabelRanges[0], fmt.Errorf("%s: plugin %q: a plugin id must match %s", hcldiag.Pos(blk.LabelRanges[0]), id, ids.PluginIDPattern)}}
	}
	name := pluginBlock + "." + id
	if first, dup := seen[name]; dup {
		return []fileError{{blk.TypeRange, fmt.Errorf("%s: duplicate block plugin %q (first at line %d): merge them into one",
			hcldiag.Pos(blk.TypeRange), id, first.Start.Line)}}
	}
	seen[name] = blk.TypeRange
	p, ok := c.Plugins[id]
	if !ok {
		p.HealthTimeout = DefaultPluginHealthTimeout
	}
	var errs []fileError
	for _, inner := range blk.Body.Blocks {
		errs = append(errs, fileError{inner.TypeRange, fmt.Errorf("%s: unsupported block %q in block plugin %q", hcldiag.Pos(inner.TypeRange), inner.Type, id)})
	}
	errs = append(errs, c.decodeAttrs(blk.Body.Attributes, name, pluginFields(&p), nil)...)
	if c.Plugins == nil {
		c.Plugins = make(map[string]PluginConfig)
	}
	c.Plugins[id] = p
	return errs
}

// decodeBlock applies the arguments of one block and of the blocks nested
// in it that the schema names "outer.inner".
func (c *Config) decodeBlock(blk *hclsyntax.Block, name string, fields map[string]any, blocks map[string]map[string]any, seen map[string]hcl.Range) []fileError {
	nested := map[string]map[string]any{}
	for key, f := range blocks {
		if inner, ok := strings.CutPrefix(key, name+"."); ok && !strings.Contains(inner, ".") {
			nested[inner] = f
		}
	}
	errs := c.decodeAttrs(blk.Body.Attributes, name, fields, nested)
	for _, inner := range blk.Body.Blocks {
		innerFields, ok := nested[inner.Type]
		full := name + "." + inner.Type
		switch {
		case !ok:
			errs = append(errs, unsupportedBlock(inner, name, fields, nested))
			continue
		case len(inner.Labels) > 0:
			errs = append(errs, fileError{inner.LabelRanges[0],
				fmt.Errorf("%s: block %s takes no labels", hcldiag.Pos(inner.LabelRanges[0]), full)})
			continue
		}
		if first, dup := seen[full]; dup {
			errs = append(errs, fileError{inner.TypeRange,
				fmt.Errorf("%s: duplicate block %s (first at line %d): merge them into one",
					hcldiag.Pos(inner.TypeRange), full, first.Start.Line)})
			continue
		}
		seen[full] = inner.TypeRange
		errs = append(errs, c.decodeBlock(inner, full, innerFields, blocks, seen)...)
	}
	return errs
}

// decodeAttrs applies the arguments of one body (the file's top level when
// block is "", else the named block) and records where each was set.
func (c *Config) decodeAttrs(attrs hclsyntax.Attributes, block string, fields map[string]any, blocks map[string]map[string]any) []fileError {
	var errs []fileError
	for _, attr := range attrs {
		ptr, ok := fields[attr.Name]
		if !ok {
			errs = append(errs, fileError{attr.NameRange, unsupportedArgument(attr, block, fields, blocks)})
			continue
		}
		key := attr.Name
		if block != "" {
			key = block + "." + attr.Name
		}
		val, diags := attr.Expr.Value(nil)
		if diags.HasErrors() {
			errs = append(errs, fileError{attr.SrcRange, hcldiag.Error(key, diags)})
			continue
		}
		if val.IsNull() {
			// null leaves the value as it was, like an absent key.
			continue
		}
		if err := assign(ptr, val); err != nil {
			errs = append(errs, fileError{attr.SrcRange, fmt.Errorf("%s: %s: %w", hcldiag.Pos(attr.SrcRange), key, err)})
			continue
		}
		c.setOrigin(key, hcldiag.Pos(attr.SrcRange))
	}
	return errs
}

// assign converts val to the type ptr points to and stores it.
func assign(ptr any, val cty.Value) error {
	switch p := ptr.(type) {
	case *string:
		s, err := toString(val)
		if err != nil {
			return err
		}
		*p = s
	case *Secret:
		s, err := toString(val)
		if err != nil {
			return err
		}
		*p = Secret(s)
	case *bool:
		v, err := convert.Convert(val, cty.Bool)
		if err != nil {
			return fmt.Errorf("expected a bool, got %s", describe(val))
		}
		*p = v.True()
	case *int:
		v, err := convert.Convert(val, cty.Number)
		if err != nil {
			return fmt.Errorf("expected a number, got %s", describe(val))
		}
		bf := v.AsBigFloat()
		if !bf.IsInt() {
			return fmt.Errorf("expected a whole number, got %s", bf.Text('g', -1))
		}
		i, acc := bf.Int64()
		if acc != big.Exact || i < math.MinInt32 || i > math.MaxInt32 {
			return fmt.Errorf("number %s is out of range", numText(bf))
		}
		*p = int(i)
	case *float64:
		v, err := convert.Convert(val, cty.Number)
		if err != nil {
			return fmt.Errorf("expected a number, got %s", describe(val))
		}
		f, _ := v.AsBigFloat().Float64()
		if math.IsInf(f, 0) {
			return fmt.Errorf("number %s is out of range", v.AsBigFloat().Text('g', 6))
		}
		*p = f
	case *time.Duration:
		s, err := toString(val)
		if err != nil {
			return err
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("invalid duration %q: use a number with a unit, such as \"5s\" or \"1m\"", s)
		}
		*p = d
	case *[]string:
		v, err := convert.Convert(val, cty.List(cty.String))
		if err != nil {
			return fmt.Errorf("expected a list of strings, got %s", describe(val))
		}
		list := make([]string, 0, v.LengthInt())
		for i, e := range v.AsValueSlice() {
			if e.IsNull() {
				return fmt.Errorf("element %d is null", i)
			}
			list = append(list, e.AsString())
		}
		*p = list
	default:
		// A schema entry without a case here is a programming error.
		panic(fmt.Sprintf("config: no decoder for %T", ptr))
	}
	return nil
}

// toString converts a primitive value to a string.
func toString(val cty.Value) (string, error) {
	v, err := convert.Convert(val, cty.String)
	if err != nil {
		return "", fmt.Errorf("expected a string, got %s", describe(val))
	}
	return v.AsString(), nil
}

// describe names the type and, for primitives, the value of val.
func describe(val cty.Value) string {
	t := val.Type()
	switch {
	case t == cty.String:
		return fmt.Sprintf("string %q", val.AsString())
	case t == cty.Number:
		return "number " + numText(val.AsBigFloat())
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

// numText formats a number without an exponent when it is whole.
func numText(f *big.Float) string {
	if f.IsInt() {
		return f.Text('f', 0)
	}
	return f.Text('g', -1)
}

// unsupportedArgument describes an argument that is not in the schema.
func unsupportedArgument(attr *hclsyntax.Attribute, block string, fields map[string]any, blocks map[string]map[string]any) error {
	msg := fmt.Sprintf("%s: unsupported argument %q", hcldiag.Pos(attr.NameRange), attr.Name)
	if block != "" {
		msg += " in block " + block
	}
	if _, isBlock := blocks[attr.Name]; isBlock {
		return fmt.Errorf("%s; %s is a block: write %s { ... }", msg, attr.Name, attr.Name)
	}
	return errors.New(msg + suggest(attr.Name, fields, blocks))
}

// unsupportedBlock describes a block that is not in the schema.
func unsupportedBlock(blk *hclsyntax.Block, block string, fields map[string]any, blocks map[string]map[string]any) fileError {
	msg := fmt.Sprintf("%s: unsupported block %q", hcldiag.Pos(blk.TypeRange), blk.Type)
	if block != "" {
		msg += " in block " + block
	}
	if _, isArg := fields[blk.Type]; isArg {
		msg += fmt.Sprintf("; %s is an argument: write %s = ...", blk.Type, blk.Type)
	} else {
		msg += suggest(blk.Type, fields, blocks)
	}
	return fileError{blk.TypeRange, errors.New(msg)}
}

// suggest returns `; did you mean "x"?` for the known name closest to name,
// or "" when none is close.
func suggest(name string, fields map[string]any, blocks map[string]map[string]any) string {
	best, bestDist := "", 3 // suggest only names at most 2 edits away
	consider := func(candidate string) {
		d := levenshtein.Distance(name, candidate, nil)
		if d < bestDist || (d == bestDist && candidate < best) {
			best, bestDist = candidate, d
		}
	}
	for k := range fields {
		consider(k)
	}
	for k := range blocks {
		if !strings.Contains(k, ".") { // nested blocks are offered inside their block
			consider(k)
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}
