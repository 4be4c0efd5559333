package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// updateDocs makes TestGeneratedDocs write the reference instead of
// comparing it: make docs runs it so.
var updateDocs = flag.Bool("update-docs", false, "rewrite docs/man and docs/cli.md from the command tree")

// Where the generated reference lives, from this package's directory.
var (
	manDir    = filepath.Join("..", "..", "docs", "man")
	cliDocMD  = filepath.Join("..", "..", "docs", "cli.md")
	manHeader = doc.GenManHeader{
		Title:   "CSISUPD",
		Section: "1",
		Source:  "csisupd",
		Manual:  "csisupd manual",
		// A fixed date keeps regeneration byte for byte stable; the
		// pages change only when the command tree does.
		Date: func() *time.Time { d := time.Date(2026, time.December, 1, 0, 0, 0, 0, time.UTC); return &d }(),
	}
)

// docsRoot is the command tree as a user meets it, with the completion
// command that Execute adds, and with flag defaults that do not depend on
// the environment that generates the pages.
func docsRoot(t *testing.T) *cobra.Command {
	t.Helper()
	root := newRootCommand()
	// --address defaults to $CSISUPD_ADDR: the pages show the built-in
	// default and name the variable.
	addr := root.PersistentFlags().Lookup("address")
	if addr == nil {
		t.Fatal("the root command has no --address flag")
	}
	addr.DefValue = DefaultAddress
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()
	root.DisableAutoGenTag = true
	return root
}

// generateDocs writes one man page per command into dir and returns the
// whole CLI reference as one Markdown page.
func generateDocs(t *testing.T, root *cobra.Command, dir string) []byte {
	t.Helper()
	header := manHeader
	if err := doc.GenManTree(root, &header, dir); err != nil {
		t.Fatalf("man pages: %v", err)
	}
	var md bytes.Buffer
	md.WriteString("# The csisupd command line\n\n")
	md.WriteString("<!-- Generated from the command tree by `make docs`: do not edit. -->\n\n")
	md.WriteString("Every command and flag of `csisupd`, as `csisupd COMMAND --help` prints them.\n")
	md.WriteString("The same text is in the man pages of [docs/man](man/).\n\n")
	// The sections shift one level down so that the page has one title.
	anchor := func(link string) string {
		return "#" + strings.ReplaceAll(strings.TrimSuffix(link, ".md"), "_", "-")
	}
	for _, c := range availableCommands(root) {
		var b bytes.Buffer
		if err := doc.GenMarkdownCustom(c, &b, anchor); err != nil {
			t.Fatalf("markdown of %q: %v", c.CommandPath(), err)
		}
		md.WriteString(shiftHeadings(b.String()))
	}
	return md.Bytes()
}

// shiftHeadings moves every Markdown heading outside code blocks one level
// down.
func shiftHeadings(s string) string {
	lines := strings.Split(s, "\n")
	inCode := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if !inCode && strings.HasPrefix(l, "#") {
			lines[i] = "#" + l
		}
	}
	return strings.Join(lines, "\n")
}

// availableCommands lists root and every command below it that help shows,
// depth first in the order of help.
func availableCommands(root *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{root}
	for _, c := range root.Commands() {
		if !c.IsAvailableCommand() || c.IsAdditionalHelpTopicCommand() {
			continue
		}
		out = append(out, availableCommands(c)...)
	}
	return out
}

// manPageName is the file of a command's man page.
func manPageName(c *cobra.Command) string {
	return strings.ReplaceAll(c.CommandPath(), " ", "-") + ".1"
}

// The committed man pages and docs/cli.md are what the command tree
// generates; make docs rewrites them.
func TestGeneratedDocs(t *testing.T) {
	root := docsRoot(t)
	gen := t.TempDir()
	cli := generateDocs(t, root, gen)

	if *updateDocs {
		if err := os.MkdirAll(manDir, 0o755); err != nil {
			t.Fatal(err)
		}
		old, _ := filepath.Glob(filepath.Join(manDir, "csisupd*.1"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		pages, _ := filepath.Glob(filepath.Join(gen, "*.1"))
		for _, p := range pages {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(manDir, filepath.Base(p)), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(cliDocMD, cli, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d man pages to %s and %s", len(pages), manDir, cliDocMD)
		return
	}

	const fix = "(run make docs, review and commit)"
	want := dirFiles(t, gen)
	got := dirFiles(t, manDir)
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("docs/man/%s is missing %s", name, fix)
		case !bytes.Equal(g, w):
			t.Errorf("docs/man/%s is not what the command tree generates %s", name, fix)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/man/%s is of no command %s", name, fix)
		}
	}
	committed, err := os.ReadFile(cliDocMD)
	if err != nil {
		t.Fatalf("docs/cli.md: %v %s", err, fix)
	}
	if !bytes.Equal(committed, cli) {
		t.Errorf("docs/cli.md is not what the command tree generates %s", fix)
	}
}

// dirFiles reads the man pages of dir by name.
func dirFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "csisupd*.1"))
	if err != nil {
		t.Fatal(err)
	}
	files := make(map[string][]byte, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = b
	}
	return files
}

// Every command has its man page and its section of docs/cli.md, which
// names each of its flags.
func TestEveryCommandDocumented(t *testing.T) {
	root := docsRoot(t)
	cli, err := os.ReadFile(cliDocMD)
	if err != nil {
		t.Fatalf("docs/cli.md: %v (run make docs)", err)
	}
	for _, c := range availableCommands(root) {
		if _, err := os.Stat(filepath.Join(manDir, manPageName(c))); err != nil {
			t.Errorf("command %q has no man page: %v", c.CommandPath(), err)
		}
		section := markdownSection(string(cli), "### "+c.CommandPath()+"\n")
		if section == "" {
			t.Errorf("docs/cli.md has no section for %q", c.CommandPath())
			continue
		}
		c.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			if !strings.Contains(section, "--"+f.Name) {
				t.Errorf("docs/cli.md's section for %q does not name --%s", c.CommandPath(), f.Name)
			}
		})
	}
}

// markdownSection is the text of s from the heading line to the next
// heading of the same level.
func markdownSection(s, heading string) string {
	i := strings.Index(s, heading)
	if i < 0 {
		return ""
	}
	rest := s[i+len(heading):]
	if j := strings.Index(rest, "\n### "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// The man pages render without a warning from man or groff.
func TestManPagesRender(t *testing.T) {
	if _, err := exec.LookPath("man"); err != nil {
		t.Skip("man is not installed (Debian's man-db and groff-base)")
	}
	pages, err := filepath.Glob(filepath.Join(manDir, "*.1"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no man pages in docs/man (%v): run make docs", err)
	}
	// The page the contract names first, then the others.
	first := filepath.Join(manDir, "csisupd-volume-claim.1")
	if !slices.Contains(pages, first) {
		t.Fatalf("%s is missing", first)
	}
	for _, p := range pages {
		t.Run(filepath.Base(p), func(t *testing.T) {
			cmd := exec.Command("man", "--warnings", "-l", p)
			cmd.Env = append(os.Environ(), "MANWIDTH=80", "MANPAGER=cat", "PAGER=cat", "LC_ALL=C.UTF-8")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("man -l %s: %v\n%s", p, err, stderr.String())
			}
			if stderr.Len() != 0 {
				t.Errorf("man -l %s warned:\n%s", p, stderr.String())
			}
			name := strings.TrimSuffix(filepath.Base(p), ".1")
			if !strings.Contains(stdout.String(), name) {
				t.Errorf("man -l %s: the rendered page does not name %s:\n%s", p, name, stdout.String())
			}
		})
	}
}

// Generating twice gives the same bytes: nothing of the clock or the
// environment leaks into the pages.
func TestGeneratedDocsStable(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", fmt.Sprint(time.Now().Unix()))
	t.Setenv("CSISUPD_ADDR", "")
	a, b := t.TempDir(), t.TempDir()
	cliA := generateDocs(t, docsRoot(t), a)
	t.Setenv("CSISUPD_ADDR", "elsewhere.example:1")
	cliB := generateDocs(t, docsRoot(t), b)
	if !bytes.Equal(cliA, cliB) {
		t.Error("docs/cli.md differs between two generations")
	}
	fa, fb := dirFiles(t, a), dirFiles(t, b)
	if len(fa) == 0 || len(fa) != len(fb) {
		t.Fatalf("generated %d and %d man pages", len(fa), len(fb))
	}
	for name, x := range fa {
		if !bytes.Equal(x, fb[name]) {
			t.Errorf("%s differs between two generations", name)
		}
	}
}
