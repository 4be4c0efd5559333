package volreq

import (
	"fmt"
	"slices"

	"github.com/csisupd/csisupd/internal/ids"
)

// Text checks a free-form id or name that the servers store, log or pass
// on (a volume, snapshot or workload id, an external id, a node id or
// name): valid UTF-8 without control characters (ids.CheckText). Empty
// passes: whether a field is required is the caller's rule.
func Text(field, s string) error {
	if err := ids.CheckText(s); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	return nil
}

// Keys checks the keys of a map as Text checks a name; the error names the
// first bad key in order. The values are not checked: a parameter or
// context value is the plugin's business and may span lines (a
// certificate, a JSON document), and a secret's value is neither checked
// nor quoted.
func Keys(field string, m map[string]string) error {
	var bad []string
	for k := range m {
		if ids.CheckText(k) != nil {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%s: key %w", field, ids.CheckText(slices.Min(bad)))
}

// segment checks the keys and values of a topology segment. Both are
// checked: the values are labels (a zone, a rack) that the servers
// compare and print in placement errors, not data for the plugin.
func segment(field string, m map[string]string) error {
	if err := Keys(field, m); err != nil {
		return err
	}
	var bad []string
	for k, v := range m {
		if ids.CheckText(v) != nil {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	k := slices.Min(bad)
	return fmt.Errorf("%s: value of %q: %w", field, k, ids.CheckText(m[k]))
}

// textMap checks a map the servers store or pass on: its size (Map) and
// its keys (Keys).
func textMap(field string, m map[string]string) error {
	if err := Map(field, m); err != nil {
		return err
	}
	return Keys(field, m)
}

// secrets checks a secrets map: its size (Secrets) and its keys (Keys).
// No error holds a value.
func secrets(field string, m map[string]string) error {
	if err := Secrets(field, m); err != nil {
		return err
	}
	return Keys(field, m)
}
