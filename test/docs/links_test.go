package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the repository's root, seen from this package's directory.
const repoRoot = "../.."

var (
	// mdLink is an inline Markdown link or image: [text](target).
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// htmlAnchor is an explicit anchor: <a name="x"> or id="x".
	htmlAnchor = regexp.MustCompile(`(?:name|id)="([^"]+)"`)
	// inlineCode is a code span, whose text is no link.
	inlineCode = regexp.MustCompile("`[^`]*`")
)

// docFiles lists README.md, docs/*.md and the READMEs of deploy/'s
// examples, relative to the repository root.
func docFiles(t *testing.T) []string {
	t.Helper()
	var docs []string
	for _, pattern := range []string{"docs/*.md", "deploy/*/README.md"} {
		matched, err := filepath.Glob(filepath.Join(repoRoot, filepath.FromSlash(pattern)))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, matched...)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(repoRoot, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// slug is the anchor that GitHub gives a heading's text.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown text: its headings' (outside
// code blocks, numbered as GitHub numbers repeated ones) and its explicit
// HTML ones.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		hashes := len(line) - len(strings.TrimLeft(line, "#"))
		if hashes == 0 || hashes > 6 || !strings.HasPrefix(line[hashes:], " ") {
			continue
		}
		s := slug(strings.NewReplacer("`", "", "*", "").Replace(line[hashes:]))
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// links returns the link targets of a Markdown text outside code blocks
// and code spans, with the line of each.
func links(text string) (targets []string, lines []int) {
	inCode := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			targets = append(targets, m[1])
			lines = append(lines, i+1)
		}
	}
	return targets, lines
}

// Every relative link of the README, docs/ and deploy/'s READMEs leads
// somewhere.
func TestRelativeLinks(t *testing.T) {
	read := func(rel string) (string, error) {
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(rel)))
		return string(b), err
	}
	checked := 0
	for _, file := range docFiles(t) {
		text, err := read(file)
		if err != nil {
			t.Fatal(err)
		}
		targets, lines := links(text)
		for i, target := range targets {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
			}
			if strings.HasPrefix(dest, "../") {
				t.Errorf("%s:%d: %s leaves the repository", file, lines[i], target)
				continue
			}
			st, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(dest)))
			if err != nil {
				t.Errorf("%s:%d: %s: no such file %s", file, lines[i], target, dest)
				continue
			}
			if frag == "" {
				continue
			}
			if st.IsDir() || !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s:%d: %s: an anchor into %s, which is not a Markdown page", file, lines[i], target, dest)
				continue
			}
			destText, err := read(dest)
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(destText)[frag] {
				t.Errorf("%s:%d: %s: %s has no heading or anchor #%s", file, lines[i], target, dest, frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no relative links to check")
	}
}

// The checker itself: the anchors GitHub makes, and links it must refuse.
func TestAnchorsAndLinks(t *testing.T) {
	text := "# Title\n## JSON output (stable)\n## Set-up: two `commands`\n## A\n## A\n```\n## not a heading\n```\n<a name=\"x\"></a>\n"
	got := anchors(text)
	for _, want := range []string{"title", "json-output-stable", "set-up-two-commands", "a", "a-1", "x"} {
		if !got[want] {
			t.Errorf("anchors: no %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("anchors: a heading inside a code block counted")
	}
	targets, _ := links("see [a](b.md#c) and `[x](y)`\n```\n[p](q)\n```\n[d](#e)")
	if strings.Join(targets, " ") != "b.md#c #e" {
		t.Errorf("links = %q, want [b.md#c #e]", targets)
	}
}
