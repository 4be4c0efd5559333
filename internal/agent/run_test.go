package agent

import "testing"

func TestDevReadyLine(t *testing.T) {
	tests := []struct {
		addr string
		want string
	}{
		{"127.0.0.1:4780", `csisupd is ready: try "csisupd status"`},
		{"127.0.0.1:24780", `csisupd is ready: try "csisupd --address 127.0.0.1:24780 status"`},
		{"10.0.0.5:4780", `csisupd is ready: try "csisupd --address 10.0.0.5:4780 status"`},
	}
	for _, tt := range tests {
		if got := devReadyLine(tt.addr); got != tt.want {
			t.Errorf("devReadyLine(%q) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}
