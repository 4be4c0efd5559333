package server

import (
	"encoding/base64"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MaxListPageSize is the largest page_size a Control list accepts: a
// bigger page would hold the leader's CPU and a message buffer for one
// call as long as an unbounded list does.
const MaxListPageSize = 1000

// listPage is one page request, checked: limit 0 means no limit, from is
// the id the page starts at ("" for the first page).
type listPage struct {
	limit int
	from  string
}

// parsePage checks page_size and decodes next_token. The token is the id
// the next page starts at, encoded so clients treat it as opaque; resuming
// from an id, not an offset, keeps paging stable while objects are added
// or removed between pages.
func parsePage(pageSize uint32, token string) (listPage, error) {
	if pageSize > MaxListPageSize {
		return listPage{}, status.Errorf(codes.InvalidArgument, "page_size %d is above the maximum of %d", pageSize, MaxListPageSize)
	}
	p := listPage{limit: int(pageSize)}
	if token == "" {
		return p, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) == 0 || !utf8.Valid(raw) {
		return listPage{}, status.Errorf(codes.InvalidArgument, "next_token %q is not a token of a previous page", token)
	}
	p.from = string(raw)
	return p, nil
}

// pageToken encodes the id the next page starts at; "" when none remains.
func pageToken(nextID string) string {
	if nextID == "" {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(nextID))
}

// responseToken is the next_token field of a list response: unset on the
// last page, so the JSON of a complete list keeps its fields.
func responseToken(nextID string) *string {
	if nextID == "" {
		return nil
	}
	return proto.String(pageToken(nextID))
}
