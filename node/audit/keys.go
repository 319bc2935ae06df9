package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// KeyFileName is the node's audit signing key file in its data dir.
const KeyFileName = "audit.key"

// DirName is the audit log directory in a node's data dir.
const DirName = "audit"

// KeyDirectory gives the audit public key of every node, by node id. The
// node implements it over replicated state, so every node (and an admin
// export) knows every other node's key.
type KeyDirectory interface {
	AuditKeys() map[string]ed25519.PublicKey
}

// LoadOrCreateKey reads the ed25519 private key at path (PEM, PKCS #8),
// creating it on first use: generated, written to a temporary 0600 file,
// synced and renamed into place, so a crash never leaves half a key. An
// existing key file readable by others is tightened to 0600.
func LoadOrCreateKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if st, serr := os.Stat(path); serr == nil && st.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(path, 0o600); err != nil {
				return nil, fmt.Errorf("audit key %s: %w", path, err)
			}
		}
		return parseKeyPEM(path, b)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".audit-key-*")
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	// Link fails if another process created the key meanwhile; then that
	// key is the node's key.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return LoadOrCreateKey(path)
		}
		return nil, fmt.Errorf("audit key: %w", err)
	}
	syncDir(dir)
	return priv, nil
}

func parseKeyPEM(path string, b []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("audit key %s: not a PEM PRIVATE KEY", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("audit key %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("audit key %s: not an ed25519 key", path)
	}
	return priv, nil
}

// syncDir makes a rename or creation in dir durable; errors are ignored
// (some file systems cannot sync directories).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// Fingerprint names a public key in logs: the first 16 hex digits of its
// SHA-256.
func Fingerprint(pub ed25519.PublicKey) string {
	s := sha256.Sum256(pub)
	return hex.EncodeToString(s[:8])
}

// keysDoc is the JSON form of a key set: {"keys": {"node-id": "base64"}}.
type keysDoc struct {
	Keys map[string]string `json:"keys"`
}

// MarshalKeys encodes keys as {"keys": {"<node id>": "<standard base64 of
// the 32-byte public key>"}}: the body of the keys route and the format of
// `infermesh audit verify --keys`.
func MarshalKeys(keys map[string]ed25519.PublicKey) []byte {
	doc := keysDoc{Keys: make(map[string]string, len(keys))}
	ids := make([]string, 0, len(keys))
	for id := range keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		doc.Keys[id] = base64.StdEncoding.EncodeToString(keys[id])
	}
	b, _ := json.MarshalIndent(doc, "", "  ")
	return append(b, '\n')
}

// ParseKeys decodes MarshalKeys's format.
func ParseKeys(b []byte) (map[string]ed25519.PublicKey, error) {
	var doc keysDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("keys: %v", err)
	}
	if doc.Keys == nil {
		return nil, errors.New(`keys: want {"keys": {"<node id>": "<base64 public key>"}}`)
	}
	out := make(map[string]ed25519.PublicKey, len(doc.Keys))
	for id, s := range doc.Keys {
		k, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("keys: node %q: want the base64 of a %d-byte ed25519 public key", id, ed25519.PublicKeySize)
		}
		out[id] = ed25519.PublicKey(k)
	}
	return out, nil
}
