package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// serve runs the command in-process until the test ends and returns the
// socket of plugin i.
func serve(t *testing.T, kind string, count int) func(i int) string {
	t.Helper()
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr testutil.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--dir", dir, "--kind", kind, "--count", fmt.Sprint(count)}, &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("exit status %d, want %d; stderr: %s", code, exitOK, stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Errorf("csi-hostile did not stop within 10s of cancel")
			return
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "*", "csi.sock")); len(left) != 0 {
			t.Errorf("sockets left behind: %v", left)
		}
	})
	want := fmt.Sprintf("csi-hostile: serving %d\n", count)
	testutil.WaitFor(t, 10*time.Second, "the ready line", func() bool {
		select {
		case code := <-done:
			t.Fatalf("csi-hostile exited with %d: %s", code, stderr.String())
		default:
		}
		return stdout.String() == want
	})
	return func(i int) string { return filepath.Join(dir, fmt.Sprintf("h-%s-%04d", kind, i), "csi.sock") }
}

func grpcConn(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rawClient is an HTTP/2 client scripted frame by frame.
type rawClient struct {
	nc  net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

// dialRaw connects, sends the preface and empty SETTINGS: a 16 KiB maximum
// frame size and a 64 KiB window, HTTP/2's defaults.
func dialRaw(t *testing.T, socket string) *rawClient {
	t.Helper()
	nc, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{nc: nc}
	c.fr = http2.NewFramer(nc, bufio.NewReader(nc))
	c.fr.SetMaxReadFrameSize(maxFrameLen) // to see what a strict client would refuse
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hb)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	// Every read in these tests is bounded.
	if err := nc.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	return c
}

// call sends a unary request with an empty message on stream id.
func (c *rawClient) call(t *testing.T, id uint32, path string) {
	t.Helper()
	c.hb.Reset()
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path}, {Name: ":authority", Value: "localhost"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		if err := c.enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteData(id, true, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
}

// next returns the next frame that is not SETTINGS, PING or WINDOW_UPDATE.
func (c *rawClient) next(t *testing.T) http2.Frame {
	t.Helper()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("read frame: %v", err)
		}
		switch f.(type) {
		case *http2.SettingsFrame, *http2.PingFrame, *http2.WindowUpdateFrame:
			continue
		}
		return f
	}
}

// The padded kind answers every supervision call correctly through a
// correct client, for far more calls than one 64 KiB window holds: it
// counts padding against flow control and waits for the credit.
func TestPaddedAnswersCorrectly(t *testing.T) {
	socket := serve(t, kindPadded, 2)
	conn := grpcConn(t, socket(1))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := csi.NewIdentityClient(conn)
	info, err := id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "h-padded-0001.hostile" {
		t.Fatalf("GetPluginInfo = %v, %v; want name h-padded-0001.hostile", info, err)
	}
	if _, err := id.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{}); err != nil {
		t.Fatalf("GetPluginCapabilities: %v", err)
	}
	node, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || node.GetNodeId() == "" {
		t.Fatalf("NodeGetInfo = %v, %v; want a node id", node, err)
	}
	// 7 one-byte frames of 257 window bytes each per probe: 100 probes
	// use 180 KiB of window, nearly three initial windows.
	for i := range 100 {
		resp, err := id.Probe(ctx, &csi.ProbeRequest{})
		if err != nil || !resp.GetReady().GetValue() {
			t.Fatalf("probe %d = %v, %v; want ready", i, resp, err)
		}
	}
	_, err = csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v"})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("CreateVolume: %v, want Unimplemented", err)
	}
}

// Every DATA frame of the padded kind carries one byte and 255 of padding.
func TestPaddedFrames(t *testing.T) {
	socket := serve(t, kindPadded, 1)
	c := dialRaw(t, socket(0))
	c.call(t, 1, "/csi.v1.Identity/Probe")
	var data []byte
	for {
		switch f := c.next(t).(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				if grpcStatus(f) != "0" {
					t.Fatalf("trailers %v, want grpc-status 0", f.Fields)
				}
				// 0, length 2, then field 1 (ready) holding BoolValue{true}.
				if want := []byte{0, 0, 0, 0, 4, 0x0a, 2, 8, 1}; !bytes.Equal(data, want) {
					t.Fatalf("message bytes % x, want % x", data, want)
				}
				return
			}
		case *http2.DataFrame:
			if f.Length != 1+1+padLen || len(f.Data()) != 1 {
				t.Fatalf("DATA frame of length %d with %d data bytes, want %d and 1", f.Length, len(f.Data()), 1+1+padLen)
			}
			data = append(data, f.Data()...)
		default:
			t.Fatalf("unexpected frame %v", f)
		}
	}
}

// grpcStatus is the grpc-status field of a HEADERS frame, or "".
func grpcStatus(f *http2.MetaHeadersFrame) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == "grpc-status" {
			return hf.Value
		}
	}
	return ""
}

// The maxframes kind sends 16 MiB - 1 byte DATA frames, one after another,
// to a client that allows 16 KiB frames and a 64 KiB window.
func TestMaxFrames(t *testing.T) {
	socket := serve(t, kindMaxFrames, 1)
	c := dialRaw(t, socket(0))
	c.call(t, 1, "/csi.v1.Identity/Probe")
	if _, ok := c.next(t).(*http2.MetaHeadersFrame); !ok {
		t.Fatal("first frame is not the answer's HEADERS")
	}
	for i := range 2 {
		f, ok := c.next(t).(*http2.DataFrame)
		if !ok || f.Length != maxFrameLen || f.StreamID != 1 {
			t.Fatalf("frame %d: %v, want DATA of %d bytes on stream 1", i, f, maxFrameLen)
		}
	}
	// A grpc-go client refuses the frame and fails the call; the server
	// goes on until the client has gone.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := csi.NewIdentityClient(grpcConn(t, socket(0))).Probe(ctx, &csi.ProbeRequest{})
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Probe: %v, want a failure before the deadline", err)
	}
}

// The huge kind's reply is a valid gRPC message of 100 MiB: grpc-go
// refuses it at its default 4 MiB limit and accepts it above.
func TestHuge(t *testing.T) {
	socket := serve(t, kindHuge, 1)
	conn := grpcConn(t, socket(0))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := csi.NewIdentityClient(conn)
	_, err := id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), fmt.Sprint(hugeMessage)) {
		t.Fatalf("GetPluginInfo at the default limit: %v, want ResourceExhausted naming %d bytes", err, hugeMessage)
	}
	if _, err := id.Probe(ctx, &csi.ProbeRequest{}, grpc.MaxCallRecvMsgSize(hugeMessage+1)); err != nil {
		t.Fatalf("Probe with a 100 MiB limit: %v", err)
	}
}

// The goaway kind answers a call with GOAWAY naming a last stream below
// it, then closes; codes alternate between connections.
func TestGoAway(t *testing.T) {
	socket := serve(t, kindGoAway, 1)
	codesSeen := map[http2.ErrCode]bool{}
	for range 2 {
		c := dialRaw(t, socket(0))
		c.call(t, 1, "/csi.v1.Identity/Probe")
		f, ok := c.next(t).(*http2.GoAwayFrame)
		if !ok || f.LastStreamID != 0 {
			t.Fatalf("answer %v, want GOAWAY with last stream 0", f)
		}
		codesSeen[f.ErrCode] = true
		if err := c.nc.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.fr.ReadFrame(); !errors.Is(err, io.EOF) {
			t.Fatalf("after GOAWAY: %v, want the connection closed", err)
		}
	}
	if !codesSeen[http2.ErrCodeNo] || !codesSeen[http2.ErrCodeEnhanceYourCalm] {
		t.Fatalf("GOAWAY codes %v, want NO_ERROR and ENHANCE_YOUR_CALM", codesSeen)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := csi.NewIdentityClient(grpcConn(t, socket(0))).Probe(ctx, &csi.ProbeRequest{})
	if err == nil {
		t.Fatal("Probe succeeded, want a failure")
	}
}

// The stall kind never answers and never reads: a client's writes block
// once the socket buffers are full.
func TestStall(t *testing.T) {
	socket := serve(t, kindStall, 1)
	c := dialRaw(t, socket(0))
	c.call(t, 1, "/csi.v1.Identity/Probe")
	if err := c.nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var ne net.Error
	if _, err := c.nc.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read: %v, want a timeout (nothing sent)", err)
	}
	// The kernel buffers a few hundred KiB of a unix stream; 64 MiB
	// cannot fit.
	chunk := make([]byte, 64<<10)
	for written := 0; ; written += len(chunk) {
		if written > 64<<20 {
			t.Fatalf("wrote %d bytes without blocking", written)
		}
		if err := c.nc.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.nc.Write(chunk); err != nil {
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("write: %v, want a timeout", err)
			}
			t.Logf("writes blocked after %d KiB", written>>10)
			return
		}
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--dir", "d"},
		{"--dir", "d", "--kind", "rude"},
		{"--dir", "d", "--kind", "stall", "--count", "0"},
		{"--kind", "stall"},
		{"--dir", "d", "--kind", "stall", "extra"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != exitUsage {
			t.Errorf("run %q: exit %d, want %d", args, code, exitUsage)
		}
		if stderr.Len() == 0 {
			t.Errorf("run %q: nothing on stderr", args)
		}
	}
}

func TestListenError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	// DIR is a regular file: the plugin directories cannot be created.
	if code := run(context.Background(), []string{"--dir", file, "--kind", "stall"}, &stdout, &stderr); code != exitError {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitError, stderr.String())
	}
}
