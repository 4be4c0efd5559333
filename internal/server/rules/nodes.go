package rules

import (
	"crypto/sha256"
	"crypto/subtle"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// The rules of node identity: an agent makes a random node secret at its
// first start and presents it on every call of the Cluster service; the
// servers keep only its hash, on the node's record. The leader checks a
// call with these functions before it acts, and the FSM checks a
// registration with CheckNodeRegister again when it applies it, so that
// two registrations racing through raft cannot both win.

// SecretHash returns the hash the servers keep of a node secret. The
// secret is a random 256-bit value, so a plain SHA-256 is enough: there
// is nothing to guess that a salt would protect.
func SecretHash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// CheckNodeSecret decides whether a caller that presents the secret of
// hash may act as node, a registered node's record: nil when the hashes
// match. A node without a stored hash (rekeyed, or registered by an
// earlier release) is NotFound, which tells its agent to register again,
// and its registration stores the hash.
func CheckNodeSecret(nodeID string, node *statepb.ClusterNode, hash []byte) error {
	switch {
	case node == nil:
		return status.Errorf(codes.NotFound, "node %q is not registered", nodeID)
	case node.GetReplacedBy() != "":
		return status.Errorf(codes.PermissionDenied, "node %q was rekeyed and replaced by node %q", nodeID, node.GetReplacedBy())
	case len(node.GetSecretHash()) == 0:
		return status.Errorf(codes.NotFound, "node %q holds no node secret (rekeyed, or registered by an earlier release): it must register again", nodeID)
	case subtle.ConstantTimeCompare(node.GetSecretHash(), hash) != 1:
		return status.Errorf(codes.PermissionDenied, "node %q: node secret does not match", nodeID)
	}
	return nil
}

// CheckNodeRegister decides a registration of node id with name and the
// secret of hash. existing is id's record (nil for a new node) and holders
// are the nodes named name. It returns the node the registration replaces:
// a rekeyed node of the same name and another id, whose agent was
// reinstalled with an empty data_dir; nil when it replaces none.
//
// Refused: a registration without a secret; one whose secret differs from
// the one id holds; one of a replaced node; and one that takes the name of
// another node that holds a secret (a live node's name is never taken).
// A node of an earlier release, which holds no secret until its agent
// registers again, does not hold its name against others; its agent
// registers within one heartbeat of an upgrade.
func CheckNodeRegister(id, name string, hash []byte, existing *statepb.ClusterNode, holders []*statepb.ClusterNode) (*statepb.ClusterNode, error) {
	if len(hash) == 0 {
		return nil, status.Errorf(codes.Unauthenticated, "node %q: no node secret was presented (an agent of an earlier release? upgrade it)", id)
	}
	if existing != nil {
		if existing.GetReplacedBy() != "" {
			return nil, status.Errorf(codes.PermissionDenied, "node %q was rekeyed and replaced by node %q: remove its data_dir's node-id to register it as a new node", id, existing.GetReplacedBy())
		}
		if len(existing.GetSecretHash()) > 0 && subtle.ConstantTimeCompare(existing.GetSecretHash(), hash) != 1 {
			return nil, status.Errorf(codes.PermissionDenied, "node %q: node secret does not match (a reinstalled agent needs `csisupd node rekey %s` first)", id, id)
		}
	}
	var replaced *statepb.ClusterNode
	for _, h := range holders {
		if h.GetId() == id || h.GetReplacedBy() != "" || len(h.GetSecretHash()) == 0 && !h.GetRekeyed() {
			continue
		}
		if !h.GetRekeyed() {
			return nil, status.Errorf(codes.AlreadyExists, "node name %q is held by node %q: names are unique (if that node was reinstalled, `csisupd node rekey %s` lets the new agent take its name)", name, h.GetId(), h.GetId())
		}
		replaced = h
	}
	return replaced, nil
}
