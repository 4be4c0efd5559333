package deploy

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/rulefmt"
)

// runbookBase is where every alert's runbook_url points: the runbook in
// the repository, as the units' Documentation= name the repository.
const runbookBase = "https://github.com/csisupd/csisupd/blob/main/"

// runbookFile is the runbook the alerts link to, relative to the
// repository's root.
const runbookFile = "docs/runbook.md"

// headingAnchor is the anchor GitHub gives a Markdown heading: lower
// case, punctuation other than - and _ dropped, spaces as dashes.
func headingAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// runbookAnchors returns the anchors of the headings of the Markdown file
// at path, outside code blocks.
func runbookAnchors(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	anchors := map[string]bool{}
	heading := regexp.MustCompile(`^#{1,6} +(.+)$`)
	inCode := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil && !inCode {
			anchors[headingAnchor(m[1])] = true
		}
	}
	return anchors, sc.Err()
}

// checkRunbooks returns what is wrong with the runbook links of the
// alerts in groups, against the repository at root: an alert without a
// runbook_url, one that does not point into the repository's runbook, an
// anchor the runbook has no heading for, and a runbook section no alert
// links to.
func checkRunbooks(groups *rulefmt.RuleGroups, root string) []string {
	anchors, err := runbookAnchors(filepath.Join(root, runbookFile))
	if err != nil {
		return []string{fmt.Sprintf("runbook: %v", err)}
	}
	var problems []string
	linked := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			name := g.Name + "/" + r.Alert
			url := r.Annotations["runbook_url"]
			doc, anchor, ok := strings.Cut(strings.TrimPrefix(url, runbookBase), "#")
			switch {
			case url == "":
				problems = append(problems, fmt.Sprintf("%s: no runbook_url annotation", name))
			case !strings.HasPrefix(url, runbookBase) || doc != runbookFile || !ok:
				problems = append(problems, fmt.Sprintf("%s: runbook_url %q does not point at a section of %s%s", name, url, runbookBase, runbookFile))
			case !anchors[anchor]:
				problems = append(problems, fmt.Sprintf("%s: runbook_url anchor #%s is no heading of %s", name, anchor, runbookFile))
			default:
				linked[anchor] = true
			}
		}
	}
	for a := range anchors {
		if strings.HasPrefix(a, "csisupd") && !linked[a] {
			problems = append(problems, fmt.Sprintf("%s: section #%s belongs to no alert", runbookFile, a))
		}
	}
	slices.Sort(problems)
	return problems
}

// TestAlertRunbooks holds every alert of the rules file to a section of
// docs/runbook.md, and every alert section of the runbook to an alert.
func TestAlertRunbooks(t *testing.T) {
	groups, problems := checkRules(rulesFile, readmeTable(t))
	if groups == nil {
		t.Fatalf("the rules file does not load: %q", problems)
	}
	for _, p := range checkRunbooks(groups, repoRoot) {
		t.Error(p)
	}
}

// TestRunbookCheckFails proves checkRunbooks can fail, on each count.
func TestRunbookCheckFails(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	runbook := "# Runbook\n\n## CsisupdGood\n\ntext\n\n## CsisupdOrphan\n\n```sh\n# CsisupdInCode\n```\n"
	if err := os.WriteFile(filepath.Join(root, runbookFile), []byte(runbook), 0o600); err != nil {
		t.Fatal(err)
	}
	alert := func(name, url string) rulefmt.Rule {
		r := rulefmt.Rule{Alert: name, Annotations: map[string]string{}}
		if url != "" {
			r.Annotations["runbook_url"] = url
		}
		return r
	}
	groups := &rulefmt.RuleGroups{Groups: []rulefmt.RuleGroup{{Name: "g", Rules: []rulefmt.Rule{
		alert("CsisupdGood", runbookBase+runbookFile+"#csisupdgood"),
		alert("NoURL", ""),
		alert("Elsewhere", "https://example.com/runbook.md#csisupdgood"),
		alert("OtherFile", runbookBase+"README.md#csisupdgood"),
		alert("NoAnchor", runbookBase+runbookFile),
		alert("BadAnchor", runbookBase+runbookFile+"#csisupdmissing"),
		alert("InCode", runbookBase+runbookFile+"#csisupdincode"),
	}}}}
	got := checkRunbooks(groups, root)
	want := []string{
		`docs/runbook.md: section #csisupdorphan belongs to no alert`,
		`g/BadAnchor: runbook_url anchor #csisupdmissing is no heading of docs/runbook.md`,
		`g/Elsewhere: runbook_url "https://example.com/runbook.md#csisupdgood" does not point at a section of ` + runbookBase + runbookFile,
		`g/InCode: runbook_url anchor #csisupdincode is no heading of docs/runbook.md`,
		`g/NoAnchor: runbook_url "` + runbookBase + runbookFile + `" does not point at a section of ` + runbookBase + runbookFile,
		`g/NoURL: no runbook_url annotation`,
		`g/OtherFile: runbook_url "` + runbookBase + `README.md#csisupdgood" does not point at a section of ` + runbookBase + runbookFile,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, tt := range []struct{ heading, anchor string }{
		{"CsisupdNodeDown", "csisupdnodedown"},
		{"Runbook: csisupd's alerts", "runbook-csisupds-alerts"},
		{"A b_c-d", "a-b_c-d"},
	} {
		if got := headingAnchor(tt.heading); got != tt.anchor {
			t.Errorf("headingAnchor(%q) = %q, want %q", tt.heading, got, tt.anchor)
		}
	}
}
