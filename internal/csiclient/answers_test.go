package csiclient

import (
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Answers a plugin may give instead of a well-formed gRPC reply: each is
// refused with a status that says what was wrong, and those that break the
// protocol are marked as violations so the supervisor can back the plugin
// off. The plugin's own error statuses are not violations.
func TestBrokenAnswers(t *testing.T) {
	ok := pluginInfo(t, "fine")
	grpcOK := []string{":status", "200", "content-type", "application/grpc"}
	details := func(code codes.Code) string {
		b, err := proto.Marshal(&spb.Status{Code: int32(code), Message: "from details"})
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawStdEncoding.EncodeToString(b)
	}
	// reply writes headers, then body as one DATA frame unless nil, then
	// trailers unless nil (the stream ends with the last of them).
	reply := func(headers []string, body []byte, trailers []string) func(p *peerConn, id uint32) error {
		return func(p *peerConn, id uint32) error {
			if err := p.writeHeaders(id, body == nil && trailers == nil, headers...); err != nil {
				return err
			}
			if body != nil {
				if err := p.writeData(id, trailers == nil, body, 0); err != nil {
					return err
				}
			}
			if trailers != nil {
				return p.writeHeaders(id, true, trailers...)
			}
			return nil
		}
	}
	compressed := grpcFrame(ok)
	compressed[0] = 1
	twoMessages := append(grpcFrame(ok), grpcFrame(ok)...)
	truncated := grpcFrame(ok)[:10]

	cases := []struct {
		name      string
		answer    func(p *peerConn, id uint32) error
		want      codes.Code
		text      string
		violation bool
	}{
		{name: "plugin error (control)", answer: reply(grpcOK, nil, []string{"grpc-status", "9", "grpc-message", "not ready"}),
			want: codes.FailedPrecondition, text: "not ready"},
		{name: "plugin error, trailers only (control)", answer: reply(append(grpcOK, "grpc-status", "5", "grpc-message", "gone"), nil, nil),
			want: codes.NotFound, text: "gone"},
		{name: "HTTP 404", answer: reply([]string{":status", "404", "content-type", "text/plain"}, []byte("no such page"), nil),
			want: codes.Unimplemented, text: "HTTP status", violation: true},
		// A redirect followed would send the request again and succeed
		// (the plugin answers the next request); it must fail the call.
		{name: "HTTP 302", answer: reply([]string{":status", "302", "location", "/csi.v1.Identity/GetPluginInfo"}, nil, nil),
			want: codes.Unknown, text: "HTTP status", violation: true},
		{name: "HTTP 503", answer: reply([]string{":status", "503", "content-type", "application/grpc"}, nil, nil),
			want: codes.Unavailable, text: "HTTP status", violation: true},
		{name: "not gRPC: text/plain", answer: reply([]string{":status", "200", "content-type", "text/plain"}, []byte("hello"), nil),
			want: codes.Unknown, text: "content-type", violation: true},
		{name: "gRPC with another codec", answer: reply([]string{":status", "200", "content-type", "application/grpc+json"}, grpcFrame([]byte("{}")), []string{"grpc-status", "0"}),
			want: codes.Internal, text: "content-type", violation: true},
		{name: "compressed though not offered", answer: reply(append(grpcOK, "grpc-encoding", "gzip"), compressed, []string{"grpc-status", "0"}),
			want: codes.Internal, text: "compressed", violation: true},
		{name: "compressed flag without grpc-encoding", answer: reply(grpcOK, compressed, []string{"grpc-status", "0"}),
			want: codes.Internal, text: "compress", violation: true},
		{name: "no grpc-status", answer: reply(grpcOK, grpcFrame(ok), nil),
			want: codes.Internal, text: "no grpc-status", violation: true},
		{name: "malformed grpc-status", answer: reply(grpcOK, nil, []string{"grpc-status", "two"}),
			want: codes.Unknown, text: "two", violation: true},
		{name: "malformed grpc-message", answer: reply(grpcOK, nil, []string{"grpc-status", "13", "grpc-message", "%zz"}),
			want: codes.Internal, text: "invalid error message", violation: true},
		{name: "malformed grpc-status-details-bin", answer: reply(grpcOK, nil, []string{"grpc-status", "13", "grpc-status-details-bin", "!!"}),
			want: codes.Internal, text: "details", violation: true},
		{name: "details disagree with grpc-status", answer: reply(grpcOK, nil, []string{"grpc-status", "5", "grpc-status-details-bin", details(codes.Aborted)}),
			want: codes.Internal, text: "disagrees", violation: true},
		{name: "truncated message", answer: reply(grpcOK, truncated, []string{"grpc-status", "0"}),
			want: codes.Internal, text: "malformed gRPC answer", violation: true},
		{name: "two messages", answer: reply(grpcOK, twoMessages, []string{"grpc-status", "0"}),
			want: codes.Unimplemented, text: "malformed gRPC answer", violation: true},
		{name: "no message", answer: reply(grpcOK, nil, []string{"grpc-status", "0"}),
			want: codes.Unimplemented, text: "malformed gRPC answer", violation: true},
		{name: "not the reply message", answer: reply(grpcOK, grpcFrame([]byte{0xff, 0xff, 0xff}), []string{"grpc-status", "0"}),
			want: codes.Internal, text: "not a valid", violation: true},
		{name: "malformed :status", answer: reply([]string{":status", "2xx", "content-type", "application/grpc"}, nil, nil),
			want: codes.Internal, text: "broke HTTP/2", violation: true},
		{name: "headers over the limit", answer: reply(append(grpcOK, "x-huge", strings.Repeat("h", 2*maxHeaderListSize)), nil, nil),
			want: codes.Internal, text: "broke HTTP/2", violation: true},
		{name: "DATA before HEADERS", answer: func(p *peerConn, id uint32) error { return p.writeData(id, true, grpcFrame(ok), 0) },
			want: codes.Internal, text: "broke HTTP/2", violation: true},
		{name: "trailers without END_STREAM", answer: func(p *peerConn, id uint32) error {
			if err := p.writeHeaders(id, false, grpcOK...); err != nil {
				return err
			}
			return p.writeHeaders(id, false, "grpc-status", "0")
		}, want: codes.Internal, text: "connection error PROTOCOL_ERROR", violation: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(testutil.TempDir(t), "csi.sock")
			startRawPlugin(t, sock, func(i int, p *peerConn) {
				if p.handshake() != nil {
					return
				}
				if i == 0 {
					r, err := p.readRequest()
					if err != nil || tc.answer(p, r.id) != nil {
						return
					}
				}
				p.serveUntilClosed(pluginInfo(t, "healthy"))
			})
			c := newClient(t, Config{Socket: sock})
			_, _, err := infoCall(c, 5*time.Second)
			t.Logf("answer: %v", err)
			if status.Code(err) != tc.want || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("answer: %v, want %s containing %q", err, tc.want, tc.text)
			}
			if got := IsProtocolViolation(err); got != tc.violation {
				t.Errorf("IsProtocolViolation(%v) = %v, want %v", err, got, tc.violation)
			}
			if tc.violation && !strings.Contains(err.Error(), "protocol violation") {
				t.Errorf("a violation's message should say so: %v", err)
			}
			// status.FromError sees the same status as status.Code.
			if st, ok := status.FromError(err); !ok || st.Code() != tc.want {
				t.Errorf("status.FromError(%v) = %v, %v", err, st, ok)
			}
			// Whatever the answer did to the connection, the plugin is
			// reachable again at the next call.
			if name, _, err := infoCall(c, 5*time.Second); err != nil || name != "healthy" {
				t.Fatalf("next call: %q, %v", name, err)
			}
		})
	}
}

func TestIsProtocolViolationOfOtherErrors(t *testing.T) {
	for _, err := range []error{
		nil,
		status.Error(codes.Internal, "plain status"),
		violationf(codes.Internal, "x"), // the control: true
	} {
		want := err != nil && strings.Contains(err.Error(), "protocol violation")
		if got := IsProtocolViolation(err); got != want {
			t.Errorf("IsProtocolViolation(%v) = %v, want %v", err, got, want)
		}
	}
}
