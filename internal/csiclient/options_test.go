package csiclient

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Metadata flows both ways as through grpc-go: outgoing metadata (text,
// binary, repeated) reaches the plugin, and grpc.Header and grpc.Trailer
// show what grpc-go shows, for replies, errors and trailers-only errors.
func TestMetadataMatchesGRPC(t *testing.T) {
	type answer struct {
		setHeader, setTrailer, fail bool
	}
	cases := []struct {
		name string
		answer
	}{
		{"reply with header and trailer", answer{setHeader: true, setTrailer: true}},
		{"plain reply", answer{}},
		{"error with header and trailer", answer{setHeader: true, setTrailer: true, fail: true}},
		{"error, trailers only", answer{setTrailer: true, fail: true}},
	}
	var (
		mu      sync.Mutex
		current answer
		seen    metadata.MD
		timeout time.Duration
	)
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	serveIdentity(t, sock, &faultyIdentity{probe: func(ctx context.Context) (*csi.ProbeResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		seen, _ = metadata.FromIncomingContext(ctx)
		if d, ok := ctx.Deadline(); ok {
			timeout = time.Until(d)
		} else {
			timeout = -1
		}
		if current.setHeader {
			_ = grpc.SetHeader(ctx, metadata.Pairs("h-text", "v1", "h-bin", "\x00\x01\xff"))
		}
		if current.setTrailer {
			_ = grpc.SetTrailer(ctx, metadata.Pairs("t-text", "v2", "t-bin", "\xfe", "t-text", "v3"))
		}
		if current.fail {
			return nil, status.Error(codes.NotFound, "no such volume")
		}
		return &csi.ProbeResponse{}, nil
	}})
	c := newClient(t, Config{Socket: sock})
	clients := map[string]csi.IdentityClient{"grpc-go": c.Identity, "supervision": csi.NewIdentityClient(c.Supervision())}

	type view struct {
		code            codes.Code
		header, trailer metadata.MD
		sent            metadata.MD // the x- keys the plugin received
		userAgent       string
		timeout         time.Duration
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			current = tc.answer
			mu.Unlock()
			views := map[string]view{}
			for name, client := range clients {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				ctx = metadata.AppendToOutgoingContext(ctx, "x-text", "hello", "x-bin", "\x00\xffbin", "x-multi", "a", "x-multi", "b")
				var header, trailer metadata.MD
				_, err := client.Probe(ctx, &csi.ProbeRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
				cancel()
				mu.Lock()
				v := view{code: status.Code(err), header: normalise(header), trailer: normalise(trailer), sent: metadata.MD{}, timeout: timeout}
				for k, vs := range seen {
					if strings.HasPrefix(k, "x-") {
						v.sent[k] = vs
					}
				}
				if ua := seen.Get("user-agent"); len(ua) > 0 {
					v.userAgent = ua[0]
				}
				mu.Unlock()
				views[name] = v
			}
			want, got := views["grpc-go"], views["supervision"]
			t.Logf("grpc-go %+v\nsupervision %+v", want, got)
			if got.code != want.code {
				t.Errorf("code: supervision %s, grpc-go %s", got.code, want.code)
			}
			if !reflect.DeepEqual(got.header, want.header) {
				t.Errorf("header metadata: supervision %v, grpc-go %v", got.header, want.header)
			}
			if !reflect.DeepEqual(got.trailer, want.trailer) {
				t.Errorf("trailer metadata: supervision %v, grpc-go %v", got.trailer, want.trailer)
			}
			if !reflect.DeepEqual(got.sent, want.sent) || len(got.sent) != 3 {
				t.Errorf("metadata the plugin received: supervision %v, grpc-go %v", got.sent, want.sent)
			}
			if !strings.HasPrefix(got.userAgent, userAgent) {
				t.Errorf("user-agent %q, want it to start with %q", got.userAgent, userAgent)
			}
			if got.timeout <= 0 || got.timeout > 5*time.Second {
				t.Errorf("the plugin's deadline was %s away, want within (0, 5s]", got.timeout)
			}
		})
	}
}

// normalise makes empty metadata compare equal to nil.
func normalise(md metadata.MD) metadata.MD {
	if len(md) == 0 {
		return nil
	}
	return md
}

// tagOption is the kind of option interceptors use: an EmptyCallOption
// carrying data. There are no interceptors here to read it.
type tagOption struct {
	grpc.EmptyCallOption
	tag string
}

// Size options bound a call's messages; options the connection cannot
// honour are refused by name rather than dropped, and such a call never
// reaches the plugin.
func TestCallOptions(t *testing.T) {
	var calls atomic.Int32
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	serveIdentity(t, sock, &faultyIdentity{probe: func(context.Context) (*csi.ProbeResponse, error) {
		calls.Add(1)
		return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
	}})
	// The Probe reply (Ready: true) is 4 bytes.
	cases := []struct {
		name       string
		maxMessage int // Config.MaxMessageSize
		request    []byte
		opts       []grpc.CallOption
		want       codes.Code
		text       string
		violation  bool
		reached    bool // the call reached the plugin
	}{
		{name: "no options", reached: true},
		{name: "no-op options", opts: []grpc.CallOption{grpc.StaticMethod(), grpc.EmptyCallOption{}, grpc.WaitForReady(false)}, reached: true},
		{name: "reply within MaxCallRecvMsgSize", opts: []grpc.CallOption{grpc.MaxCallRecvMsgSize(4)}, reached: true},
		{name: "reply over MaxCallRecvMsgSize", opts: []grpc.CallOption{grpc.MaxCallRecvMsgSize(3)},
			want: codes.ResourceExhausted, text: "3-byte message cap", violation: true, reached: true},
		{name: "MaxCallRecvMsgSize cannot raise the cap", maxMessage: 3, opts: []grpc.CallOption{grpc.MaxCallRecvMsgSize(1 << 20)},
			want: codes.ResourceExhausted, text: "3-byte message cap", violation: true, reached: true},
		{name: "request within MaxCallSendMsgSize", request: []byte("abc"), opts: []grpc.CallOption{grpc.MaxCallSendMsgSize(5)}, reached: true},
		{name: "request over MaxCallSendMsgSize", request: []byte("abcd"), opts: []grpc.CallOption{grpc.MaxCallSendMsgSize(5)},
			want: codes.ResourceExhausted, text: "larger than max (6 vs. 5)"},
		{name: "request over MaxMessageSize", maxMessage: 5, request: []byte("abcd"),
			want: codes.ResourceExhausted, text: "larger than max (6 vs. 5)"},
		{name: "content subtype", opts: []grpc.CallOption{grpc.CallContentSubtype("json")},
			want: codes.InvalidArgument, text: "grpc.ContentSubtypeCallOption"},
		{name: "compressor", opts: []grpc.CallOption{grpc.UseCompressor("gzip")},
			want: codes.InvalidArgument, text: "grpc.CompressorCallOption"},
		{name: "peer", opts: []grpc.CallOption{grpc.Peer(&peer.Peer{})},
			want: codes.InvalidArgument, text: "grpc.PeerCallOption"},
		{name: "authority", opts: []grpc.CallOption{grpc.CallAuthority("elsewhere")},
			want: codes.InvalidArgument, text: "grpc.AuthorityOverrideCallOption"},
		{name: "on finish", opts: []grpc.CallOption{grpc.OnFinish(func(error) {})},
			want: codes.InvalidArgument, text: "grpc.OnFinishCallOption"},
		{name: "interceptor data", opts: []grpc.CallOption{tagOption{tag: "x"}},
			want: codes.InvalidArgument, text: "csiclient.tagOption"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, Config{Socket: sock, MaxMessageSize: tc.maxMessage})
			before := calls.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// A BytesValue reads as an empty ProbeRequest with an unknown
			// field: a request whose size the test controls.
			var reply csi.ProbeResponse
			err := c.Supervision().Invoke(ctx, "/csi.v1.Identity/Probe", &wrapperspb.BytesValue{Value: tc.request}, &reply, tc.opts...)
			if status.Code(err) != tc.want || err != nil && !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("call: %v, want %s containing %q", err, tc.want, tc.text)
			}
			if err == nil && !reply.GetReady().GetValue() {
				t.Errorf("reply %v, want ready", &reply)
			}
			if IsProtocolViolation(err) != tc.violation {
				t.Errorf("IsProtocolViolation(%v) = %v, want %v", err, !tc.violation, tc.violation)
			}
			if reached := calls.Load() != before; reached != tc.reached {
				t.Errorf("the call reached the plugin: %v, want %v", reached, tc.reached)
			}
		})
	}
}

// Outgoing metadata that grpc-go refuses is refused, before anything is
// sent; so is more than the plugin may be asked to accept.
func TestOutgoingMetadataRefused(t *testing.T) {
	cases := []struct {
		name string
		md   metadata.MD
		want codes.Code
		text string
	}{
		{"key with illegal characters", metadata.MD{"bad key": {"v"}}, codes.Internal, "illegal characters"},
		{"value not printable", metadata.Pairs("x-text", "line\nbreak"), codes.Internal, "non-printable"},
		{"too large", metadata.Pairs("x-big", strings.Repeat("v", maxHeaderListSize)), codes.ResourceExhausted, "exceeds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(testutil.TempDir(t), "csi.sock")
			c := newClient(t, Config{Socket: sock}) // nothing listens: nothing may be dialled either
			ctx := metadata.NewOutgoingContext(context.Background(), tc.md)
			_, err := csi.NewIdentityClient(c.Supervision()).Probe(ctx, &csi.ProbeRequest{})
			if status.Code(err) != tc.want || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("call: %v, want %s containing %q", err, tc.want, tc.text)
			}
		})
	}
}

func TestCheckSocketPath(t *testing.T) {
	for _, tc := range []struct {
		n       int
		wantErr bool
	}{{1, false}, {107, false}, {108, true}, {300, true}} {
		path := "/" + strings.Repeat("s", tc.n-1)
		err := CheckSocketPath(path)
		if (err != nil) != tc.wantErr {
			t.Errorf("CheckSocketPath(%d bytes) = %v, want error %v", tc.n, err, tc.wantErr)
		}
		if tc.wantErr && !strings.Contains(err.Error(), "is "+strconv.Itoa(tc.n)+" bytes; a unix socket path may have at most 107") {
			t.Errorf("CheckSocketPath(%d bytes) = %q, want the length and the limit", tc.n, err)
		}
	}
}

// The limit is the kernel's: a 107-byte path works end to end, a 108-byte
// one cannot even be listened on, and New refuses it (with its length)
// instead of letting every call time out.
func TestSocketPathLimit(t *testing.T) {
	dir := testutil.TempDir(t)
	pathOf := func(n int) string {
		p := filepath.Join(dir, strings.Repeat("d", n-len(dir)-1-len(".sock"))+".sock")
		if len(p) != n {
			t.Fatalf("built a %d-byte path, want %d", len(p), n)
		}
		return p
	}

	longest := pathOf(107)
	serve(t, longest, "longest.example.com")
	c := newClient(t, Config{Socket: longest})
	if name, err := supervisedName(c); err != nil || name != "longest.example.com" {
		t.Fatalf("call on a 107-byte socket path: %q, %v", name, err)
	}

	tooLong := pathOf(108)
	if l, err := net.Listen("unix", tooLong); err == nil {
		l.Close()
		t.Fatalf("listening on a 108-byte socket path worked; the limit is wrong")
	}
	if _, err := New(Config{Socket: tooLong}); err == nil || !strings.Contains(err.Error(), "is 108 bytes") {
		t.Fatalf("New with a 108-byte socket path: %v, want an error giving its length", err)
	}

	// A relative path counts as the absolute path it is dialled as.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel := strings.Repeat("r", 108-len(wd)-1)
	if len(rel) > 0 {
		if _, err := New(Config{Socket: rel}); err == nil || !strings.Contains(err.Error(), "is 108 bytes") {
			t.Errorf("New with a relative path of %d bytes (108 absolute): %v, want the length error", len(rel), err)
		}
	}
}

func TestNewRefusesAnInvalidRedialPolicy(t *testing.T) {
	socket := filepath.Join(testutil.TempDir(t), "csi.sock")
	tests := []struct {
		name   string
		redial retry.Policy
		want   string
	}{
		{"none: there is no default of its own", retry.Policy{}, "Config.Redial: retry: Base must be positive"},
		{"cap below base", retry.Policy{Base: time.Second, Cap: time.Millisecond, Multiplier: 2}, "Config.Redial: retry: Cap"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(Config{Socket: socket, Redial: tt.redial})
			if err == nil {
				c.Close()
				t.Fatalf("New with Redial %v succeeded, want an error", tt.redial)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}
