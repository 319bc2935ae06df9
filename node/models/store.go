package models

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// ErrNotFound is returned when no installed model has the id.
var ErrNotFound = errors.New("model not found")

// Store is the on-disk model store under <data-dir>/models.
type Store struct {
	dir   string
	log   *slog.Logger
	clock func() time.Time

	mu     sync.RWMutex
	byID   map[string]*Manifest
	byWire map[string]*Manifest
}

// Open opens (creating if needed) the store in dir and reads every manifest.
// Unreadable model folders are logged and skipped, never fatal.
func Open(dir string, log *slog.Logger, clock func() time.Time) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("model store: %w", err)
	}
	s := &Store{dir: dir, log: log, clock: clock}
	// Leftovers of an import, replace or remove that a crash interrupted.
	if entries, err := os.ReadDir(dir); err == nil {
		for _, e := range entries {
			if n := e.Name(); strings.HasPrefix(n, ".import-") || strings.HasPrefix(n, ".old-") || strings.HasPrefix(n, ".rm-") {
				os.RemoveAll(filepath.Join(dir, n))
			}
		}
	}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload re-reads the manifests from disk.
func (s *Store) Reload() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	byID := map[string]*Manifest{}
	byWire := map[string]*Manifest{}
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name(), "manifest.json"))
		if err != nil {
			s.log.Warn("model folder without readable manifest", "dir", e.Name(), "err", err)
			continue
		}
		m, err := ParseManifest(b)
		if err != nil {
			s.log.Warn("model folder with invalid manifest", "dir", e.Name(), "err", err)
			continue
		}
		if folderName(m.ID) != e.Name() {
			s.log.Warn("model folder name does not match its id", "dir", e.Name(), "id", m.ID)
			continue
		}
		byID[m.ID] = m
		byWire[m.WireID()] = m
	}
	s.mu.Lock()
	s.byID, s.byWire = byID, byWire
	s.mu.Unlock()
	return nil
}

// folderName maps a canonical id to its folder: slashes become "--".
func folderName(id string) string { return strings.ReplaceAll(id, "/", "--") }

// Dir returns the folder of an installed model.
func (s *Store) Dir(m *Manifest) string { return filepath.Join(s.dir, folderName(m.ID)) }

// Get resolves a canonical or wire id.
func (s *Store) Get(id string) (*Manifest, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if m, ok := s.byID[id]; ok {
		return m, nil
	}
	if m, ok := s.byWire[id]; ok {
		return m, nil
	}
	return nil, ErrNotFound
}

// List returns the installed manifests sorted by canonical id.
func (s *Store) List() []*Manifest {
	s.mu.RLock()
	out := make([]*Manifest, 0, len(s.byID))
	for _, m := range s.byID {
		out = append(out, m)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Manifest) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Import installs the model folder src (which holds manifest.json and the
// files it names), or a bare .gguf file (its manifest made from the file's
// metadata). Files are copied into a temporary folder inside the store,
// hashed, and the folder is renamed into place, so a failed import leaves
// nothing installed. Importing an id that is already installed replaces it.
// A GGUF model file is checked (CheckGGUF) before anything is copied.
func (s *Store) Import(src string) (*Manifest, error) {
	if st, err := os.Stat(src); err == nil && st.Mode().IsRegular() && strings.EqualFold(filepath.Ext(src), ".gguf") {
		return s.importGGUF(src)
	}
	b, err := os.ReadFile(filepath.Join(src, "manifest.json"))
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", src, err)
	}
	m, err := ParseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", src, err)
	}
	if _, err := s.Get(m.WireID()); err == nil {
		if cur, _ := s.Get(m.WireID()); cur.ID != m.ID {
			return nil, fmt.Errorf("import %s: wire id %s is already used by %s", src, m.WireID(), cur.ID)
		}
	}
	if m.Runtime() == "gguf" {
		if _, err := CheckGGUF(filepath.Join(src, m.Files["model"])); err != nil {
			return nil, fmt.Errorf("import %s: %w", src, err)
		}
	}
	tmp, err := os.MkdirTemp(s.dir, ".import-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	m.Sizes = map[string]int64{}
	m.SHA256 = map[string]string{}
	for _, f := range m.FileNames() {
		n, sum, err := copyHashed(filepath.Join(src, f), filepath.Join(tmp, f))
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", src, err)
		}
		m.Sizes[f], m.SHA256[f] = n, sum
	}
	if err := s.commit(tmp, m); err != nil {
		return nil, err
	}
	return m, nil
}

// StagingDir is the folder where a pull of id collects its files. It is
// hidden from the store and survives restarts, so an interrupted pull
// resumes from what it already has.
func (s *Store) StagingDir(id string) string {
	return filepath.Join(s.dir, ".pull-"+folderName(id))
}

// InstallStaged installs a model whose files are complete in dir (a
// StagingDir) with their sizes and digests recorded in m: it writes the
// manifest and renames the folder into place, so the model appears whole
// or not at all.
func (s *Store) InstallStaged(dir string, m *Manifest) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if cur, err := s.Get(m.WireID()); err == nil && cur.ID != m.ID {
		return fmt.Errorf("install %s: wire id %s is already used by %s", m.ID, m.WireID(), cur.ID)
	}
	for _, f := range m.FileNames() {
		if _, ok := m.SHA256[f]; !ok {
			return fmt.Errorf("install %s: no digest recorded for %s", m.ID, f)
		}
	}
	return s.commit(dir, m)
}

// commit writes m into the complete folder tmp and renames it into place,
// replacing an installed model of the same id.
func (s *Store) commit(tmp string, m *Manifest) error {
	if m.Created == 0 {
		m.Created = s.clock().Unix()
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileSync(filepath.Join(tmp, "manifest.json"), out); err != nil {
		return err
	}
	final := filepath.Join(s.dir, folderName(m.ID))
	old := filepath.Join(s.dir, fmt.Sprintf(".old-%s-%d", folderName(m.ID), s.clock().UnixNano()))
	replaced := os.Rename(final, old) == nil
	if err := os.Rename(tmp, final); err != nil {
		if replaced {
			os.Rename(old, final)
		}
		return err
	}
	if replaced {
		os.RemoveAll(old)
	}
	if err := s.Reload(); err != nil {
		return err
	}
	s.log.Info("model installed", "id", m.ID, "wire_id", m.WireID(), "bytes", m.TotalSize())
	return nil
}

// Path returns the path of one file of an installed model, checking that
// the manifest lists it.
func (s *Store) Path(id, file string) (*Manifest, string, error) {
	m, err := s.Get(id)
	if err != nil {
		return nil, "", err
	}
	if _, ok := m.SHA256[file]; !ok {
		return nil, "", fmt.Errorf("model %s has no file %q: %w", m.ID, file, ErrNotFound)
	}
	return m, filepath.Join(s.Dir(m), file), nil
}

// ManifestJSON returns the manifest of an installed model as stored.
func (s *Store) ManifestJSON(id string) ([]byte, error) {
	m, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(s.Dir(m), "manifest.json"))
}

// Remove deletes an installed model's folder.
func (s *Store) Remove(id string) error {
	m, err := s.Get(id)
	if err != nil {
		return err
	}
	gone := filepath.Join(s.dir, ".rm-"+folderName(m.ID))
	if err := os.Rename(s.Dir(m), gone); err != nil {
		return err
	}
	if err := os.RemoveAll(gone); err != nil {
		return err
	}
	return s.Reload()
}

// Verify re-hashes an installed model's files against its manifest.
func (s *Store) Verify(m *Manifest) error {
	for f, want := range m.SHA256 {
		_, got, err := copyHashed(filepath.Join(s.Dir(m), f), "")
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("model %s: %s has sha256 %s, manifest says %s", m.ID, f, got, want)
		}
	}
	return nil
}

// copyHashed copies src to dst (if dst is not empty) and returns the size
// and sha256 of the bytes.
func copyHashed(src, dst string) (int64, string, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, "", err
	}
	defer in.Close()
	h := sha256.New()
	var w io.Writer = h
	var out *os.File
	if dst != "" {
		out, err = os.Create(dst)
		if err != nil {
			return 0, "", err
		}
		defer out.Close()
		w = io.MultiWriter(h, out)
	}
	n, err := io.Copy(w, in)
	if err != nil {
		return 0, "", err
	}
	if out != nil {
		if err := out.Sync(); err != nil {
			return 0, "", err
		}
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

func writeFileSync(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
