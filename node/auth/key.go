package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"time"
)

// KeyPrefix starts every key NewKey generates, so leaked keys are easy to
// recognise in logs and by secret scanners.
const KeyPrefix = "im-"

// keyChars is the base62 alphabet of generated keys.
const keyChars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// keyLen is the number of base62 characters after the prefix: 43 of them
// carry 256 bits.
const keyLen = 43

// Limits are a key's governance limits; zero means unlimited (or, for RPM,
// the node's server-wide default).
type Limits struct {
	RPM                 int64 // requests per minute
	DailyQuota          int64 // counted requests per UTC day
	MonthlyBudgetMicros int64 // estimated cost per UTC month, micro-units
}

// Key is what auth needs to know about a stored API key. It never holds
// the plaintext.
type Key struct {
	ID        string    // stable id, shown to operators
	Hash      [32]byte  // SHA-256 of the plaintext (HashKey)
	Name      string    // human-readable name
	App       string    // application the key belongs to
	Admin     bool      // may use usage and admin endpoints
	Endpoints []string  // allowlist of class names; empty allows every class
	Limits    Limits    // rpm, daily quota, monthly budget
	ExpiresAt time.Time // zero never expires
	Revoked   bool      // revoked for good
}

// Active reports whether the key is neither revoked nor expired at now.
func (k Key) Active(now time.Time) bool {
	return !k.Revoked && (k.ExpiresAt.IsZero() || now.Before(k.ExpiresAt))
}

// KeyStore finds keys by the hash of their plaintext. The node implements
// it over the replicated consensus state; StaticKeys is an in-memory one.
// KeyByHash is on every request's path and must be cheap.
type KeyStore interface {
	// KeyByHash returns the key whose plaintext hashes to hash (HashKey),
	// revoked and expired keys included; false when there is none.
	KeyByHash(hash [32]byte) (Key, bool)
}

// HashKey hashes a plaintext key the way stores index it (SHA-256, the
// consensus.KeyHash the replicated key table is indexed by).
func HashKey(plaintext string) [32]byte { return sha256.Sum256([]byte(plaintext)) }

// NewKey generates a key: KeyPrefix and 43 base62 characters (256 bits from
// crypto/rand). It returns the plaintext, to show once, and its hash, to
// store.
func NewKey() (plaintext string, hash [32]byte) {
	b := make([]byte, len(KeyPrefix), len(KeyPrefix)+keyLen)
	copy(b, KeyPrefix)
	var buf [64]byte
	for len(b) < cap(b) {
		rand.Read(buf[:])
		for _, c := range buf {
			// 248 = 4*62: rejecting larger bytes keeps every character
			// equally likely.
			if c < 248 && len(b) < cap(b) {
				b = append(b, keyChars[c%62])
			}
		}
	}
	plaintext = string(b)
	return plaintext, HashKey(plaintext)
}
