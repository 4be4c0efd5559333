package server_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/testutil"
)

// claimWhileLeaderDies takes a claim of volume v for w1 through a
// follower, holds the node's mount until the leader is killed, and
// returns the new leader's server with the error the caller saw: the
// claim is then taken but not mounted. Every mount from the kill on
// fails with mountErr (none when nil): set before the kill, so that the
// new leader's watcher, however soon it resumes the claim, meets it.
func claimWhileLeaderDies(t *testing.T, e *claimEnv, mountErr error) (*server.Server, error) {
	t.Helper()
	entered, release := e.nv.holdMounts()
	defer release()
	errc := make(chan error, 1)
	go func() {
		_, err := e.claim("v", "node-a", "w1", nil)
		errc <- err
	}()
	select {
	case <-entered:
	case <-time.After(15 * time.Second):
		t.Fatal("the claim never reached the node's mount")
	}
	e.nv.setFail(mountErr, nil)
	old := e.c.Leader()
	e.c.Kill(old.Index)
	var err error
	select {
	case err = <-errc:
	case <-time.After(30 * time.Second):
		t.Fatal("the claim did not return after its leader died")
	}
	leader := e.c.WaitForLeader(t, 20*time.Second)
	if leader.Index == old.Index {
		t.Fatal("the killed server leads")
	}
	return leader.Server(), err
}

// unfinishedClaim starts 3 servers (claim_resume_timeout an hour: only
// the new leader's resuming of an earlier term's claims finishes the
// claim within the tests' waits) and nodes
// node-a and node-b, registers volume v, and leaves the claim of w1 on
// node-a taken but unmounted by a leader that died; the caller saw an
// error. Mounts from then on fail with mountErr (see
// claimWhileLeaderDies). It returns the env, talking to a running server,
// and the new leader.
func unfinishedClaim(t *testing.T, mountErr error) (*claimEnv, *server.Server) {
	t.Helper()
	e := newClaimEnv(t, 3, func(cfg *server.Config) { cfg.ClaimResumeTimeout = time.Hour },
		map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}, "node-b": {monolith("p1", "node-b")}})
	e.register(t, &csisupdv1.Volume{Id: "v", PluginId: "p1", ExternalId: "x-v"})
	e.cl = e.c.Control(firstRunning(e))

	leader, err := claimWhileLeaderDies(t, e, mountErr)
	if err == nil {
		t.Fatal("the claim succeeded though its leader died before the mount")
	}
	e.cl = e.c.Control(firstRunning(e))
	return e, leader
}

// TestUnfinishedClaimIsFinishedAfterLeaderDies: a leader dies while the
// node mounts a claim it took. The caller sees an error; the claim stays
// taken without its mount until the new leader's watcher, which knows
// from the claim's leader_term that nobody drives it any more, runs the
// claim's steps and records the mount, long before claim_resume_timeout. A
// second writer is refused all along, and the scheduler learns the
// outcome by claiming again.
func TestUnfinishedClaimIsFinishedAfterLeaderDies(t *testing.T) {
	e, leader := unfinishedClaim(t, nil)
	defer func() {
		if t.Failed() {
			t.Log(e.logs.String())
		}
	}()
	c := claimOf(statepb.VolumeToAPI(leader.State().Volume("v")), "node-a", "w1")
	if c.GetState() != rules.StateTaken {
		t.Fatalf("claim after the leader died: %v, want taken", c)
	}
	_, err := e.claim("v", "node-b", "w2", nil)
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleAccessMode {
		t.Fatalf("second writer while the first claim is unfinished: %v, want access-mode", d)
	}
	testutil.WaitFor(t, 20*time.Second, "the new leader to finish the claim", func() bool {
		c := claimOf(statepb.VolumeToAPI(leader.State().Volume("v")), "node-a", "w1")
		return c.GetState() == rules.StateTaken && c.GetMounted() && c.GetControllerPublished()
	})
	c = claimOf(e.volume(t, "v"), "node-a", "w1")
	if e.nv.mounted() != 1 || !strings.Contains(c.GetHostPath(), "/per-workload/w1/v/") || !strings.Contains(c.GetStagingPath(), "/staging/v/") {
		t.Fatalf("after the watcher: %d mounts, claim %v", e.nv.mounted(), c)
	}
	if e.logs.lines("resuming unfinished volume claim", "workload=w1") == 0 {
		t.Fatalf("the watcher did not log the resumed claim\n%s", e.logs.String())
	}
	// Claiming again returns the finished claim.
	resp, err := e.claim("v", "node-a", "w1", nil)
	if err != nil || resp.GetClaim().GetHostPath() != c.GetHostPath() || !resp.GetClaim().GetMounted() {
		t.Fatalf("claim again: %v, %v; want the finished claim", resp.GetClaim(), err)
	}
}

// TestUnfinishedClaimIsReleasedWhenItsStepsFail: as above, but the node
// refuses the mount when the watcher tries: the claim is released, and
// only then can another workload take the volume.
func TestUnfinishedClaimIsReleasedWhenItsStepsFail(t *testing.T) {
	e, leader := unfinishedClaim(t, status.Error(codes.FailedPrecondition, "fake: volume gone"))
	defer func() {
		if t.Failed() {
			t.Log(e.logs.String())
		}
	}()
	testutil.WaitFor(t, 20*time.Second, "the new leader to release the claim", func() bool {
		v := leader.State().Volume("v")
		return v != nil && len(v.GetClaims()) == 0
	})
	e.nv.setFail(nil, nil)
	if e.nv.mounted() != 0 {
		t.Fatalf("%d mounts left after the release", e.nv.mounted())
	}
	if _, err := e.claim("v", "node-b", "w2", nil); err != nil {
		t.Fatalf("claim by another workload after the release: %v", err)
	}
}

// firstRunning returns the index of a running server.
func firstRunning(e *claimEnv) int {
	for i, m := range e.c.Members() {
		if m.Running() {
			return i
		}
	}
	return 0
}
