package upgrade

import (
	"path/filepath"
	"testing"

	"github.com/csisupd/csisupd/internal/testutil"
)

// everyAnswer names every golden answer.
func everyAnswer() []string {
	return []string{"volumes", "nodes", "tokens", "policies", "peers", "token-self"}
}

// fixtureCluster is the fixture's three servers running the code under
// test from copies of their old data_dirs.
type fixtureCluster struct {
	p       pki
	members []member
	cfgs    []string
	procs   []*testutil.Process
}

// startFixtureCluster copies the fixture's data_dirs and starts the three
// servers from them one at a time, each at the addresses the fixture's
// raft configuration records, and waits for a leader and three voters.
func startFixtureCluster(t *testing.T, cred credentials) *fixtureCluster {
	t.Helper()
	c := &fixtureCluster{p: newPKI(t, binary, 3, 0), members: fixtureServers()}
	var join []string
	for _, m := range c.members {
		join = append(join, m.rpc())
	}
	for i, m := range c.members {
		dir := testutil.TempDir(t)
		copyTree(t, filepath.Join(dataDirs, m.name), dir)
		c.cfgs = append(c.cfgs, serverConfig(t, c.p, m, i, dir, join))
		c.procs = append(c.procs, startAgent(t, binary, m, c.cfgs[i]))
	}
	waitForCluster(t, c.p, c.members[0].rpc(), cred.ManagementSecret, 3, false)
	return c
}

// TestUpgradeFromFixture starts the fixture's servers, written by the
// release before the storage format, with the code under test: each loads
// its raft snapshot and replays the log after it. The API must answer as
// the release did (the volumes with their claims, the nodes with their
// plugins, ACL tokens and policies, the client token resolved from its
// secret, the raft configuration of three voters with their ids and
// addresses), again after every server was restarted in turn (each
// restart waiting for the cluster to be healthy), and a write must
// succeed.
func TestUpgradeFromFixture(t *testing.T) {
	lockAddresses(t)
	want, cred := readGolden(t)
	c := startFixtureCluster(t, cred)
	addr := c.members[1].rpc() // any server: reads go to the leader
	compareAnswers(t, "after the upgrade", want, readAnswers(t, c.p, addr, cred), everyAnswer()...)
	compareEachServer(t, "after the upgrade", c.p, c.members, want, cred)

	for i, m := range c.members {
		stopAgent(t, m.name, c.procs[i])
		c.procs[i] = startAgent(t, binary, m, c.cfgs[i])
		waitHTTP(t, m, c.procs[i], "/v1/ready")
		waitForCluster(t, c.p, addr, cred.ManagementSecret, 3, true)
	}
	compareAnswers(t, "after a rolling restart", want, readAnswers(t, c.p, addr, cred), everyAnswer()...)
	compareEachServer(t, "after a rolling restart", c.p, c.members, want, cred)
	checkWrites(t, c.p, addr, cred)
}

// checkWrites requires a volume to be registered with the management
// token and refused with the fixture's client (reader) token, and the new
// volume to be read back.
func checkWrites(t *testing.T, p pki, addr string, cred credentials) {
	t.Helper()
	args := []string{"volume", "register", "vol-after-upgrade", "--plugin", "tp", "--external-id", "ext-after-upgrade"}
	if res := p.cli(t, addr, cred.ClientSecret, args...); res.code != 1 {
		t.Errorf("a volume registered with the reader token: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	p.mustCLI(t, addr, cred.ManagementSecret, args...)
	var v struct {
		ID         string `json:"id"`
		ExternalID string `json:"external_id"`
	}
	p.cliJSON(t, addr, cred.ManagementSecret, &v, "volume", "status", "vol-after-upgrade")
	if v.ID != "vol-after-upgrade" || v.ExternalID != "ext-after-upgrade" {
		t.Errorf("the volume written after the upgrade reads back as %+v", v)
	}
}

// TestRestoreOldSnapshot restores the fixture's `operator snapshot save`
// file, written by the release before the storage format, into a new
// single server running the code under test, and requires the state the
// release answered with (not the raft configuration, which is the new
// server's own).
func TestRestoreOldSnapshot(t *testing.T) {
	lockAddresses(t)
	want, cred := readGolden(t)
	p := newPKI(t, binary, 1, 0)
	m := fixtureServers()[0]
	startAgent(t, binary, m, serverConfig(t, p, m, 0, testutil.TempDir(t), nil))
	addr := m.rpc()
	fresh := bootstrapACL(t, p, addr)
	snap, err := filepath.Abs(snapshotFile)
	if err != nil {
		t.Fatal(err)
	}
	p.mustCLI(t, addr, fresh, "operator", "snapshot", "restore", snap)
	// The restored ACL state is the fixture's: its tokens replace the new
	// bootstrap token.
	compareAnswers(t, "after the restore", want, readAnswers(t, p, addr, cred), "volumes", "nodes", "tokens", "policies", "token-self")
	if res := p.cli(t, addr, fresh, "volume", "list"); res.code != 1 {
		t.Errorf("the new server's own bootstrap token still works after the restore: exit %d", res.code)
	}
	checkWrites(t, p, addr, cred)
}
