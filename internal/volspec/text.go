package volspec

import (
	"fmt"
	"slices"
	"sort"

	"github.com/csisupd/csisupd/internal/ids"
)

// checkText returns a problem for every id and every key of the spec that
// holds a control character or is not UTF-8 (ids.CheckText): they are
// printed, logged and passed to plugins as one line of text. So are the
// values of topology segments, labels such as a zone that the servers
// print in placement errors. Values of parameters, secrets and context
// are the plugin's business and may hold anything.
func (s *Spec) checkText() []error {
	var errs []error
	for _, p := range s.textProblems() {
		errs = append(errs, p.err)
	}
	return errs
}

// textProblems are checkText's problems, each at the key it names.
func (s *Spec) textProblems() []fileError {
	var errs []fileError
	for _, f := range []struct{ key, value string }{
		{"id", s.ID}, {"plugin_id", s.PluginID}, {"external_id", s.ExternalID},
		{"snapshot_id", s.SnapshotID}, {"clone_id", s.CloneID},
	} {
		if err := ids.CheckText(f.value); err != nil {
			errs = append(errs, fileError{s.at[f.key], fmt.Errorf("%s%s: %w", s.where(f.key), f.key, err)})
		}
	}
	for _, m := range []struct {
		key  string
		keys []string
	}{
		{"parameters", sortedKeys(s.Parameters)},
		{"mutable_parameters", sortedKeys(s.MutableParameters)},
		{"context", sortedKeys(s.Context)},
		{"secrets", sortedKeys(s.Secrets)},
	} {
		for _, k := range m.keys {
			if err := ids.CheckText(k); err != nil {
				errs = append(errs, fileError{s.at[m.key], fmt.Errorf("%s%s: key %w", s.where(m.key), m.key, err)})
			}
		}
	}
	for _, t := range []struct {
		key      string
		segments []map[string]string
	}{{"topology_request.required", s.Required}, {"topology_request.preferred", s.Preferred}} {
		for _, seg := range t.segments {
			for _, k := range sortedKeys(seg) {
				if err := ids.CheckText(k); err != nil {
					errs = append(errs, fileError{s.at[t.key], fmt.Errorf("%s%s: segment key %w", s.where(t.key), t.key, err)})
				}
				if err := ids.CheckText(seg[k]); err != nil {
					errs = append(errs, fileError{s.at[t.key], fmt.Errorf("%s%s: value of segment key %q: %w", s.where(t.key), t.key, k, err)})
				}
			}
		}
	}
	return errs
}

// sortedKeys returns m's keys in order, so that problems come out the same
// way every time.
func sortedKeys[M ~map[string]string](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return slices.Clip(keys)
}
