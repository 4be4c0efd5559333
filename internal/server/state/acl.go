package state

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/hashicorp/go-memdb"

	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/server/statepb"
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
	// MaxACLDescription is the longest policy description, in bytes.
	MaxACLDescription = 4 << 10
	// MaxACLTokenName is the longest token name, in bytes.
	MaxACLTokenName = 256
	// MaxACLTokenPolicies is the most policies a client token names.
	MaxACLTokenPolicies = 128
	// MaxACLAccessorID is the longest accessor id.
	MaxACLAccessorID = 128
	// MaxACLNodeIdentity is the longest node identity of a token, in
	// bytes: the longest node name.
	MaxACLNodeIdentity = ids.MaxNodeName
)

// aclPolicyRow is one policy in the acl_policies table, with its parsed
// rules so that resolving a token does not parse HCL.
type aclPolicyRow struct {
	Name   string
	Policy *statepb.ACLPolicy
	Parsed *acl.Policy
}

// aclTokenRow is one token in the acl_tokens table. SecretHash is the hex
// of the token's secret hash, for the string index the lookup by secret
// uses.
type aclTokenRow struct {
	AccessorID string
	SecretHash string
	Token      *statepb.ACLTokenRecord
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

// ACLPolicy returns one policy or nil.
func (s *Store) ACLPolicy(name string) *statepb.ACLPolicy {
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
func (s *Store) ACLPolicies() []*statepb.ACLPolicy {
	it, err := s.db.Txn(false).Get(tableACLPolicies, "id")
	if err != nil {
		return nil
	}
	var out []*statepb.ACLPolicy
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*aclPolicyRow).Policy)
	}
	return out
}

// ACLToken returns the token with the accessor id, or nil.
func (s *Store) ACLToken(accessorID string) *statepb.ACLTokenRecord {
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
func (s *Store) ACLTokens() []*statepb.ACLTokenRecord {
	it, err := s.db.Txn(false).Get(tableACLTokens, "id")
	if err != nil {
		return nil
	}
	var out []*statepb.ACLTokenRecord
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*aclTokenRow).Token)
	}
	return out
}

// ACLTokenBySecret returns the token whose secret id is secret, or nil.
// It looks the token up by the secret's hash and compares the hashes in
// constant time.
func (s *Store) ACLTokenBySecret(secret string) *statepb.ACLTokenRecord {
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
func (s *Store) ACLBootstrapIndex() uint64 {
	return getIndex(s.db.Txn(false), indexACLBootstrap)
}

func getIndex(txn *memdb.Txn, key string) uint64 {
	raw, err := txn.First(tableIndex, "id", key)
	if err != nil || raw == nil {
		return 0
	}
	return raw.(*indexRow).Value
}

// ResolveToken resolves a secret id against the state in one read. An
// empty secret gets the rules of the policy named acl.AnonymousPolicy, or
// acl.DenyAll when there is none, and a nil token. An unknown secret is
// acl.ErrTokenNotFound. A management token gets acl.Management; a client
// token the rules of its policies that exist, and node:write bound to its
// node when it has a node identity (acl.ACL.WithNodeIdentity). The token
// returned is the
// stored record, which holds the secret only as its hash. The policies are those the token names that exist, in the
// token's order; for an empty secret, the anonymous policy when it
// exists.
func (s *Store) ResolveToken(secret string) (*acl.ACL, *statepb.ACLTokenRecord, []*statepb.ACLPolicy, error) {
	txn := s.db.Txn(false)
	if secret == "" {
		row := getACLPolicy(txn, acl.AnonymousPolicy)
		if row == nil {
			return acl.DenyAll(), nil, nil, nil
		}
		return acl.Compile(row.Parsed), nil, []*statepb.ACLPolicy{row.Policy}, nil
	}
	tok := getACLTokenBySecret(txn, secret)
	if tok == nil {
		return nil, nil, nil, acl.ErrTokenNotFound
	}
	switch tok.Token.GetType() {
	case acl.TypeManagement:
		return acl.Management(), tok.Token, nil, nil
	case acl.TypeClient:
		var policies []*statepb.ACLPolicy
		var parsed []*acl.Policy
		for _, name := range tok.Token.GetPolicies() {
			if row := getACLPolicy(txn, name); row != nil {
				policies = append(policies, row.Policy)
				parsed = append(parsed, row.Parsed)
			}
		}
		return acl.Compile(parsed...).WithNodeIdentity(tok.Token.GetNodeIdentity()), tok.Token, policies, nil
	}
	// A type the state accepted but this version does not know grants
	// nothing.
	return acl.DenyAll(), tok.Token, nil, nil
}

// ParsePolicyRules checks the name and description of a stored or
// proposed policy and parses its rules.
func ParsePolicyRules(p *statepb.ACLPolicy) (*acl.Policy, error) {
	if err := acl.ValidatePolicyName(p.GetName()); err != nil {
		return nil, err
	}
	if len(p.GetDescription()) > MaxACLDescription {
		return nil, fmt.Errorf("acl policy %q: description is %d bytes, at most %d are allowed", p.GetName(), len(p.GetDescription()), MaxACLDescription)
	}
	parsed, err := acl.ParsePolicy(p.GetName(), "policy "+p.GetName(), []byte(p.GetRules()))
	if err != nil {
		return nil, err
	}
	parsed.Description = p.GetDescription()
	return parsed, nil
}

// ValidateTokenRecord checks a token record before it is stored: its
// accessor id, secret hash, name, type, policies and node identity (its
// length: the servers check its syntax when the token is created).
func ValidateTokenRecord(r *statepb.ACLTokenRecord) error {
	var errs []error
	if r.GetAccessorId() == "" || len(r.GetAccessorId()) > MaxACLAccessorID {
		errs = append(errs, fmt.Errorf("accessor id %q: want 1 to %d characters", r.GetAccessorId(), MaxACLAccessorID))
	}
	if len(r.GetSecretHash()) != sha256.Size {
		errs = append(errs, fmt.Errorf("secret hash is %d bytes, want %d (SHA-256)", len(r.GetSecretHash()), sha256.Size))
	}
	if len(r.GetName()) > MaxACLTokenName {
		errs = append(errs, fmt.Errorf("name is %d bytes, at most %d are allowed", len(r.GetName()), MaxACLTokenName))
	}
	switch r.GetType() {
	case acl.TypeManagement:
		if len(r.GetPolicies()) > 0 {
			errs = append(errs, errors.New("a management token takes no policies"))
		}
		if r.GetNodeIdentity() != "" {
			errs = append(errs, errors.New("a management token takes no node identity"))
		}
	case acl.TypeClient:
		if len(r.GetPolicies()) == 0 && r.GetNodeIdentity() == "" {
			errs = append(errs, errors.New("a client token needs at least one policy or a node identity"))
		}
		if len(r.GetNodeIdentity()) > MaxACLNodeIdentity {
			errs = append(errs, fmt.Errorf("node identity is %d bytes, at most %d are allowed", len(r.GetNodeIdentity()), MaxACLNodeIdentity))
		}
		if len(r.GetPolicies()) > MaxACLTokenPolicies {
			errs = append(errs, fmt.Errorf("%d policies, at most %d are allowed", len(r.GetPolicies()), MaxACLTokenPolicies))
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

// restoreACL writes the ACL state of a snapshot into txn. A policy whose
// rules this version no longer accepts is kept, and grants nothing: a
// restore must not fail on what was valid when it was written.
func restoreACL(txn *memdb.Txn, snap *statepb.StateSnapshot) error {
	for _, p := range snap.GetAclPolicies() {
		parsed, err := ParsePolicyRules(p)
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

// ACLPolicy returns one policy as the transaction sees it, or nil.
func (t *Txn) ACLPolicy(name string) *statepb.ACLPolicy {
	if row := getACLPolicy(t.txn, name); row != nil {
		return row.Policy
	}
	return nil
}

// PutACLPolicy writes a policy with its parsed rules.
func (t *Txn) PutACLPolicy(p *statepb.ACLPolicy, parsed *acl.Policy) error {
	if err := t.txn.Insert(tableACLPolicies, &aclPolicyRow{Name: p.GetName(), Policy: p, Parsed: parsed}); err != nil {
		return fmt.Errorf("write acl policy %q: %w", p.GetName(), err)
	}
	return nil
}

// DeleteACLPolicy deletes a policy; a missing one is ErrNotFound.
func (t *Txn) DeleteACLPolicy(name string) error {
	old := getACLPolicy(t.txn, name)
	if old == nil {
		return fmt.Errorf("acl policy %q: %w", name, ErrNotFound)
	}
	if err := t.txn.Delete(tableACLPolicies, old); err != nil {
		return fmt.Errorf("delete acl policy %q: %w", name, err)
	}
	return nil
}

// ACLToken returns the token with the accessor id as the transaction sees
// it, or nil.
func (t *Txn) ACLToken(accessorID string) *statepb.ACLTokenRecord {
	if row := getACLToken(t.txn, accessorID); row != nil {
		return row.Token
	}
	return nil
}

// PutACLToken writes a token checked with ValidateTokenRecord. Another
// token's secret hash is refused.
func (t *Txn) PutACLToken(r *statepb.ACLTokenRecord) error {
	hash := hex.EncodeToString(r.GetSecretHash())
	if raw, err := t.txn.First(tableACLTokens, "secret", hash); err != nil {
		return fmt.Errorf("acl token %s: look up secret hash: %w", r.GetAccessorId(), err)
	} else if raw != nil && raw.(*aclTokenRow).AccessorID != r.GetAccessorId() {
		return fmt.Errorf("acl token %s: its secret belongs to another token", r.GetAccessorId())
	}
	if err := t.txn.Insert(tableACLTokens, &aclTokenRow{AccessorID: r.GetAccessorId(), SecretHash: hash, Token: r}); err != nil {
		return fmt.Errorf("write acl token %s: %w", r.GetAccessorId(), err)
	}
	return nil
}

// DeleteACLToken deletes a token; a missing one is ErrNotFound.
func (t *Txn) DeleteACLToken(accessorID string) error {
	old := getACLToken(t.txn, accessorID)
	if old == nil {
		return fmt.Errorf("acl token %s: %w", accessorID, ErrNotFound)
	}
	if err := t.txn.Delete(tableACLTokens, old); err != nil {
		return fmt.Errorf("delete acl token %s: %w", accessorID, err)
	}
	return nil
}

// ACLBootstrapIndex returns the raft index of the ACL bootstrap as the
// transaction sees it, 0 for none.
func (t *Txn) ACLBootstrapIndex() uint64 { return getIndex(t.txn, indexACLBootstrap) }

// SetACLBootstrapIndex records the raft index of the ACL bootstrap.
func (t *Txn) SetACLBootstrapIndex(index uint64) error {
	if err := t.txn.Insert(tableIndex, &indexRow{Key: indexACLBootstrap, Value: index}); err != nil {
		return fmt.Errorf("write acl bootstrap index: %w", err)
	}
	return nil
}
