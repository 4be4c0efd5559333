package rules

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func TestCheckTakeAvailability(t *testing.T) {
	const mode = "MULTI_NODE_MULTI_WRITER"
	tests := []struct {
		name         string
		availability string
		draining     []string // plugins draining on n1
		want         string   // substring of the refusal; "" admits
	}{
		{name: "active"},
		{name: "paused", availability: AvailabilityPause, want: "is paused"},
		{name: "draining volume", availability: AvailabilityDrain, want: "drains"},
		{name: "plugin draining on the node", draining: []string{"other", "p"}, want: `plugin "p" drains on node "n1"`},
		{name: "another plugin draining", draining: []string{"other"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := admitFixture()
			st.nodes["n1"].DrainingPlugins = tt.draining
			v := vol(mode, claimOn("n2", "w0", mode, false))
			v.Availability = tt.availability
			err := CheckTake(st, v, claimOn("n1", "w1", mode, false))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("CheckTake = %v, want admitted", err)
				}
				return
			}
			d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err)
			if !ok || d.GetRule() != csisupdv1.ClaimRuleAvailability || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("CheckTake = %v, want a refusal by rule %s saying %q", err, csisupdv1.ClaimRuleAvailability, tt.want)
			}
		})
	}
}

func TestParseAvailability(t *testing.T) {
	for in, want := range map[string]string{"active": AvailabilityActive, "pause": AvailabilityPause, "drain": AvailabilityDrain} {
		got, err := ParseAvailability(in)
		if err != nil || got != want || AvailabilityName(got) != in {
			t.Errorf("ParseAvailability(%q) = %q, %v; name %q", in, got, err, AvailabilityName(got))
		}
	}
	for _, bad := range []string{"", "paused", "Drain"} {
		if _, err := ParseAvailability(bad); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "active, pause or drain") {
			t.Errorf("ParseAvailability(%q) = %v, want InvalidArgument naming the choices", bad, err)
		}
	}
	if err := CheckSetAvailability(vol("SINGLE_NODE_WRITER"), "paused"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("CheckSetAvailability of a bad value = %v", err)
	}
	if err := CheckSetAvailability(nil, AvailabilityPause); status.Code(err) != codes.NotFound {
		t.Errorf("CheckSetAvailability without a volume = %v", err)
	}
}
