package consultest

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// waitTimeout bounds every wait of the tests.
const waitTimeout = 10 * time.Second

// rawGet fetches path from a and returns the status code and body.
func rawGet(t *testing.T, a *Agent, path string) (int, []byte) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(a.URL() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// rawJSON fetches path from a, expects 200 and decodes the body into v.
func rawJSON(t *testing.T, a *Agent, path string, v any) {
	t.Helper()
	code, body := rawGet(t, a, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: status %d: %s", path, code, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, body)
	}
}

// keys returns the sorted keys of a JSON object.
func keys(m map[string]json.RawMessage) []string {
	return slices.Sorted(maps.Keys(m))
}

// waitFor waits until cond holds, re-evaluating it at every change of a
// (Changed), and fails the test after waitTimeout.
func waitFor(t *testing.T, a *Agent, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		ch := a.Changed()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitCheck waits until the local check id satisfies cond and returns it.
func waitCheck(t *testing.T, a *Agent, id, what string, cond func(api.AgentCheck) bool) api.AgentCheck {
	t.Helper()
	var last api.AgentCheck
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		ch := a.Changed()
		chk, ok := a.Check(id)
		if ok && cond(chk) {
			return chk
		}
		last = chk
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for check %s to be %s; last %+v", id, what, last)
		}
	}
}

// runnerOf returns the running probe loop of a check, or nil.
func runnerOf(a *Agent, id string) *checkRunner {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	if c, ok := a.checks[id]; ok {
		return c.run
	}
	return nil
}

// waitDone waits for a runner to stop.
func waitDone(t *testing.T, r *checkRunner) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(waitTimeout):
		t.Fatal("check runner did not stop")
	}
}
