package raftnode

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestClosingLayerClosesItsConnections closes a layer holding one
// accepted and one dialled connection: the peers of both read EOF, and a
// dial after Close fails, so a stopped server leaves no connection open.
func TestClosingLayerClosesItsConnections(t *testing.T) {
	inner, err := newTCPLayer("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inner.advertise = inner.Listener.Addr()
	l := newClosingLayer(inner)

	// A peer that accepts the layer's outgoing connection.
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	out, err := l.Dial(raft.ServerAddress(peer.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	outPeer, err := peer.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer outPeer.Close()

	// A peer that connects to the layer.
	inPeer, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer inPeer.Close()
	in, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"accepted": inPeer, "dialled": outPeer} {
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("peer of the %s connection read %v after Close, want EOF", name, err)
		}
	}
	if c, err := l.Dial(raft.ServerAddress(peer.Addr().String()), time.Second); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("dial after Close: %v, %v; want net.ErrClosed", c, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) != 0 {
		t.Fatalf("%d connections still tracked after Close", len(l.conns))
	}
}
