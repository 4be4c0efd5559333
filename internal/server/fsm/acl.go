package fsm

import (
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// BootstrappedError is the FSM's refusal of a second ACL bootstrap.
type BootstrappedError struct {
	// Index is the current bootstrap index, the one a reset must name.
	Index uint64
	// ResetIndex is the index the refused command named, 0 for none.
	ResetIndex uint64
}

func (e *BootstrappedError) Error() string {
	if e.ResetIndex != 0 {
		return fmt.Sprintf("ACL bootstrap already done at index %d; reset index %d is not the current one", e.Index, e.ResetIndex)
	}
	return fmt.Sprintf("ACL bootstrap already done at index %d", e.Index)
}

// putACLToken checks a token and writes it, keeping the create time of
// the token it replaces. Another token's secret hash is refused.
func putACLToken(txn *state.Txn, r *statepb.ACLTokenRecord, ts *timestamppb.Timestamp) error {
	if err := state.ValidateTokenRecord(r); err != nil {
		return err
	}
	if old := txn.ACLToken(r.GetAccessorId()); old != nil && old.GetCreateTime() != nil {
		r.CreateTime = old.GetCreateTime()
	}
	if r.CreateTime == nil {
		r.CreateTime = ts
	}
	return txn.PutACLToken(r)
}

// applyACL applies one ACL command of a log entry at index. It checks
// before it writes. ACL commands cause no cluster events.
func applyACL(txn *state.Txn, index uint64, ts *timestamppb.Timestamp, cmd any) error {
	switch c := cmd.(type) {
	case *statepb.LogEntry_AclPolicyUpsert:
		p := c.AclPolicyUpsert
		parsed, err := state.ParsePolicyRules(p)
		if err != nil {
			return fmt.Errorf("acl policy %q: %w", p.GetName(), err)
		}
		p.CreateTime = ts
		if old := txn.ACLPolicy(p.GetName()); old != nil && old.GetCreateTime() != nil {
			p.CreateTime = old.GetCreateTime()
		}
		p.ModifyTime = ts
		return txn.PutACLPolicy(p, parsed)
	case *statepb.LogEntry_AclPolicyDelete:
		return txn.DeleteACLPolicy(c.AclPolicyDelete)
	case *statepb.LogEntry_AclTokenUpsert:
		return putACLToken(txn, c.AclTokenUpsert, ts)
	case *statepb.LogEntry_AclTokenDelete:
		return txn.DeleteACLToken(c.AclTokenDelete)
	case *statepb.LogEntry_AclBootstrap:
		cur := txn.ACLBootstrapIndex()
		if cur != 0 && c.AclBootstrap.GetResetIndex() != cur {
			return &BootstrappedError{Index: cur, ResetIndex: c.AclBootstrap.GetResetIndex()}
		}
		tok := c.AclBootstrap.GetToken()
		if tok.GetType() != acl.TypeManagement {
			return fmt.Errorf("acl bootstrap: token type %q, want %s", tok.GetType(), acl.TypeManagement)
		}
		if err := putACLToken(txn, tok, ts); err != nil {
			return fmt.Errorf("acl bootstrap: %w", err)
		}
		return txn.SetACLBootstrapIndex(index)
	default:
		return fmt.Errorf("unknown acl command %T", c)
	}
}
