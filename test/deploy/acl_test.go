package deploy

import (
	"os"
	"testing"

	"github.com/csisupd/csisupd/internal/acl"
)

// dockerAgentPolicy is the policy README's "Docker and Podman" gives an
// agent token that serves the volume plugin.
const dockerAgentPolicy = repoRoot + "/deploy/acl/docker-agent.hcl"

// TestDockerAgentPolicy parses the policy as the servers do and checks
// that, with a node identity, it allows what the volume plugin calls
// (volumes: create, claim, release, delete, sync) and nothing that forces
// a release on a live node, forgets claims, or changes ACLs.
func TestDockerAgentPolicy(t *testing.T) {
	src, err := os.ReadFile(dockerAgentPolicy)
	if err != nil {
		t.Fatal(err)
	}
	p, err := acl.ParsePolicy("docker-agent", dockerAgentPolicy, src)
	if err != nil {
		t.Fatalf("parse %s: %v", dockerAgentPolicy, err)
	}
	a := acl.Compile(p)
	for _, c := range []struct {
		cap  acl.Capability
		want bool
	}{
		{acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelWrite}, true},
		{acl.Capability{Resource: acl.ResourcePlugin, Level: acl.LevelRead}, true},
		{acl.Capability{Resource: acl.ResourceOperator, Level: acl.LevelRead}, false},
		{acl.Capability{Resource: acl.ResourceOperator, Level: acl.LevelWrite}, false},
		{acl.Capability{Resource: acl.ResourceAgent, Level: acl.LevelWrite}, false},
		{acl.Capability{Resource: acl.ResourcePlugin, Level: acl.LevelWrite}, false},
	} {
		if got := a.Allows(c.cap); got != c.want {
			t.Errorf("%s allows %s = %v, want %v", dockerAgentPolicy, c.cap, got, c.want)
		}
	}
}
