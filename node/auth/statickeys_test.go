package auth

import (
	"slices"
	"sync"
)

// StaticKeys is an in-memory KeyStore, safe for concurrent use, for tests
// (the node's store is the replicated key table).
type StaticKeys struct {
	mu     sync.RWMutex
	byHash map[[32]byte]Key
}

// NewStaticKeys returns a store holding keys.
func NewStaticKeys(keys ...Key) *StaticKeys {
	s := &StaticKeys{byHash: make(map[[32]byte]Key, len(keys))}
	for _, k := range keys {
		s.Put(k)
	}
	return s
}

// Put adds or replaces the key with k's hash (revoke by putting it back
// with Revoked set).
func (s *StaticKeys) Put(k Key) {
	k.Endpoints = slices.Clone(k.Endpoints)
	s.mu.Lock()
	s.byHash[k.Hash] = k
	s.mu.Unlock()
}

// KeyByHash implements KeyStore.
func (s *StaticKeys) KeyByHash(hash [32]byte) (Key, bool) {
	s.mu.RLock()
	k, ok := s.byHash[hash]
	s.mu.RUnlock()
	k.Endpoints = slices.Clone(k.Endpoints)
	return k, ok
}
