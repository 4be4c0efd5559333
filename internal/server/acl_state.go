package server

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
)

const (
	tableACLPolicies = "acl_policies"
	tableACLTokens   = "acl_tokens"

	// indexACLBootstrap is the key in the index table of the raft index
	// of the ACL bootstrap.
	indexACLBootstrap = "acl_bootstrap"
)

// Limits of ACL objects; policy rules are capped by acl.MaxPolicyBytes.
const (
	maxACLDescription   = 4 << 10
	maxACLTokenName     = 256
	maxACLTokenPolicies = 128
	maxACLAccessorID    = 128
)

// aclPolicyRow is one policy in the acl_policies table, with its parsed
// rules so that resolving a token does not parse HCL.
type aclPolicyRow struct {
	Name   string
	Policy *csisupdv1.ACLPolicy
	Parsed *acl.Policy
}

// aclTokenRow is one token in the acl_tokens table. SecretHash is the hex
// of the token's secret hash, for the string index the lookup by secret
// uses.
type aclTokenRow struct {
	AccessorID string
	SecretHash string
	Token      *csisupdv1.ACLTokenRecord
}

// aclTables returns the schema of the ACL tables.
func aclTables() map[string]*memdb.TableSchema {
	return map[string]*memdb.TableSchema{
		tableACLPolicies: {Name: tableACLPolicies, Indexes: map[string]*memdb.IndexSchema{
			"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "Name"}},
		}},
		tableACLTokens: {Name: tableACLTokens, Indexes: map[string]*memdb.IndexSchema{
			"id":     {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "AccessorID"}},
			"secret": {Name: "secret", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "SecretHash"}},
		}},
	}
}

// aclBootstrappedError is the FSM's refusal of a second ACL bootstrap.
type aclBootstrappedError struct {
	// Index is the current bootstrap index, the one a reset must name.
	Index uint64
	// ResetIndex is the index the refused command named, 0 for none.
	ResetIndex uint64
}

func (e *aclBootstrappedError) Error() string {
	if e.ResetIndex != 0 {
		return fmt.Sprintf("ACL bootstrap already done at index %d; reset index %d is not the current one", e.Index, e.ResetIndex)
	}
	return fmt.Sprintf("ACL bootstrap already done at index %d", e.Index)
}

// ACLPolicy returns one policy or nil.
func (s *StateStore) ACLPolicy(name string) *csisupdv1.ACLPolicy {
	if row := getACLPolicy(s.db.Txn(false), name); row != nil {
		return row.Policy
	}
	return nil
}

func getACLPolicy(txn *memdb.Txn, name string) *aclPolicyRow {
	raw, err := txn.First(tableACLPolicies, "id", name)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*aclPolicyRow)
}

// ACLPolicies returns every policy sorted by name.
func (s *StateStore) ACLPolicies() []*csisupdv1.ACLPolicy {
	it, err := s.db.Txn(false).Get(tableACLPolicies, "id")
	if err != nil {
		return nil
	}
	var out []*csisupdv1.ACLPolicy
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*aclPolicyRow).Policy)
	}
	return out
}

// ACLToken returns the token with the accessor id, or nil.
func (s *StateStore) ACLToken(accessorID string) *csisupdv1.ACLTokenRecord {
	if row := getACLToken(s.db.Txn(false), accessorID); row != nil {
		return row.Token
	}
	return nil
}

func getACLToken(txn *memdb.Txn, accessorID string) *aclTokenRow {
	raw, err := txn.First(tableACLTokens, "id", accessorID)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*aclTokenRow)
}

// ACLTokens returns every token sorted by accessor id.
func (s *StateStore) ACLTokens() []*csisupdv1.ACLTokenRecord {
	it, err := s.db.Txn(false).Get(tableACLTokens, "id")
	if err != nil {
		return nil
	}
	var out []*csisupdv1.ACLTokenRecord
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*aclTokenRow).Token)
	}
	return out
}

// ACLTokenBySecret returns the token whose secret id is secret, or nil.
// It looks the token up by the secret's hash and compares the hashes in
// constant time.
func (s *StateStore) ACLTokenBySecret(secret string) *csisupdv1.ACLTokenRecord {
	if row := getACLTokenBySecret(s.db.Txn(false), secret); row != nil {
		return row.Token
	}
	return nil
}

func getACLTokenBySecret(txn *memdb.Txn, secret string) *aclTokenRow {
	if secret == "" {
		return nil
	}
	raw, err := txn.First(tableACLTokens, "secret", hex.EncodeToString(acl.HashSecret(secret)))
	if err != nil || raw == nil {
		return nil
	}
	row := raw.(*aclTokenRow)
	if !acl.SecretMatches(row.Token.GetSecretHash(), secret) {
		return nil
	}
	return row
}

// ACLBootstrapIndex returns the raft index of the ACL bootstrap, 0 when
// the cluster was never bootstrapped.
func (s *StateStore) ACLBootstrapIndex() uint64 {
	return getIndex(s.db.Txn(false), indexACLBootstrap)
}

func getIndex(txn *memdb.Txn, key string) uint64 {
	raw, err := txn.First(tableIndex, "id", key)
	if err != nil || raw == nil {
		return 0
	}
	return raw.(*indexRow).Value
}

// resolveToken resolves a secret id against the state in one read: see
// Server.ResolveToken. The policies are those the token names that
// exist, in the token's order; for an empty secret, the anonymous policy
// when it exists.
func (s *StateStore) resolveToken(secret string) (*acl.ACL, *csisupdv1.ACLToken, []*aclPolicyRow, error) {
	txn := s.db.Txn(false)
	if secret == "" {
		row := getACLPolicy(txn, acl.AnonymousPolicy)
		if row == nil {
			return acl.DenyAll(), nil, nil, nil
		}
		return acl.Compile(row.Parsed), nil, []*aclPolicyRow{row}, nil
	}
	tok := getACLTokenBySecret(txn, secret)
	if tok == nil {
		return nil, nil, nil, acl.ErrTokenNotFound
	}
	view := tokenView(tok.Token)
	switch tok.Token.GetType() {
	case acl.TypeManagement:
		return acl.Management(), view, nil, nil
	case acl.TypeClient:
		var rows []*aclPolicyRow
		var parsed []*acl.Policy
		for _, name := range tok.Token.GetPolicies() {
			if row := getACLPolicy(txn, name); row != nil {
				rows = append(rows, row)
				parsed = append(parsed, row.Parsed)
			}
		}
		return acl.Compile(parsed...), view, rows, nil
	}
	// A type the state accepted but this version does not know grants
	// nothing.
	return acl.DenyAll(), view, nil, nil
}

// tokenView returns a token as the API shows it: without a secret.
func tokenView(r *csisupdv1.ACLTokenRecord) *csisupdv1.ACLToken {
	if r == nil {
		return nil
	}
	return &csisupdv1.ACLToken{
		AccessorId: r.GetAccessorId(),
		Name:       r.GetName(),
		Type:       r.GetType(),
		Policies:   r.GetPolicies(),
		CreateTime: r.GetCreateTime(),
	}
}

// parsePolicyRules parses the rules of a stored or proposed policy.
func parsePolicyRules(p *csisupdv1.ACLPolicy) (*acl.Policy, error) {
	if err := acl.ValidatePolicyName(p.GetName()); err != nil {
		return nil, err
	}
	if len(p.GetDescription()) > maxACLDescription {
		return nil, fmt.Errorf("acl policy %q: description is %d bytes, at most %d are allowed", p.GetName(), len(p.GetDescription()), maxACLDescription)
	}
	parsed, err := acl.ParsePolicy(p.GetName(), "policy "+p.GetName(), []byte(p.GetRules()))
	if err != nil {
		return nil, err
	}
	parsed.Description = p.GetDescription()
	return parsed, nil
}

// validateTokenRecord checks a token record before it is stored.
func validateTokenRecord(r *csisupdv1.ACLTokenRecord) error {
	var errs []error
	if r.GetAccessorId() == "" || len(r.GetAccessorId()) > maxACLAccessorID {
		errs = append(errs, fmt.Errorf("accessor id %q: want 1 to %d characters", r.GetAccessorId(), maxACLAccessorID))
	}
	if len(r.GetSecretHash()) != sha256.Size {
		errs = append(errs, fmt.Errorf("secret hash is %d bytes, want %d (SHA-256)", len(r.GetSecretHash()), sha256.Size))
	}
	if len(r.GetName()) > maxACLTokenName {
		errs = append(errs, fmt.Errorf("name is %d bytes, at most %d are allowed", len(r.GetName()), maxACLTokenName))
	}
	switch r.GetType() {
	case acl.TypeManagement:
		if len(r.GetPolicies()) > 0 {
			errs = append(errs, errors.New("a management token takes no policies"))
		}
	case acl.TypeClient:
		if len(r.GetPolicies()) == 0 {
			errs = append(errs, errors.New("a client token needs at least one policy"))
		}
		if len(r.GetPolicies()) > maxACLTokenPolicies {
			errs = append(errs, fmt.Errorf("%d policies, at most %d are allowed", len(r.GetPolicies()), maxACLTokenPolicies))
		}
		for _, name := range r.GetPolicies() {
			if err := acl.ValidatePolicyName(name); err != nil {
				errs = append(errs, err)
			}
		}
	default:
		errs = append(errs, fmt.Errorf("type %q: want %s or %s", r.GetType(), acl.TypeClient, acl.TypeManagement))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("acl token %s: %w", r.GetAccessorId(), err)
	}
	return nil
}

// putACLToken checks a token and writes it, keeping the create time of
// the token it replaces. Another token's secret hash is refused.
func putACLToken(txn *memdb.Txn, r *csisupdv1.ACLTokenRecord, ts *timestamppb.Timestamp) error {
	if err := validateTokenRecord(r); err != nil {
		return err
	}
	hash := hex.EncodeToString(r.GetSecretHash())
	if raw, err := txn.First(tableACLTokens, "secret", hash); err != nil {
		return fmt.Errorf("acl token %s: look up secret hash: %w", r.GetAccessorId(), err)
	} else if raw != nil && raw.(*aclTokenRow).AccessorID != r.GetAccessorId() {
		return fmt.Errorf("acl token %s: its secret belongs to another token", r.GetAccessorId())
	}
	if old := getACLToken(txn, r.GetAccessorId()); old != nil && old.Token.GetCreateTime() != nil {
		r.CreateTime = old.Token.GetCreateTime()
	}
	if r.CreateTime == nil {
		r.CreateTime = ts
	}
	if err := txn.Insert(tableACLTokens, &aclTokenRow{AccessorID: r.GetAccessorId(), SecretHash: hash, Token: r}); err != nil {
		return fmt.Errorf("write acl token %s: %w", r.GetAccessorId(), err)
	}
	return nil
}

// applyACL applies one ACL command of a log entry at index. It checks
// before it writes. ACL commands cause no cluster events.
func applyACL(txn *memdb.Txn, index uint64, ts *timestamppb.Timestamp, cmd any) error {
	switch c := cmd.(type) {
	case *csisupdv1.LogEntry_AclPolicyUpsert:
		p := c.AclPolicyUpsert
		parsed, err := parsePolicyRules(p)
		if err != nil {
			return fmt.Errorf("acl policy %q: %w", p.GetName(), err)
		}
		p.CreateTime = ts
		if old := getACLPolicy(txn, p.GetName()); old != nil && old.Policy.GetCreateTime() != nil {
			p.CreateTime = old.Policy.GetCreateTime()
		}
		p.ModifyTime = ts
		if err := txn.Insert(tableACLPolicies, &aclPolicyRow{Name: p.GetName(), Policy: p, Parsed: parsed}); err != nil {
			return fmt.Errorf("write acl policy %q: %w", p.GetName(), err)
		}
	case *csisupdv1.LogEntry_AclPolicyDelete:
		old := getACLPolicy(txn, c.AclPolicyDelete)
		if old == nil {
			return fmt.Errorf("acl policy %q: %w", c.AclPolicyDelete, ErrNotFound)
		}
		if err := txn.Delete(tableACLPolicies, old); err != nil {
			return fmt.Errorf("delete acl policy %q: %w", c.AclPolicyDelete, err)
		}
	case *csisupdv1.LogEntry_AclTokenUpsert:
		return putACLToken(txn, c.AclTokenUpsert, ts)
	case *csisupdv1.LogEntry_AclTokenDelete:
		old := getACLToken(txn, c.AclTokenDelete)
		if old == nil {
			return fmt.Errorf("acl token %s: %w", c.AclTokenDelete, ErrNotFound)
		}
		if err := txn.Delete(tableACLTokens, old); err != nil {
			return fmt.Errorf("delete acl token %s: %w", c.AclTokenDelete, err)
		}
	case *csisupdv1.LogEntry_AclBootstrap:
		cur := getIndex(txn, indexACLBootstrap)
		if cur != 0 && c.AclBootstrap.GetResetIndex() != cur {
			return &aclBootstrappedError{Index: cur, ResetIndex: c.AclBootstrap.GetResetIndex()}
		}
		tok := c.AclBootstrap.GetToken()
		if tok.GetType() != acl.TypeManagement {
			return fmt.Errorf("acl bootstrap: token type %q, want %s", tok.GetType(), acl.TypeManagement)
		}
		if err := putACLToken(txn, tok, ts); err != nil {
			return fmt.Errorf("acl bootstrap: %w", err)
		}
		if err := txn.Insert(tableIndex, &indexRow{Key: indexACLBootstrap, Value: index}); err != nil {
			return fmt.Errorf("write acl bootstrap index: %w", err)
		}
	default:
		return fmt.Errorf("unknown acl command %T", c)
	}
	return nil
}

// restoreACL writes the ACL state of a snapshot into txn. A policy whose
// rules this version no longer accepts is kept, and grants nothing: a
// restore must not fail on what was valid when it was written.
func restoreACL(txn *memdb.Txn, snap *csisupdv1.StateSnapshot) error {
	for _, p := range snap.GetAclPolicies() {
		parsed, err := parsePolicyRules(p)
		if err != nil {
			parsed = &acl.Policy{Name: p.GetName(), Description: p.GetDescription(), Rules: map[acl.Resource]acl.Level{}}
		}
		if err := txn.Insert(tableACLPolicies, &aclPolicyRow{Name: p.GetName(), Policy: p, Parsed: parsed}); err != nil {
			return fmt.Errorf("restore acl policy %q: %w", p.GetName(), err)
		}
	}
	for _, r := range snap.GetAclTokens() {
		if r.GetAccessorId() == "" {
			return errors.New("restore acl token: no accessor id")
		}
		row := &aclTokenRow{AccessorID: r.GetAccessorId(), SecretHash: hex.EncodeToString(r.GetSecretHash()), Token: r}
		if raw, err := txn.First(tableACLTokens, "secret", row.SecretHash); err == nil && raw != nil {
			return fmt.Errorf("restore acl token %s: its secret hash is also token %s's", r.GetAccessorId(), raw.(*aclTokenRow).AccessorID)
		}
		if err := txn.Insert(tableACLTokens, row); err != nil {
			return fmt.Errorf("restore acl token %s: %w", r.GetAccessorId(), err)
		}
	}
	if idx := snap.GetAclBootstrapIndex(); idx != 0 {
		if err := txn.Insert(tableIndex, &indexRow{Key: indexACLBootstrap, Value: idx}); err != nil {
			return fmt.Errorf("restore acl bootstrap index: %w", err)
		}
	}
	return nil
}
