package consensus

import (
	"encoding/hex"
	"slices"
	"strings"
	"time"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// KeyHash is the SHA-256 of a plaintext API key, the only form in which a key
// is stored (raft log, snapshots, memory).
type KeyHash [32]byte

// String is the hash in lowercase hex.
func (h KeyHash) String() string { return hex.EncodeToString(h[:]) }

// Limits are a key's governance limits; zero means unlimited.
type Limits struct {
	// RPM is requests per minute.
	RPM int64
	// DailyQuota is counted requests per UTC day.
	DailyQuota int64
	// MonthlyBudgetMicros is estimated cost per UTC month in micro-units.
	MonthlyBudgetMicros int64
}

// Key is one stored API key. It never holds the plaintext.
type Key struct {
	ID        string    // stable id, shown to operators
	Hash      KeyHash   // SHA-256 of the plaintext
	Name      string    // human-readable name
	App       string    // application the key belongs to
	Admin     bool      // may use the admin API
	Endpoints []string  // sorted allowlist; empty allows every endpoint
	Limits    Limits    // rpm, daily quota, monthly budget
	ExpiresAt time.Time // zero never expires
	Revoked   bool      // revoked for good
	RevokedAt time.Time // when it was revoked
	CreatedAt time.Time // command time of the creation
}

// Allows reports whether the allowlist admits endpoint (empty admits all).
func (k Key) Allows(endpoint string) bool {
	if len(k.Endpoints) == 0 {
		return true
	}
	_, ok := slices.BinarySearch(k.Endpoints, endpoint)
	return ok
}

// Active reports whether the key is neither revoked nor expired at now.
func (k Key) Active(now time.Time) bool {
	return !k.Revoked && (k.ExpiresAt.IsZero() || now.Before(k.ExpiresAt))
}

func (k *Key) clone() Key {
	c := *k
	c.Endpoints = slices.Clone(k.Endpoints)
	return c
}

// keyIDFromHash derives a key id when the creator gives none. Eight bytes of
// a SHA-256 of a high-entropy key reveal nothing useful about the key.
func keyIDFromHash(h KeyHash) string { return "key_" + hex.EncodeToString(h[:8]) }

type keysTable struct {
	byID   map[string]*Key
	byHash map[KeyHash]*Key
}

func newKeysTable() keysTable {
	return keysTable{byID: map[string]*Key{}, byHash: map[KeyHash]*Key{}}
}

func (t *keysTable) create(now time.Time, c *pb.KeyCreate) *pb.ApplyResult {
	if len(c.GetKeyHash()) != len(KeyHash{}) {
		return reject(codeInvalid, "key hash must be %d bytes", len(KeyHash{}))
	}
	var h KeyHash
	copy(h[:], c.GetKeyHash())
	id := c.GetId()
	if id == "" {
		id = keyIDFromHash(h)
	}
	if strings.HasPrefix(id, "plan:") {
		return reject(codeInvalid, "key ids starting with plan: are reserved")
	}
	if c.GetName() == "" {
		return reject(codeInvalid, "key name is required")
	}
	if err := validLimits(c.GetLimits()); err != "" {
		return reject(codeInvalid, "%s", err)
	}
	if prev, ok := t.byHash[h]; ok {
		if prev.ID == id {
			// A retried create of the same key: answer as the first time.
			return &pb.ApplyResult{Key: keyToProto(prev)}
		}
		return reject(codeConflict, "a key with this hash already exists")
	}
	if _, ok := t.byID[id]; ok {
		return reject(codeConflict, "key id %q already exists", id)
	}
	k := &Key{
		ID:        id,
		Hash:      h,
		Name:      c.GetName(),
		App:       c.GetApp(),
		Admin:     c.GetAdmin(),
		Endpoints: normalizeList(c.GetEndpoints()),
		Limits:    limitsFromProto(c.GetLimits()),
		ExpiresAt: timeFromNanos(c.GetExpiresUnixNano()),
		CreatedAt: now,
	}
	t.byID[id] = k
	t.byHash[h] = k
	return &pb.ApplyResult{Key: keyToProto(k)}
}

func (t *keysTable) update(u *pb.KeyUpdate) *pb.ApplyResult {
	k, ok := t.byID[u.GetId()]
	if !ok {
		return reject(codeNotFound, "no key %q", u.GetId())
	}
	if u.Name != nil && u.GetName() == "" {
		return reject(codeInvalid, "key name cannot be empty")
	}
	if u.Limits != nil {
		if err := validLimits(u.GetLimits()); err != "" {
			return reject(codeInvalid, "%s", err)
		}
	}
	if u.Name != nil {
		k.Name = u.GetName()
	}
	if u.App != nil {
		k.App = u.GetApp()
	}
	if u.Admin != nil {
		k.Admin = u.GetAdmin()
	}
	if u.GetSetEndpoints() {
		k.Endpoints = normalizeList(u.GetEndpoints())
	}
	if u.Limits != nil {
		k.Limits = limitsFromProto(u.GetLimits())
	}
	if u.ExpiresUnixNano != nil {
		k.ExpiresAt = timeFromNanos(u.GetExpiresUnixNano())
	}
	return &pb.ApplyResult{Key: keyToProto(k)}
}

// revoke marks the key revoked; it stays listed so operators see it. The
// key's lease ledgers are dropped by the caller.
func (t *keysTable) revoke(now time.Time, r *pb.KeyRevoke) *pb.ApplyResult {
	k, ok := t.byID[r.GetId()]
	if !ok {
		return reject(codeNotFound, "no key %q", r.GetId())
	}
	if !k.Revoked {
		k.Revoked = true
		k.RevokedAt = now
	}
	return &pb.ApplyResult{Key: keyToProto(k)}
}

func (t *keysTable) sorted() []*Key {
	out := make([]*Key, 0, len(t.byID))
	for _, k := range t.byID {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b *Key) int { return compareStrings(a.ID, b.ID) })
	return out
}

func (t *keysTable) load(keys []*pb.ApiKey) error {
	for _, pk := range keys {
		k, err := keyFromProto(pk)
		if err != nil {
			return err
		}
		if _, dup := t.byID[k.ID]; dup {
			return errorf("snapshot: duplicate key id %q", k.ID)
		}
		if _, dup := t.byHash[k.Hash]; dup {
			return errorf("snapshot: duplicate key hash for %q", k.ID)
		}
		t.byID[k.ID] = k
		t.byHash[k.Hash] = k
	}
	return nil
}

func validLimits(l *pb.KeyLimits) string {
	if l.GetRpm() < 0 || l.GetDailyQuota() < 0 || l.GetMonthlyBudgetMicros() < 0 {
		return "limits cannot be negative"
	}
	return ""
}

func limitsFromProto(l *pb.KeyLimits) Limits {
	return Limits{RPM: l.GetRpm(), DailyQuota: l.GetDailyQuota(), MonthlyBudgetMicros: l.GetMonthlyBudgetMicros()}
}

func limitsToProto(l Limits) *pb.KeyLimits {
	return &pb.KeyLimits{Rpm: l.RPM, DailyQuota: l.DailyQuota, MonthlyBudgetMicros: l.MonthlyBudgetMicros}
}

func keyToProto(k *Key) *pb.ApiKey {
	return &pb.ApiKey{
		Id:              k.ID,
		KeyHash:         k.Hash[:],
		Name:            k.Name,
		App:             k.App,
		Admin:           k.Admin,
		Endpoints:       slices.Clone(k.Endpoints),
		Limits:          limitsToProto(k.Limits),
		ExpiresUnixNano: nanosFromTime(k.ExpiresAt),
		Revoked:         k.Revoked,
		RevokedUnixNano: nanosFromTime(k.RevokedAt),
		CreatedUnixNano: nanosFromTime(k.CreatedAt),
	}
}

func keyFromProto(pk *pb.ApiKey) (*Key, error) {
	if len(pk.GetKeyHash()) != len(KeyHash{}) || pk.GetId() == "" {
		return nil, errorf("snapshot: malformed key %q", pk.GetId())
	}
	k := &Key{
		ID:        pk.GetId(),
		Name:      pk.GetName(),
		App:       pk.GetApp(),
		Admin:     pk.GetAdmin(),
		Endpoints: normalizeList(pk.GetEndpoints()),
		Limits:    limitsFromProto(pk.GetLimits()),
		ExpiresAt: timeFromNanos(pk.GetExpiresUnixNano()),
		Revoked:   pk.GetRevoked(),
		RevokedAt: timeFromNanos(pk.GetRevokedUnixNano()),
		CreatedAt: timeFromNanos(pk.GetCreatedUnixNano()),
	}
	copy(k.Hash[:], pk.GetKeyHash())
	return k, nil
}
