// Package models owns the on-disk model store of a node: one folder per
// installed model holding its files and a manifest.json that names it,
// describes it and records each file's size and sha256.
package models

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Manifest describes one installed model. It is stored as manifest.json in
// the model's folder.
type Manifest struct {
	// ID is the canonical id <runtime>/<family>/<variant>.
	ID string `json:"id"`
	// Name and Tag form the wire id <name>:<tag>.
	Name string `json:"name"`
	// Tag is the variant part after the colon, e.g. "fp32".
	Tag string `json:"tag"`
	// Task selects the engine pipeline (e.g. "embeddings", "background-removal").
	Task string `json:"task"`
	// Modalities lists what the model does (embeddings, vision, chat, ...).
	Modalities []string `json:"modalities"`
	// Description is a short human-readable summary (from the catalogue).
	Description string `json:"description,omitempty"`
	// License is the licence identifier, e.g. "apache-2.0".
	License string `json:"license,omitempty"`
	// Source is where the model's files come from (the catalogue's
	// source_repository).
	Source string `json:"source,omitempty"`
	// Files maps a role ("model", "tokenizer", ...) to a file in the folder.
	Files map[string]string `json:"files"`
	// Options are pipeline settings passed to the engine as given.
	Options map[string]string `json:"options,omitempty"`
	// Created is when the model was installed, Unix seconds.
	Created int64 `json:"created,omitempty"`
	// Sizes and SHA256 are recorded by the store per file name at install.
	Sizes map[string]int64 `json:"sizes,omitempty"`
	// SHA256 holds each file's hex sha256 digest.
	SHA256 map[string]string `json:"sha256,omitempty"`
	// Card is the registered model card, when the model came with one
	// (a catalogue pull, or a peer that had it).
	Card *Card `json:"card,omitempty"`
}

var (
	idPart    = `[a-z0-9][a-z0-9._-]{0,63}`
	canonical = regexp.MustCompile(`^(` + idPart + `)/(` + idPart + `)/(` + idPart + `)$`)
	wirePart  = regexp.MustCompile(`^` + idPart + `$`)
	fileName  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// Runtimes lists the runtime names a canonical id may start with.
var runtimes = map[string]bool{"onnx": true, "gguf": true, "upstream": true}

// WireID returns the short id <name>:<tag>.
func (m *Manifest) WireID() string { return m.Name + ":" + m.Tag }

// Runtime returns the first segment of the canonical id.
func (m *Manifest) Runtime() string { return strings.SplitN(m.ID, "/", 2)[0] }

// TotalSize sums the recorded file sizes.
func (m *Manifest) TotalSize() int64 {
	var n int64
	for _, s := range m.Sizes {
		n += s
	}
	return n
}

// Validate checks ids, task and file names; it never touches the disk.
func (m *Manifest) Validate() error {
	parts := canonical.FindStringSubmatch(m.ID)
	if parts == nil {
		return fmt.Errorf("manifest: id %q is not <runtime>/<family>/<variant> in lower case", m.ID)
	}
	if !runtimes[parts[1]] {
		return fmt.Errorf("manifest: id %q names unknown runtime %q", m.ID, parts[1])
	}
	if !wirePart.MatchString(m.Name) || !wirePart.MatchString(m.Tag) {
		return fmt.Errorf("manifest: wire id %q is not <name>:<tag> in lower case", m.WireID())
	}
	if m.Task == "" {
		return fmt.Errorf("manifest %s: task is empty", m.ID)
	}
	if len(m.Files) == 0 {
		return fmt.Errorf("manifest %s: no files", m.ID)
	}
	for role, f := range m.Files {
		if !fileName.MatchString(f) || f == "manifest.json" {
			return fmt.Errorf("manifest %s: file %q for %q is not a plain file name", m.ID, f, role)
		}
	}
	return nil
}

// FileNames returns the distinct file names, sorted.
func (m *Manifest) FileNames() []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range m.Files {
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// ParseManifest decodes and validates manifest JSON.
func ParseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// IsCanonicalID reports whether s has the canonical id form.
func IsCanonicalID(s string) bool { return canonical.MatchString(s) }
