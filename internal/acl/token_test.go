package acl

import (
	"context"
	"net"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestNewIDsFormatAndUniqueness(t *testing.T) {
	for name, gen := range map[string]func() (string, error){"secret": NewSecretID, "accessor": NewAccessorID} {
		t.Run(name, func(t *testing.T) {
			seen := map[string]bool{}
			for range 2000 {
				id, err := gen()
				if err != nil {
					t.Fatal(err)
				}
				if !uuidV4.MatchString(id) {
					t.Fatalf("%q is not a version 4 UUID", id)
				}
				if seen[id] {
					t.Fatalf("%q generated twice", id)
				}
				seen[id] = true
			}
		})
	}
}

func TestSecretMatches(t *testing.T) {
	secret, err := NewSecretID()
	if err != nil {
		t.Fatal(err)
	}
	hash := HashSecret(secret)
	if len(hash) != 32 {
		t.Fatalf("hash is %d bytes, want 32 (SHA-256)", len(hash))
	}
	// The SHA-256 of "abc", from FIPS 180-2.
	if got := string(HashSecret("abc")); got != "\xba\x78\x16\xbf\x8f\x01\xcf\xea\x41\x41\x40\xde\x5d\xae\x22\x23\xb0\x03\x61\xa3\x96\x17\x7a\x9c\xb4\x10\xff\x61\xf2\x00\x15\xad" {
		t.Fatalf("HashSecret(abc) = %x", got)
	}
	other, _ := NewSecretID()
	tests := []struct {
		name   string
		hash   []byte
		secret string
		want   bool
	}{
		{"same secret", hash, secret, true},
		{"other secret", hash, other, false},
		{"truncated hash", hash[:31], secret, false},
		{"no hash", nil, secret, false},
		{"secret as the hash", []byte(secret), secret, false},
		{"empty secret never matches", HashSecret(""), "", false},
		{"one character off", hash, secret[:35] + "x", false},
	}
	for _, tt := range tests {
		if got := SecretMatches(tt.hash, tt.secret); got != tt.want {
			t.Errorf("%s: SecretMatches = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestTokenFromContextWithoutMetadata(t *testing.T) {
	if got := TokenFromContext(context.Background()); got != "" {
		t.Fatalf("token %q from a context without metadata", got)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("other", "x"))
	if got := TokenFromContext(ctx); got != "" {
		t.Fatalf("token %q from metadata without the key", got)
	}
	if ctx := WithToken(context.Background(), ""); ctx != context.Background() {
		t.Fatal("WithToken with an empty secret changed the context")
	}
}

// TestTokenTravelsOverGRPC sends a token with WithToken over a real gRPC
// connection and reads it on the server with TokenFromContext.
func TestTokenTravelsOverGRPC(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 4)
	g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen <- TokenFromContext(ctx)
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(g, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Serve(ln)
	}()
	defer func() {
		g.Stop()
		<-done
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	secret, _ := NewSecretID()
	for _, tc := range []struct{ send, want string }{{secret, secret}, {"", ""}} {
		if _, err := cl.Check(WithToken(ctx, tc.send), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-seen:
			if got != tc.want {
				t.Fatalf("server saw token %q, want %q", got, tc.want)
			}
		case <-ctx.Done():
			t.Fatal("the server never saw the call")
		}
	}
}
