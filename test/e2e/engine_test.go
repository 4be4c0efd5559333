package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// busyboxPath is Debian's busybox-static, the one program of the tests'
// container image.
const busyboxPath = "/bin/busybox"

// busyboxApplets are the commands the tests run in a container, linked to
// busybox in the image.
var busyboxApplets = []string{"sh", "cat", "echo", "sleep"}

// engineCommandTimeout bounds each command of a container engine the
// tests run; a volume plugin call inside it waits on the servers.
const engineCommandTimeout = 3 * time.Minute

// requireEngine skips the test, saying why, unless it runs as root with
// each of tools on PATH and a static busybox to build an image from: the
// real engines need all of it (Debian: podman, runc, busybox-static).
func requireEngine(t *testing.T, engine string, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("not root: %s runs containers as root here", engine)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the %s tests need it", tool, engine)
		}
	}
	if err := staticBinary(busyboxPath); err != nil {
		t.Skipf("no static busybox for the test image (Debian: apt-get install busybox-static): %v", err)
	}
}

// staticBinary returns an error unless path is an ELF executable without
// an interpreter, one that runs in an image holding nothing else.
func staticBinary(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is linked dynamically", path)
		}
	}
	return nil
}

// busyboxImage writes the root file system of the tests' image, as a tar
// file in dir: /bin/busybox and its applets' links, no registry needed.
func busyboxImage(t *testing.T, dir string) string {
	t.Helper()
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(h *tar.Header, body []byte) {
		h.ModTime = time.Unix(0, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	write(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	write(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))}, bin)
	for _, applet := range busyboxApplets {
		write(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "busybox.tar")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runEngine runs an engine's command line, bounded by
// engineCommandTimeout, and returns its stdout and stderr.
func runEngine(t *testing.T, env []string, bin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), engineCommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// recordedCall is one call of an engine to the volume plugin, as the
// recorder saw it pass.
type recordedCall struct {
	Path        string // the endpoint, such as /VolumeDriver.Mount
	ContentType string // of the request; Docker sends none
	Accept      string // of the request
	Body        string // of the request
	Status      int    // of the answer; 0 when the plugin could not be reached
	Answer      string // the answer's body
}

// request decodes the call's request body into v.
func (c recordedCall) request(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(c.Body), v); err != nil {
		t.Fatalf("%s request %q: %v", c.Path, c.Body, err)
	}
}

// String is the call on one line, for logs.
func (c recordedCall) String() string {
	return fmt.Sprintf("%s %s -> %d %s", c.Path, strings.TrimSpace(c.Body), c.Status, strings.TrimSpace(c.Answer))
}

// maxRecordedBody caps each recorded body: the plugin protocol's bodies
// are small JSON documents.
const maxRecordedBody = 1 << 20

// pluginRecorder stands between an engine and the agent's volume plugin
// socket: it passes every call on unchanged, on a connection of its own
// (so that the agent may restart behind it), and records it.
type pluginRecorder struct {
	socket string // where the engine calls
	mu     sync.Mutex
	calls  []recordedCall
}

// recordPlugin serves a recorder on a new socket in a temporary directory
// that passes calls on to target, until the test ends.
func recordPlugin(t *testing.T, target string) *pluginRecorder {
	t.Helper()
	r := &pluginRecorder{socket: filepath.Join(testutil.TempDir(t), "plugin.sock")}
	l, err := net.Listen("unix", r.socket)
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", target)
		},
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: engineCommandTimeout,
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "plugin"
		},
		Transport: transport,
		ModifyResponse: func(resp *http.Response) error {
			body, err := io.ReadAll(io.LimitReader(resp.Body, maxRecordedBody))
			resp.Body.Close()
			if err != nil {
				return err
			}
			resp.Body = io.NopCloser(bytes.NewReader(body))
			r.finish(resp.Request, resp.StatusCode, string(body))
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			r.finish(req, 0, err.Error())
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, err := io.ReadAll(io.LimitReader(req.Body, maxRecordedBody))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
			req = req.WithContext(context.WithValue(req.Context(), recordedKey{}, recordedCall{
				Path: req.URL.Path, ContentType: req.Header.Get("Content-Type"), Accept: req.Header.Get("Accept"), Body: string(body),
			}))
			proxy.ServeHTTP(w, req)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		transport.CloseIdleConnections()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("the plugin recorder: %v", err)
		}
	})
	return r
}

// recordedKey carries a call's request half through the proxy.
type recordedKey struct{}

// finish records the call of req with its answer.
func (r *pluginRecorder) finish(req *http.Request, status int, answer string) {
	c, _ := req.Context().Value(recordedKey{}).(recordedCall)
	c.Status, c.Answer = status, answer
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}

// Calls returns the calls recorded so far, the oldest first.
func (r *pluginRecorder) Calls() []recordedCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recordedCall(nil), r.calls...)
}

// last returns the last recorded call to path naming volume, failing the
// test when there is none.
func (r *pluginRecorder) last(t *testing.T, path, volume string) recordedCall {
	t.Helper()
	calls := r.Calls()
	slices.Reverse(calls)
	return r.find(t, calls, path, volume)
}

// first returns the first recorded call to path naming volume, failing
// the test when there is none.
func (r *pluginRecorder) first(t *testing.T, path, volume string) recordedCall {
	t.Helper()
	return r.find(t, r.Calls(), path, volume)
}

// find returns the first of calls to path naming volume.
func (r *pluginRecorder) find(t *testing.T, calls []recordedCall, path, volume string) recordedCall {
	t.Helper()
	for _, c := range calls {
		var req struct{ Name string }
		if c.Path == path && json.Unmarshal([]byte(c.Body), &req) == nil && req.Name == volume {
			return c
		}
	}
	t.Fatalf("no %s call for volume %s among %d calls:\n%s", path, volume, len(calls), r)
	return recordedCall{}
}

// count returns how many calls to path were recorded.
func (r *pluginRecorder) count(path string) int {
	n := 0
	for _, c := range r.Calls() {
		if c.Path == path {
			n++
		}
	}
	return n
}

// mountID returns the ID of the last Mount call for volume: the claim's
// workload is "docker-" and it.
func (r *pluginRecorder) mountID(t *testing.T, volume string) string {
	t.Helper()
	var req struct{ Name, ID string }
	r.last(t, "/VolumeDriver.Mount", volume).request(t, &req)
	if req.ID == "" {
		t.Fatalf("the engine's Mount of %s carried no ID", volume)
	}
	return req.ID
}

// String lists the calls, one a line.
func (r *pluginRecorder) String() string {
	var b strings.Builder
	for _, c := range r.Calls() {
		b.WriteString(c.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// wantPluginError fails the test unless c was answered as Docker's plugin
// helpers answer an error, which Podman requires to see one: a status
// other than 200 and a JSON body whose Err holds each of want.
func wantPluginError(t *testing.T, c recordedCall, want ...string) {
	t.Helper()
	var answer struct{ Err string }
	if c.Status == http.StatusOK || json.Unmarshal([]byte(c.Answer), &answer) != nil || answer.Err == "" {
		t.Fatalf("%s: want an error status with {\"Err\": ...}, got %d %q", c.Path, c.Status, c.Answer)
	}
	for _, w := range want {
		if !strings.Contains(answer.Err, w) {
			t.Fatalf("%s: Err %q does not say %q", c.Path, answer.Err, w)
		}
	}
}
