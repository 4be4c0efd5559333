package rpc

import (
	"net"
	"testing"
)

// TestTagConns checks that every accepted connection reads as its peer's
// address and carries an id of its own.
func TestTagConns(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := TagConns(inner)
	defer ln.Close()
	if ln.Addr().String() != inner.Addr().String() {
		t.Fatalf("listener address %s, want %s", ln.Addr(), inner.Addr())
	}
	seen := map[uint64]bool{}
	for range 3 {
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		conn, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		addr, ok := conn.RemoteAddr().(taggedAddr)
		if !ok {
			t.Fatalf("remote address %T, want a taggedAddr", conn.RemoteAddr())
		}
		if addr.String() != client.LocalAddr().String() || addr.Network() != "tcp" {
			t.Errorf("remote address reads %s %s, want tcp %s", addr.Network(), addr, client.LocalAddr())
		}
		if seen[addr.id] {
			t.Errorf("id %d given twice", addr.id)
		}
		seen[addr.id] = true
	}
	if (taggedAddr{}).String() != "unknown" || (taggedAddr{}).Network() != "unknown" {
		t.Errorf("an address-less connection reads %q %q, want unknown", taggedAddr{}.Network(), taggedAddr{})
	}
}
