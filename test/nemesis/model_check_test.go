package nemesis

import (
	"strings"
	"testing"
	"time"
)

// TestClaimModel checks that the history check catches a lost claim and
// a release that did not happen, and accepts what failed calls allow.
func TestClaimModel(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(a, b int) (time.Time, time.Time) {
		return t0.Add(time.Duration(a) * time.Millisecond), t0.Add(time.Duration(b) * time.Millisecond)
	}
	claim := func(client int, out string, a, b int) Op {
		c, r := at(a, b)
		return Op{Client: client, Kind: opClaim, Volume: "v", Node: "a1", Workload: "w", Outcome: out, Call: c, Return: r}
	}
	release := func(client int, out string, a, b int) Op {
		o := claim(client, out, a, b)
		o.Kind = opRelease
		return o
	}
	get := func(client int, a, b int, held ...string) Op {
		c, r := at(a, b)
		return Op{Client: client, Kind: opGet, Volume: "v", Held: held, Call: c, Return: r}
	}
	tests := []struct {
		name    string
		history []Op
		ok      bool
	}{
		{"claimed and seen", []Op{claim(1, outOK, 0, 1), get(2, 2, 3, "a1/w")}, true},
		{"acknowledged claim lost", []Op{claim(1, outOK, 0, 1), get(2, 2, 3)}, false},
		{"acknowledged release still seen", []Op{claim(1, outOK, 0, 1), release(1, outOK, 2, 3), get(2, 4, 5, "a1/w")}, false},
		{"released and gone", []Op{claim(1, outOK, 0, 1), release(1, outOK, 2, 3), get(2, 4, 5)}, true},
		{"concurrent get may see either", []Op{claim(1, outOK, 0, 10), get(2, 1, 2)}, true},
		{"never claimed, seen", []Op{get(2, 1, 2, "a1/w"), claim(1, outRefused, 3, 4)}, false},
		{"refused claim changes nothing", []Op{claim(1, outRefused, 0, 1), get(2, 2, 3)}, true},
		{"failed claim: seen", []Op{claim(1, outUnknown, 0, 1), get(2, 2, 3, "a1/w"), get(2, 4, 5)}, true},
		{"failed release: still seen", []Op{claim(1, outOK, 0, 1), release(1, outUnknown, 2, 3), get(2, 4, 5, "a1/w")}, true},
		{"claimed again after a failed release", []Op{claim(1, outOK, 0, 1), release(1, outUnknown, 2, 3), claim(1, outOK, 4, 5), get(2, 6, 7)}, false},
		{"other claims are other registers", []Op{claim(1, outOK, 0, 1), get(2, 2, 3, "a1/w", "a2/x")}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CheckHistory(tt.history, time.Minute)
			if (got == "") != tt.ok {
				t.Fatalf("CheckHistory = %q, want ok=%v", got, tt.ok)
			}
			if !tt.ok && !strings.Contains(got, "v|a1/w") {
				t.Errorf("report does not name the claim: %q", got)
			}
		})
	}
}
