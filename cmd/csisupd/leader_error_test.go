package main

import (
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testcluster"
)

// An error of a call that the leader ran names the server the CLI called
// and the leader, whichever server the CLI called: a follower forwards the
// call and passes the leader's name on.
func TestErrorNamesTheLeader(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := c.WaitForLeader(t, 30*time.Second)
	for _, m := range c.Members() {
		_, err := execute(t, "--address", m.RPCAddr, "volume", "status", "nope")
		if err == nil {
			t.Fatalf("status of an unknown volume at %s succeeded", m.ID)
		}
		want := "server " + m.RPCAddr + " (leader " + leader.ID + " at " + leader.RPCAddr + "): "
		if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("error through %s = %q, want it to start %q", m.ID, err, want)
		}
	}
	// A stale read is answered by the server called, not by the leader.
	follower := c.Member((leader.Index + 1) % 3)
	_, err := execute(t, "--address", follower.RPCAddr, "volume", "status", "nope", "--stale")
	if err == nil || strings.Contains(err.Error(), "leader") {
		t.Errorf("stale status of an unknown volume = %v, want an error without a leader", err)
	}
}
