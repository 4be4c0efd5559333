// Package netlab builds a small lab network of test hosts in Linux network
// namespaces and cuts the links between them on demand. It is for tests
// only: fault tests start the project's servers and agents as real
// processes on the lab's hosts and partition them from each other.
//
// # Topology
//
// A lab has one namespace per host and one router namespace. Each host is
// connected to the router by a veth pair of its own, on a /30 of its own;
// the router forwards between them. The network is routed, not bridged, so
// every packet from one host to another crosses the router's FORWARD chain,
// where plain iptables rules drop it (no br_netfilter needed). Loopback is
// up in every namespace.
//
//	host a (eth0 198.18.1.2/30) ── h1 198.18.1.1 ┐
//	host b (eth0 198.18.2.2/30) ── h2 198.18.2.1 ├ router (forwarding on)
//	host c (eth0 198.18.3.2/30) ── h3 198.18.3.1 ┘
//
// # Addresses
//
// The k-th host of Config.Hosts (from 1) has 198.18.k.2/30 and the router
// 198.18.k.1/30 on its link; each host's default route points at the
// router. The addresses come from 198.18.0.0/15, the block RFC 2544 sets
// aside for benchmarking network devices (IANA special-purpose registry,
// RFC 6890): it is not routed on the internet and is not one of the
// private ranges (10/8, 172.16/12, 192.168/16) that real networks, VPNs
// and container bridges use, so a lab address is never one a real
// network on the machine uses, and a lab address in a log is recognisable
// as one. Different labs reuse the same addresses without
// conflict: each lab's namespaces are connected only to each other. The
// lab is IPv4 only: a host's only IPv6 route is the link-local one to the
// router, so hosts cannot reach each other over IPv6, and cuts are IPv4
// rules.
//
// No traffic leaves a lab. Nothing is created in the caller's namespace:
// each veth pair is created in the router namespace with its peer placed
// straight into the host's namespace. The router has no link to the real
// network and no default route, so a packet for any address outside the
// lab is answered with "network unreachable" by the router.
//
// # Running programs on a host
//
// Lab.Command and Lab.CommandContext return an *exec.Cmd that runs a
// program with `ip netns exec NS program args...`. ip enters the namespace
// and then replaces itself with the program (execvp, no fork), so the
// Cmd's process is the program itself: signals, exit status and Wait
// behave as for any child. A Go process cannot move itself into another
// network namespace safely (setns applies to one OS thread only, and the
// runtime moves goroutines between threads), so every program in a lab,
// including the ip and iptables commands this package runs there, is a
// separate process.
//
// # Cuts
//
// Lab.Cut(from, to) drops every packet that host from sends to host to;
// CutBoth, Isolate, Heal, HealBoth, Rejoin and HealAll are built on the
// same one-way cuts. Each cut is one rule in a chain of the lab's own
// (NETLAB) in the router's filter table, matching the router-side
// interfaces a packet enters and leaves by:
//
//	-A NETLAB -i h2 -o h1 -j DROP   # Cut("b", "a")
//
// FORWARD jumps to NETLAB once. Every change rewrites the whole chain from
// the lab's set of cuts with one iptables-restore transaction, so Isolate
// takes effect at once and healing removes exactly the rules the lab
// added. Packets are dropped, not rejected, as a real partition loses
// them: no reset and no ICMP error tells either side. The rules match
// every packet, not only new connections (there is no conntrack rule
// accepting established flows), so a cut stalls connections already open,
// such as raft's and gRPC's, as well as failing new ones. After a heal,
// stalled TCP connections resume at their next retransmission, which can
// take a few seconds after a long cut (retransmission backs off).
//
// # What a one-way cut means for TCP
//
// TCP needs both directions. Cut(a, b) drops a's packets to b but lets
// b's packets reach a:
//
//   - b cannot open a connection to a: b's SYN arrives, a's SYN-ACK is
//     dropped, and b's connect times out (a holds a half-open entry).
//   - On a connection already open between them, b's bytes are delivered
//     to a, which acts on them, but a's acknowledgements and replies are
//     lost: b sees no answer and retransmits. A request applied whose
//     answer never comes back is exactly the case a one-way cut tests.
//   - a cannot open a connection to b either (its SYN is dropped), and a's
//     writes on an open connection stall.
//
// So for TCP a one-way cut fails every exchange between the two hosts in
// both directions; what differs from a two-way cut is that the cut-off
// side's data still arrives. Datagram protocols see a true one-way link.
//
// # Names and cleanup
//
// A lab's namespaces are named <prefix>-<pid>-<n>-<host> and
// <prefix>-<pid>-<n>-router, where prefix is Config.Prefix ("netlab" by
// default), pid is the process that made the lab and n counts labs within
// that process, so parallel test binaries and parallel tests never collide.
// Host names and the prefix are lower-case letters and digits, so a name
// splits back into its parts. The lab removes its namespaces at the end of
// the test (t.Cleanup) or at Close, first killing any process still running
// in them. New also removes the namespaces of labs with the same prefix
// whose process is gone (a test binary that crashed or was killed), and
// their processes; it never touches a live process's lab.
//
// Available reports whether this process can build labs (root, ip and
// iptables present, namespaces and iptables usable), so that tests skip
// elsewhere with the reason. Every command the package runs has a
// deadline, and a failed command's error names it and quotes its output.
package netlab
