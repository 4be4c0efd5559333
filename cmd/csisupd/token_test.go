package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The CLI's token: --token, else CSISUPD_TOKEN, else the file named by
// CSISUPD_TOKEN_FILE.
func TestResolveToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		flag    string
		env     map[string]string
		want    string
		wantErr string
	}{
		{name: "none"},
		{name: "flag wins", flag: "from-flag", env: map[string]string{EnvToken: "from-env", EnvTokenFile: file}, want: "from-flag"},
		{name: "env before file", env: map[string]string{EnvToken: "from-env", EnvTokenFile: file}, want: "from-env"},
		{name: "file, trimmed", env: map[string]string{EnvTokenFile: file}, want: "from-file"},
		{name: "missing file", env: map[string]string{EnvTokenFile: filepath.Join(dir, "nope")}, wantErr: EnvTokenFile + ": open "},
		{name: "empty file", env: map[string]string{EnvTokenFile: empty}, wantErr: EnvTokenFile + ": " + empty + " is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &clientOptions{token: tt.flag}
			got, err := o.resolveToken(func(k string) string { return tt.env[k] })
			switch {
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
			case err != nil || got != tt.want:
				t.Fatalf("got %q, %v, want %q", got, err, tt.want)
			}
		})
	}
}

// A token is never sent over a connection without TLS: the CLI refuses
// before it dials, with a usage error.
func TestTokenNeedsTLS(t *testing.T) {
	o := &clientOptions{address: "127.0.0.1:1", token: "secret-value"}
	_, err := o.dial()
	if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "refusing to send the token in plain text") {
		t.Fatalf("dial with a token and no TLS: %v", err)
	}
	if strings.Contains(err.Error(), "secret-value") {
		t.Fatalf("the error shows the token: %v", err)
	}
}
