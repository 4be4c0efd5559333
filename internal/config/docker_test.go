package config

import (
	"os/user"
	"strconv"
	"testing"
)

// TestDockerGroup checks that docker.group takes a group name or a
// numeric id, and that an empty one leaves the socket to root's group.
func TestDockerGroup(t *testing.T) {
	g, err := user.LookupGroupId("0")
	if err != nil {
		t.Skipf("no group 0 on this host: %v", err)
	}
	tests := []struct {
		group string
		want  int
	}{
		{"", -1},
		{"0", 0},
		{"4242", 4242},
		{g.Name, 0},
	}
	for _, tc := range tests {
		t.Run(strconv.Quote(tc.group), func(t *testing.T) {
			c := mustLoad(t, input{files: map[string]string{"agent.hcl": "docker {\n  group = " + strconv.Quote(tc.group) + "\n}\n"}, paths: []string{"agent.hcl"}})
			if c.Docker.GroupID != tc.want {
				t.Errorf("docker.group %q: GroupID = %d, want %d", tc.group, c.Docker.GroupID, tc.want)
			}
		})
	}
}
