package agent

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// The debugging API of a running agent: Monitor streams its own logger
// below its level, Metrics and Config answer, and enable_debug, changed by
// a reload, turns /debug/pprof/ and (ACLs off) Profile on and off.
func TestDebugAPI(t *testing.T) {
	cfg := testConfig(t)
	cfg.LogLevel = "info"
	var logs testutil.SyncBuffer
	log := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "test", Output: &logs})
	a, err := New(Config{Config: cfg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	conn, err := grpc.NewClient(a.RPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := csisupdv1.NewAgentClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Monitor at debug under an agent at info.
	mon, err := cl.Monitor(ctx, &csisupdv1.MonitorRequest{LogLevel: "debug"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the monitor's sink", func() bool { return a.agentService.Monitors() == 1 })
	log.Named("volumes").Debug("a debug line of the agent")
	// The agent's own lines logged since the sink attached come first.
	var seen strings.Builder
	for !strings.Contains(seen.String(), "[DEBUG] test.volumes: a debug line of the agent") {
		resp, err := mon.Recv()
		if err != nil {
			t.Fatalf("monitor: %v after %q", err, seen.String())
		}
		seen.Write(resp.GetData())
	}
	if strings.Contains(logs.String(), "a debug line of the agent") {
		t.Errorf("the agent at info logged a debug line:\n%s", logs.String())
	}

	m, err := cl.Metrics(ctx, &csisupdv1.MetricsRequest{})
	if err != nil || !strings.Contains(string(m.GetText()), "\ngo_goroutines ") {
		t.Errorf("Metrics: %v, %.300s", err, m.GetText())
	}

	pprofURL := "http://" + a.HTTPAddr().String() + "/debug/pprof/"
	check := func(debug bool) {
		t.Helper()
		for _, path := range []string{"", "cmdline", "goroutine?debug=1"} {
			resp, err := http.Get(pprofURL + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := http.StatusNotFound
			if debug {
				want = http.StatusOK
			}
			if resp.StatusCode != want {
				t.Errorf("enable_debug = %v: GET /debug/pprof/%s = %d, want %d: %.200s", debug, path, resp.StatusCode, want, body)
			}
		}
		_, err := readProfile(ctx, cl, &csisupdv1.ProfileRequest{Profile: "heap"})
		if debug && err != nil {
			t.Errorf("enable_debug = true: Profile: %v", err)
		}
		if !debug && status.Code(err) != codes.PermissionDenied {
			t.Errorf("enable_debug = false: Profile: %v, want PermissionDenied", err)
		}
		c, err := cl.Config(ctx, &csisupdv1.ConfigRequest{})
		if want := "enable_debug = " + strconv.FormatBool(debug) + "\n"; err != nil || !strings.Contains(c.GetHcl(), want) {
			t.Errorf("Config: %v, want %q in\n%s", err, want, c.GetHcl())
		}
	}
	check(false)
	on := *cfg
	on.EnableDebug = true
	if err := a.Reload(&on); err != nil {
		t.Fatal(err)
	}
	check(true)
	if err := a.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	check(false)
	if strings.Contains(logs.String(), "enable_debug changed") {
		t.Errorf("enable_debug was not applied live:\n%s", logs.String())
	}
}

// readProfile returns the profile req asks for, or the call's error.
func readProfile(ctx context.Context, cl csisupdv1.AgentClient, req *csisupdv1.ProfileRequest) ([]byte, error) {
	s, err := cl.Profile(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []byte
	for {
		chunk, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, chunk.GetData()...)
	}
}
