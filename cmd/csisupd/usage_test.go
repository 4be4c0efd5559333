package main

import (
	"bytes"
	"strings"
	"testing"
)

// Usage errors exit 2 and print the usage of the command that failed, with
// a readable suggestion.
func TestUsageOfFailingCommand(t *testing.T) {
	tests := []struct {
		args  []string
		usage string // the first line under "Usage:"
		want  string // in the error line
		nowan string // not anywhere in stderr
	}{
		{[]string{"volume", "frobnicate"}, "  csisupd volume\n", `unknown command "frobnicate" for "csisupd volume"`, ""},
		{[]string{"volum"}, "  csisupd\n", `did you mean "volume"?`, `\t`},
		{[]string{"volume", "snapshot", "frobnicate"}, "  csisupd volume snapshot\n", `for "csisupd volume snapshot"`, ""},
		{[]string{"operator", "raft", "frob"}, "  csisupd operator raft\n", `for "csisupd operator raft"`, ""},
		{[]string{"volume", "list", "--no-such-flag"}, "  csisupd volume list ", "unknown flag: --no-such-flag", ""},
		{[]string{"volume", "status"}, "  csisupd volume status ID", "accepts between 1 and 1 arg(s)", ""},
		{[]string{"completion", "tcsh"}, "  csisupd completion\n", `unknown command "tcsh"`, ""},
		{[]string{"help", "frobnicate"}, "  csisupd\n", `unknown command "frobnicate" for "csisupd"`, ""},
		{[]string{"help", "volume", "frob"}, "  csisupd volume\n", `unknown command "frob" for "csisupd volume"`, ""},
		{[]string{"help", "volume", "claim", "x"}, "  csisupd volume claim ID", `"csisupd volume claim" has no subcommands`, ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runWith(append([]string{"--address", "127.0.0.1:1"}, tt.args...), &stdout, &stderr)
			if code != exitUsage {
				t.Errorf("exit code %d, want %d", code, exitUsage)
			}
			errText := stderr.String()
			first, _, _ := strings.Cut(errText, "\n")
			if !strings.HasPrefix(first, "Error: ") || !strings.Contains(first, tt.want) {
				t.Errorf("error line %q, want one containing %q", first, tt.want)
			}
			if _, usage, ok := strings.Cut(errText, "\nUsage:\n"); !ok || !strings.HasPrefix(usage, tt.usage) {
				t.Errorf("stderr has no usage starting %q:\n%s", tt.usage, errText)
			}
			if tt.nowan != "" && strings.Contains(errText, tt.nowan) {
				t.Errorf("stderr contains %q:\n%s", tt.nowan, errText)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

// help prints the help of the command it names, and succeeds.
func TestHelpOfCommand(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"help", "volume"}, {"help", "volume", "claim"}} {
		var stdout, stderr bytes.Buffer
		if code := runWith(args, &stdout, &stderr); code != exitOK {
			t.Fatalf("%v: exit code %d, want 0; stderr %s", args, code, stderr.String())
		}
		want := "  csisupd " + strings.Join(args[1:], " ")
		if !strings.Contains(stdout.String(), "Usage:\n"+strings.TrimRight(want, " ")) {
			t.Errorf("%v prints no usage of %q:\n%s", args, want, stdout.String())
		}
	}
}

// A group called without a subcommand prints its help and succeeds.
func TestGroupWithoutSubcommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runWith([]string{"volume"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit code %d, want 0; stderr %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "Available Commands:") || !strings.Contains(stdout.String(), "  claim ") {
		t.Errorf("volume prints no help:\n%s", stdout.String())
	}
}
