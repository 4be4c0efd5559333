package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	large := filepath.Join(dir, "large")
	if err := os.WriteFile(large, []byte(strings.Repeat("x", maxTokenFileSize+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		flag     string
		flagFile string
		env      map[string]string
		want     string
		wantErr  string
	}{
		{name: "none"},
		{name: "flag wins", flag: "from-flag", env: map[string]string{EnvToken: "from-env", EnvTokenFile: file}, want: "from-flag"},
		{name: "--token-file before env", flagFile: file, env: map[string]string{EnvToken: "from-env"}, want: "from-file"},
		{name: "--token-file missing", flagFile: filepath.Join(dir, "nope"), wantErr: "--token-file " + filepath.Join(dir, "nope") + ": no such file"},
		{name: "--token-file FIFO", flagFile: fifo, wantErr: "--token-file " + fifo + ": not a regular file (a FIFO)"},
		{name: "--token-file empty", flagFile: empty, wantErr: "--token-file: " + empty + " is empty"},
		{name: "--token-file too large", flagFile: large, wantErr: "--token-file " + large},
		{name: "--token and --token-file", flag: "from-flag", flagFile: file, wantErr: "--token and --token-file exclude each other"},
		{name: "env before file", env: map[string]string{EnvToken: "from-env", EnvTokenFile: file}, want: "from-env"},
		{name: "file, trimmed", env: map[string]string{EnvTokenFile: file}, want: "from-file"},
		{name: "missing file", env: map[string]string{EnvTokenFile: filepath.Join(dir, "nope")}, wantErr: EnvTokenFile + " " + filepath.Join(dir, "nope") + ": no such file"},
		// A FIFO nobody writes to is refused, not opened: the command
		// would block.
		{name: "FIFO", env: map[string]string{EnvTokenFile: fifo}, wantErr: EnvTokenFile + " " + fifo + ": not a regular file (a FIFO)"},
		{name: "empty file", env: map[string]string{EnvTokenFile: empty}, wantErr: EnvTokenFile + ": " + empty + " is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &clientOptions{token: tt.flag, tokenFile: tt.flagFile}
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

// TestCLIRefusesFIFOs: every file the CLI is given by path is refused when
// it is a FIFO, naming the flag or file, instead of blocking the command
// in its open.
func TestCLIRefusesFIFOs(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	dial := func(o *clientOptions) error {
		o.address = "127.0.0.1:1"
		conn, err := o.dial()
		if err == nil {
			_ = conn.Close()
		}
		return err
	}
	tests := []struct {
		name string
		run  func() error
		want string
	}{
		{"--ca-file", func() error { return dial(&clientOptions{caFile: fifo}) }, "--ca-file " + fifo},
		{"--client-cert", func() error { return dial(&clientOptions{certFile: fifo, keyFile: fifo}) }, "--client-cert " + fifo},
		{"policy rules", func() error { _, err := readRules(nil, fifo); return err }, "policy rules " + fifo},
		{"volume specification", func() error { _, err := readSpec(fifo, nil); return err }, "volume specification " + fifo},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.run()
			if want := tt.want + ": not a regular file (a FIFO)"; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("err = %v, want %q", err, want)
			}
		})
	}
}
