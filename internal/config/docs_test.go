package config

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every key the loader takes is documented in docs/configuration.md's
// tables: as `block.key` (or `key` at the top), or inside a row that names
// its block's keys together (`ports { rpc http raft }`).
func TestEveryKeyDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var cells []string // the code spans of the tables' first column
	span := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " | ")
		for _, m := range span.FindAllStringSubmatch(first, -1) {
			cells = append(cells, m[1])
		}
	}
	documented := func(block, key string) bool {
		name := key
		if block != "" {
			name = block + "." + key
		}
		return slices.ContainsFunc(cells, func(c string) bool {
			if c == name {
				return true
			}
			inner, ok := strings.CutPrefix(c, block+" {")
			return block != "" && ok && slices.Contains(strings.Fields(strings.TrimSuffix(inner, "}")), key)
		})
	}
	c := Default()
	top, blocks := c.schema()
	for key := range top {
		if !documented("", key) {
			t.Errorf("docs/configuration.md does not document %s", key)
		}
	}
	for block, keys := range blocks {
		for key := range keys {
			if !documented(block, key) {
				t.Errorf("docs/configuration.md does not document %s.%s", block, key)
			}
		}
	}
}
