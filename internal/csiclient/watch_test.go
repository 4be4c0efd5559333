package csiclient

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// frames encodes HTTP/2 frames as a server would send them.
func frames(t *testing.T, write func(fr *http2.Framer) error) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := write(http2.NewFramer(&buf, nil)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestFrameHeadersSeeGoAway(t *testing.T) {
	settings := frames(t, func(fr *http2.Framer) error {
		return fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14})
	})
	// A DATA frame whose payload holds the bytes of a GOAWAY header: the
	// follower must skip payloads, not match bytes.
	fakeGoAway := frames(t, func(fr *http2.Framer) error { return fr.WriteGoAway(0, http2.ErrCodeNo, nil) })
	data := frames(t, func(fr *http2.Framer) error { return fr.WriteData(1, false, fakeGoAway) })
	ping := frames(t, func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{1, 2, 3}) })
	goAway := frames(t, func(fr *http2.Framer) error { return fr.WriteGoAway(1<<31-1, http2.ErrCodeNo, []byte("bye")) })

	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	cases := []struct {
		name   string
		stream []byte
		want   bool
	}{
		{"settings, data, ping", cat(settings, data, ping), false},
		{"goaway after other frames", cat(settings, data, ping, goAway), true},
		{"goaway alone", goAway, true},
	}
	for _, tc := range cases {
		// Every split of the stream into reads gives the same answer.
		for _, chunk := range []int{1, 2, 5, 9, 10, 64, len(tc.stream)} {
			var f frameHeaders
			got := false
			for p := tc.stream; len(p) > 0; {
				n := min(chunk, len(p))
				got = f.sawGoAway(p[:n]) || got
				p = p[n:]
			}
			if got != tc.want {
				t.Errorf("%s in reads of %d bytes: saw GOAWAY %v, want %v", tc.name, chunk, got, tc.want)
			}
		}
	}
}

// A plugin that stops gracefully sends GOAWAY; the client reports it at
// once, and the next call closes the old connection so the plugin's
// GracefulStop can finish.
func TestGracefulStopOfPlugin(t *testing.T) {
	sock := filepath.Join(socketDir(t), "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &identityServer{name: "graceful"})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	disconnects := make(chan struct{}, 5)
	c := newClient(t, Config{Socket: sock, OnDisconnect: func() { disconnects <- struct{}{} }})
	if _, err := supervisedName(c); err != nil {
		t.Fatal(err)
	}

	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-disconnects:
	case <-time.After(10 * time.Second):
		t.Fatal("no OnDisconnect after the plugin began a graceful stop")
	}
	// A draining server may still answer (it accepts streams until its
	// second GOAWAY), or the call finds it gone; either way it returns.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = csi.NewIdentityClient(c.Supervision()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if code := status.Code(err); code != codes.OK && code != codes.Unavailable {
		t.Errorf("call to a stopping plugin: %v, want an answer or Unavailable", err)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin's GracefulStop did not finish after the client let go")
	}
	// When the call above still found the plugin answering, the
	// connection's end must be reported too, or a death after a GOAWAY
	// would go unnoticed. (When it did not, the client closed the
	// connection itself and knows.)
	if err == nil {
		select {
		case <-disconnects:
		case <-time.After(10 * time.Second):
			t.Fatal("no OnDisconnect when the stopped plugin's connection closed")
		}
	}
}
