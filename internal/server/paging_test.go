package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestParsePageErrors(t *testing.T) {
	for _, tt := range []struct {
		name     string
		pageSize uint32
		token    string
	}{
		{name: "above max", pageSize: MaxListPageSize + 1},
		{name: "not base64", token: "!!!"},
		{name: "not utf8", token: pageToken("\xff\xfe")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parsePage(tt.pageSize, tt.token)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
		})
	}
	if p, err := parsePage(MaxListPageSize, pageToken("n05")); err != nil || p.from != "n05" || p.limit != MaxListPageSize {
		t.Fatalf("parsePage(max, token) = %+v, %v", p, err)
	}
}
