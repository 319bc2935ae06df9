package models

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/infermesh/infermesh/node/engine/gguf"
)

// fileTypes names GGUF general.file_type values (llama_ftype) as tags.
func fileTypeTag(ft int64) string {
	switch ft {
	case 0:
		return "f32"
	case 1:
		return "f16"
	case 2:
		return "q4_0"
	case 3:
		return "q4_1"
	case 7:
		return "q8_0"
	case 8:
		return "q5_0"
	case 9:
		return "q5_1"
	case 10:
		return "q2_k"
	case 11:
		return "q3_k_s"
	case 12:
		return "q3_k_m"
	case 13:
		return "q3_k_l"
	case 14:
		return "q4_k_s"
	case 15:
		return "q4_k_m"
	case 16:
		return "q5_k_s"
	case 17:
		return "q5_k_m"
	case 18:
		return "q6_k"
	case 32:
		return "bf16"
	}
	return "gguf"
}

// embeddingArch reports whether a GGUF architecture is an encoder served
// as an embeddings model.
func embeddingArch(a string) bool {
	return a == "bert" || a == "nomic-bert" || a == "jina-bert-v2"
}

// CheckGGUF reads the header of the GGUF file at path and refuses files a
// node cannot serve: not GGUF, truncated, absurd counts or sizes, an
// unsupported architecture, or (for chat) a tokenizer the engine cannot
// build. The error says which.
func CheckGGUF(path string) (*gguf.File, error) {
	f, err := gguf.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := f.Check(); err != nil {
		return nil, err
	}
	if !embeddingArch(f.Architecture()) {
		if _, _, err := f.Tokenizer(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

var nameChars = regexp.MustCompile(`[^a-z0-9._-]+`)

// manifestFromGGUF makes the manifest of a bare .gguf file: id
// gguf/<name>/<file type>, the name from general.name (else the file's
// name), task chat (embeddings for encoder architectures).
func manifestFromGGUF(path string, f *gguf.File) (*Manifest, error) {
	base := filepath.Base(path)
	name := f.String("general.name")
	if name == "" {
		name = strings.TrimSuffix(base, filepath.Ext(base))
	}
	name = strings.Trim(nameChars.ReplaceAllString(strings.ToLower(name), "-"), "-._")
	if len(name) > 64 {
		name = name[:64]
	}
	if name == "" {
		name = "model"
	}
	tag := "gguf"
	if ft, ok := f.Int("general.file_type"); ok {
		tag = fileTypeTag(ft)
	}
	task, modal := "chat", "text"
	if embeddingArch(f.Architecture()) {
		task, modal = "embeddings", "embeddings"
	}
	file := base
	if !fileName.MatchString(file) {
		file = "model.gguf"
	}
	m := &Manifest{ID: "gguf/" + name + "/" + tag, Name: name, Tag: tag, Task: task, Modalities: []string{modal},
		Description: fmt.Sprintf("%s (%s, GGUF %s)", f.String("general.name"), f.Architecture(), tag),
		License:     f.String("general.license"), Source: "imported from " + base,
		Files: map[string]string{"model": file}}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// importGGUF installs a bare .gguf file under a manifest made from its
// metadata; the file is checked first.
func (s *Store) importGGUF(src string) (*Manifest, error) {
	f, err := CheckGGUF(src)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", src, err)
	}
	m, err := manifestFromGGUF(src, f)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", src, err)
	}
	if cur, err := s.Get(m.WireID()); err == nil && cur.ID != m.ID {
		return nil, fmt.Errorf("import %s: wire id %s is already used by %s", src, m.WireID(), cur.ID)
	}
	tmp, err := os.MkdirTemp(s.dir, ".import-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	n, sum, err := copyHashed(src, filepath.Join(tmp, m.Files["model"]))
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", src, err)
	}
	m.Sizes = map[string]int64{m.Files["model"]: n}
	m.SHA256 = map[string]string{m.Files["model"]: sum}
	if err := s.commit(tmp, m); err != nil {
		return nil, err
	}
	return m, nil
}
