package csiclient

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fuzzReply is how the scripted plugin answers the fuzzed call.
type fuzzReply struct {
	body                             []byte // the DATA of the answer, as is
	grpcStatus, grpcMessage, details string // trailer values; empty ones are left out
	trailersOnly                     bool   // everything in one HEADERS frame
}

// answerFuzz sends rep as the answer on stream id.
func (p *peerConn) answerFuzz(id uint32, rep *fuzzReply) error {
	status := []string{}
	for _, f := range [][2]string{{"grpc-status", rep.grpcStatus}, {"grpc-message", rep.grpcMessage}, {"grpc-status-details-bin", rep.details}} {
		if f[1] != "" {
			status = append(status, f[0], f[1])
		}
	}
	headers := []string{":status", "200", "content-type", "application/grpc"}
	if rep.trailersOnly {
		return p.writeHeaders(id, true, append(headers, status...)...)
	}
	if err := p.writeHeaders(id, false, headers...); err != nil {
		return err
	}
	for body := rep.body; len(body) > 0; {
		n := min(len(body), 16<<10)
		if err := p.writeData(id, false, body[:n], 0); err != nil {
			return err
		}
		body = body[n:]
	}
	return p.writeHeaders(id, true, status...)
}

// FuzzSupervisionReply answers one GetPluginInfo call with fuzzed bytes:
// the reply body, grpc-status, grpc-message and grpc-status-details-bin,
// in trailers or a trailers-only answer. Whatever the plugin sends, the
// call returns within its deadline without panicking, and an error is
// never a status with code OK.
func FuzzSupervisionReply(f *testing.F) {
	info := grpcFrame(pluginInfo(f, "fuzz.example.com"))
	var huge [5]byte
	binary.BigEndian.PutUint32(huge[1:], 100<<20)
	compressed := append([]byte(nil), info...)
	compressed[0] = 1
	for _, seed := range []fuzzReply{
		{body: info, grpcStatus: "0"},
		{grpcStatus: "5", grpcMessage: "not%20found", trailersOnly: true},
		{body: huge[:], grpcStatus: "0"},
		{body: compressed, grpcStatus: "0"},
		{body: info, grpcStatus: "-1"},
		{body: info, grpcStatus: "13", details: "AAAA"},
		{body: append(info, 0, 0), grpcStatus: "0"},
		{body: info},
	} {
		f.Add(seed.body, seed.grpcStatus, seed.grpcMessage, seed.details, seed.trailersOnly)
	}

	var current atomic.Pointer[fuzzReply]
	sock := filepath.Join(testutil.TempDir(f), "csi.sock")
	startRawPlugin(f, sock, func(_ int, p *peerConn) {
		if p.handshake() != nil {
			return
		}
		for {
			r, err := p.readRequest()
			if err != nil || p.answerFuzz(r.id, current.Load()) != nil {
				return // a broken answer may have broken the connection
			}
		}
	})
	c := newClient(f, Config{Socket: sock, WriteTimeout: time.Second})

	f.Fuzz(func(t *testing.T, body []byte, grpcStatus, grpcMessage, details string, trailersOnly bool) {
		current.Store(&fuzzReply{body: body, grpcStatus: grpcStatus, grpcMessage: grpcMessage, details: details, trailersOnly: trailersOnly})
		const deadline = 2 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		resp, err := csi.NewIdentityClient(c.Supervision()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		if took := time.Since(start); took > deadline+time.Second {
			t.Fatalf("the call took %s with a %s deadline", took, deadline)
		}
		switch {
		case err != nil && status.Code(err) == codes.OK:
			t.Fatalf("error %v has code OK", err)
		case err == nil && resp == nil:
			t.Fatal("no error and no reply")
		case IsProtocolViolation(err) && err.Error() == "":
			t.Fatal("a protocol violation without a message")
		}
	})
}
