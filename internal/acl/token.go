package acl

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/grpc/metadata"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// AnonymousPolicy is the name of the policy that applies to requests
// without a token. When no policy of that name exists, requests without a
// token are denied everything.
const AnonymousPolicy = "anonymous"

// Token types.
const (
	// TypeManagement is a token that allows everything.
	TypeManagement = "management"
	// TypeClient is a token that allows what its policies allow.
	TypeClient = "client"
)

// TokenMetadataKey is the gRPC metadata key a token's secret id travels
// in.
const TokenMetadataKey = csisupdv1.TokenMetadataKey

// ErrTokenNotFound means that no token has the secret id presented.
var ErrTokenNotFound = errors.New("acl: token not found")

// NewSecretID returns a new secret id: a random UUID (version 4) from
// crypto/rand.
func NewSecretID() (string, error) { return newUUID("secret id") }

// NewAccessorID returns a new accessor id: a random UUID (version 4).
func NewAccessorID() (string, error) { return newUUID("accessor id") }

func newUUID(what string) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("acl: new %s: %w", what, err)
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:]), nil
}

// HashSecret returns the SHA-256 of a secret id, the only form in which a
// secret is stored.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// SecretMatches reports whether hash is the HashSecret of secret,
// comparing in constant time. An empty secret never matches.
func SecretMatches(hash []byte, secret string) bool {
	if secret == "" {
		return false
	}
	return subtle.ConstantTimeCompare(HashSecret(secret), hash) == 1
}

// TokenFromContext returns the secret id in the incoming gRPC metadata of
// ctx (the first value of TokenMetadataKey), or "" when there is none.
func TokenFromContext(ctx context.Context) string {
	// Only the one key: FromIncomingContext copies every header.
	if v := metadata.ValueFromIncomingContext(ctx, TokenMetadataKey); len(v) > 0 {
		return v[0]
	}
	return ""
}

// WithToken returns ctx with secret appended to its outgoing gRPC
// metadata under TokenMetadataKey. An empty secret leaves ctx as it is.
func WithToken(ctx context.Context, secret string) context.Context {
	if secret == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, TokenMetadataKey, secret)
}
