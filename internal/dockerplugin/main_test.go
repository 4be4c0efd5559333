package dockerplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/csisupd/csisupd/internal/dockerplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// dialHelperEnv, when set to a socket path, makes the test binary a
// helper that connects to that socket and exits: 0 connected, 3 refused
// with EACCES, 4 another error. The socket tests run it as another user.
const dialHelperEnv = "DOCKERPLUGIN_TEST_DIAL"

func TestMain(m *testing.M) {
	if sock := os.Getenv(dialHelperEnv); sock != "" {
		os.Exit(dialHelper(sock))
	}
	goleak.VerifyTestMain(m)
}

func dialHelper(sock string) int {
	conn, err := net.Dial("unix", sock)
	switch {
	case err == nil:
		_ = conn.Close()
		return 0
	case errors.Is(err, syscall.EACCES):
		return 3
	default:
		fmt.Fprintln(os.Stderr, err)
		return 4
	}
}

// waitTimeout bounds every wait of these tests.
const waitTimeout = 10 * time.Second

// testLease is the lease of the test servers' claims.
const testLease = 30 * time.Second

// testConfig returns a Config with a socket in a new directory, cluster
// and plugin "testplugin" as the default.
func testConfig(t *testing.T, cluster dockerplugin.Cluster) dockerplugin.Config {
	t.Helper()
	return dockerplugin.Config{
		Socket:        filepath.Join(testutil.TempDir(t), "plugins", "csisupd.sock"),
		DefaultPlugin: "testplugin",
		Lease:         testLease,
		Cluster:       cluster,
	}
}

// startServer makes a Server of cfg and runs it until the test ends,
// when it checks that Run returned nil and removed the socket.
func startServer(t *testing.T, cfg dockerplugin.Config) *pluginClient {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: testWriter{t}})
	s, err := dockerplugin.New(cfg, logger)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Errorf("Run did not return within %s of its context's end", waitTimeout)
		}
		if _, err := os.Lstat(s.Addr()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s after Run returned: %v, want it removed", s.Addr(), err)
		}
	})
	return newPluginClient(t, s.Addr())
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// pluginClient calls the plugin socket as an engine does: POST with a
// JSON body, over a unix socket, with net/http.
type pluginClient struct {
	t      *testing.T
	client *http.Client
}

func newPluginClient(t *testing.T, sock string) *pluginClient {
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &pluginClient{t: t, client: &http.Client{Transport: tr, Timeout: waitTimeout}}
}

// answer is one HTTP answer of the plugin.
type answer struct {
	status      int
	contentType string
	body        []byte
}

// decode decodes the answer's body into v, failing the test when it is
// not JSON.
func (a answer) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("answer %d %q is not JSON: %v", a.status, a.body, err)
	}
}

// errText returns the Err of an error answer, failing the test unless
// the answer is one: a status above 299, the plugins' content type and
// a body {"Err": "..."} with a message.
func (a answer) errText(t *testing.T) string {
	t.Helper()
	if a.status < 300 {
		t.Fatalf("status %d, want an error; body %s", a.status, a.body)
	}
	checkContentType(t, a)
	var e struct{ Err string }
	a.decode(t, &e)
	if e.Err == "" {
		t.Fatalf("error answer %d without Err: %s", a.status, a.body)
	}
	return e.Err
}

func checkContentType(t *testing.T, a answer) {
	t.Helper()
	if a.contentType != "application/vnd.docker.plugins.v1.1+json" {
		t.Errorf("content type %q, want application/vnd.docker.plugins.v1.1+json", a.contentType)
	}
}

// do sends a request with method, path, content type and body.
func (c *pluginClient) do(method, path, ctype string, body []byte) answer {
	c.t.Helper()
	req, err := http.NewRequest(method, "http://plugin"+path, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: data}
}

// call posts req (nil: no body) to path as Docker does, with Docker's
// request content type.
func (c *pluginClient) call(path string, req any) answer {
	c.t.Helper()
	var body []byte
	if req != nil {
		var err error
		if body, err = json.Marshal(req); err != nil {
			c.t.Fatal(err)
		}
	}
	return c.do(http.MethodPost, path, "application/vnd.docker.plugins.v1.2+json", body)
}

// ok posts req to path, fails the test unless the answer is 200 with the
// plugins' content type, and decodes it into out (when not nil).
func (c *pluginClient) ok(path string, req, out any) {
	c.t.Helper()
	a := c.call(path, req)
	if a.status != http.StatusOK {
		c.t.Fatalf("%s: status %d, body %s", path, a.status, a.body)
	}
	checkContentType(c.t, a)
	var e struct{ Err string }
	a.decode(c.t, &e)
	if e.Err != "" {
		c.t.Fatalf("%s: 200 with Err %q", path, e.Err)
	}
	if out != nil {
		a.decode(c.t, out)
	}
}

// fails posts req to path and returns the Err of the answer, failing the
// test unless it is an error answer with status 500.
func (c *pluginClient) fails(path string, req any) string {
	c.t.Helper()
	a := c.call(path, req)
	if a.status != http.StatusInternalServerError {
		c.t.Fatalf("%s: status %d, want 500; body %s", path, a.status, a.body)
	}
	return a.errText(c.t)
}

// The requests of the protocol, as Docker's documentation writes them.
type (
	nameReq struct {
		Name string
	}
	createReq struct {
		Name string
		Opts map[string]string
	}
	mountReq struct {
		Name string
		ID   string
	}
	mountResp struct {
		Mountpoint string
	}
)
