package models

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"
)

// Entry is one obtainable model: the spec's catalogue fields, how to
// install it and where its files come from, and its model card.
type Entry struct {
	Listing
	// Install is the manifest recipe written when the model is installed.
	Install Recipe `json:"install"`
	// Files are downloaded into the model's (flat) folder.
	Files []File `json:"files"`
	// Card is the model card served by the provenance endpoint.
	Card *Card `json:"card,omitempty"`
}

// Listing is what the catalogue shows of a model: the spec's descriptive
// catalogue fields (the state fields are added by the node).
type Listing struct {
	// Key is the canonical id used in requests and pulls.
	Key string `json:"key"`
	// DisplayName is the human-readable name, e.g. "all-MiniLM-L6-v2 (fp32)".
	DisplayName string `json:"display_name"`
	// Description is a short summary of the model; it is copied into the
	// manifest.
	Description string `json:"description"`
	// Parameters is the size class as a string, e.g. "22M" or "0.49B".
	Parameters string `json:"parameters"`
	// Quantization names the weights' precision or compression, e.g. "fp32",
	// "q8" or "q4".
	Quantization string `json:"quantization"`
	// DownloadSizeBytes is the approximate size of all files to download, in
	// bytes.
	DownloadSizeBytes int64 `json:"download_size_bytes"`
	// OnDiskSizeBytes is the approximate space the installed model takes, in
	// bytes.
	OnDiskSizeBytes int64 `json:"on_disk_size_bytes"`
	// Modalities lists what the model does (embeddings, chat,
	// background-removal, ...); the manifest takes them unless the install
	// recipe sets its own.
	Modalities []string `json:"modalities"`
	// Tags are free-form labels for search (family, language, pooling, ...).
	Tags []string `json:"tags"`
	// ContextWindowTokens is the longest input accepted, in tokens; 0 for
	// models that take no text (e.g. background removal).
	ContextWindowTokens int `json:"context_window_tokens"`
	// License is the licence identifier, e.g. "apache-2.0"; it is copied into
	// the manifest.
	License string `json:"license"`
	// HomepageURL is the page describing the original model.
	HomepageURL string `json:"homepage_url"`
	// SourceRepository is the repository the files are downloaded from (e.g.
	// the ONNX export's); it becomes the manifest's Source.
	SourceRepository string `json:"source_repository"`
}

// Recipe is the part of a Manifest a catalogue entry fixes in advance.
type Recipe struct {
	// Name is the <name> part of the installed model's wire id <name>:<tag>.
	Name string `json:"name"`
	// Tag is the <tag> part of the wire id, e.g. "fp32".
	Tag string `json:"tag"`
	// Task selects the engine pipeline (embeddings, chat,
	// background-removal, ...).
	Task string `json:"task"`
	// Modalities, when set, replaces the listing's modalities in the
	// manifest.
	Modalities []string `json:"modalities,omitempty"`
	// Files maps a role ("model", "tokenizer", ...) to a file name; every
	// name must be one of the entry's Files.
	Files map[string]string `json:"files"`
	// Options are pipeline settings passed to the engine as given (e.g.
	// "pooling", "max_tokens").
	Options map[string]string `json:"options,omitempty"`
}

// File is one download of an entry.
type File struct {
	// Name is the plain file name inside the model folder.
	Name string `json:"name"`
	// URL is where the outside source serves it (http or https).
	URL string `json:"url"`
	// Size in bytes; 0 when not known in advance.
	Size int64 `json:"size,omitempty"`
	// SHA256 is the hex digest the download must match; empty when the
	// catalogue does not know it (then the digest of the first download is
	// recorded and every later copy, e.g. from a peer, is checked against it).
	SHA256 string `json:"sha256,omitempty"`
}

// Card is a registered model card (provenance).
type Card struct {
	// Publisher names who published the weights (and the export, if another
	// party made it).
	Publisher string `json:"publisher"`
	// Source is the URL of the model's original source.
	Source string `json:"source"`
	// License is the licence identifier the weights are under.
	License string `json:"license"`
	// IntendedUse says what the model is meant for.
	IntendedUse string `json:"intended_use"`
	// KnownLimitations describes where the model is known to fall short.
	KnownLimitations string `json:"known_limitations"`
}

// Validate checks an entry without touching the network or disk.
func (e *Entry) Validate() error {
	if !IsCanonicalID(e.Key) {
		return fmt.Errorf("catalogue entry %q: key is not a canonical id <runtime>/<family>/<variant>", e.Key)
	}
	m := e.Manifest()
	if err := m.Validate(); err != nil {
		return fmt.Errorf("catalogue entry %s: %w", e.Key, err)
	}
	have := map[string]bool{}
	for _, f := range e.Files {
		if !fileName.MatchString(f.Name) || f.Name == "manifest.json" {
			return fmt.Errorf("catalogue entry %s: file %q is not a plain file name", e.Key, f.Name)
		}
		if have[f.Name] {
			return fmt.Errorf("catalogue entry %s: file %q listed twice", e.Key, f.Name)
		}
		have[f.Name] = true
		u, err := url.Parse(f.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("catalogue entry %s: file %s has no http(s) URL", e.Key, f.Name)
		}
		if f.SHA256 != "" && !isHexSHA256(f.SHA256) {
			return fmt.Errorf("catalogue entry %s: file %s sha256 is not 64 hex digits", e.Key, f.Name)
		}
		if f.Size < 0 {
			return fmt.Errorf("catalogue entry %s: file %s has a negative size", e.Key, f.Name)
		}
	}
	for _, f := range m.FileNames() {
		if !have[f] {
			return fmt.Errorf("catalogue entry %s: the install recipe names %q, which is not among its files", e.Key, f)
		}
	}
	return nil
}

// Manifest returns the manifest the entry installs as (without sizes and
// digests, which the store records at install).
func (e *Entry) Manifest() *Manifest {
	mods := e.Install.Modalities
	if len(mods) == 0 {
		mods = e.Modalities
	}
	return &Manifest{
		ID: e.Key, Name: e.Install.Name, Tag: e.Install.Tag, Task: e.Install.Task,
		Modalities: mods, Description: e.Description, License: e.License, Source: e.SourceRepository,
		Files: e.Install.Files, Options: e.Install.Options, Card: e.Card,
	}
}

func isHexSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

//go:embed catalog.json
var builtinCatalog []byte

// BuiltinSource names the catalogue compiled into the binary.
const BuiltinSource = "builtin"

// Limits on operator catalogue sources.
const (
	maxSourceBytes   = 8 << 20
	maxSourceEntries = 10000
)

// catalogFile is the format of every source: the built-in one and the
// files or URLs operators add.
type catalogFile struct {
	Entries []Entry `json:"entries"`
	// Cards registers model cards by canonical id for models that are
	// installed by other means than a pull (e.g. the models `make assets`
	// prepares), so the provenance endpoint answers for them too.
	Cards map[string]Card `json:"cards,omitempty"`
}

// SourceStatus reports how one source loaded.
type SourceStatus struct {
	// Source is the file path or http(s) URL, or BuiltinSource.
	Source string `json:"source"`
	// Entries is the number of entries the source supplied; 0 when it failed.
	Entries int `json:"entries"`
	// Error says why the source failed to load (it is then skipped); empty
	// when it loaded.
	Error string `json:"error,omitempty"`
}

// Change is what a refresh changed.
type Change struct {
	// Added lists the keys the previous load did not have, sorted; never nil.
	Added []string `json:"added"`
	// Removed lists the keys no source lists any more, sorted; never nil.
	Removed []string `json:"removed"`
	// Changed lists the keys whose entry differs from before, sorted; never
	// nil.
	Changed []string `json:"changed"`
	// Entries is the number of entries now, over all sources.
	Entries int `json:"entries"`
	// Sources reports how each source loaded, the built-in one first.
	Sources []SourceStatus `json:"sources"`
}

// Catalog holds the entries of every source. Later sources override
// earlier ones key by key; the built-in source comes first.
type Catalog struct {
	sources []string
	client  *http.Client

	mu      sync.RWMutex
	entries map[string]*Entry
	cards   map[string]Card
	status  []SourceStatus
}

// NewCatalog builds a catalogue from the built-in source plus sources (file
// paths or http(s) URLs) and loads it. A source that fails to load is
// reported in Status and skipped; the built-in source always loads.
func NewCatalog(ctx context.Context, sources []string) (*Catalog, error) {
	c := &Catalog{sources: sources, client: &http.Client{Timeout: 30 * time.Second}}
	if _, err := c.Refresh(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Refresh reloads every source and reports what changed. It fails only
// when the built-in catalogue is invalid.
func (c *Catalog) Refresh(ctx context.Context) (Change, error) {
	entries := map[string]*Entry{}
	cards := map[string]Card{}
	var status []SourceStatus
	builtin, err := parseCatalog(builtinCatalog)
	if err != nil {
		return Change{}, fmt.Errorf("built-in catalogue: %w", err)
	}
	builtinCards, err := parseCards(builtinCatalog)
	if err != nil {
		return Change{}, fmt.Errorf("built-in catalogue: %w", err)
	}
	add := func(src string, list []Entry, cs map[string]Card) {
		for i := range list {
			entries[list[i].Key] = &list[i]
		}
		for k, v := range cs {
			cards[k] = v
		}
		status = append(status, SourceStatus{Source: src, Entries: len(list)})
	}
	add(BuiltinSource, builtin, builtinCards)
	for _, src := range c.sources {
		b, err := c.read(ctx, src)
		if err == nil {
			var list []Entry
			var cs map[string]Card
			if list, err = parseCatalog(b); err == nil {
				if cs, err = parseCards(b); err == nil {
					add(src, list, cs)
					continue
				}
			}
		}
		status = append(status, SourceStatus{Source: src, Error: err.Error()})
	}
	c.mu.Lock()
	old := c.entries
	c.entries, c.cards, c.status = entries, cards, status
	c.mu.Unlock()
	ch := Change{Added: []string{}, Removed: []string{}, Changed: []string{}, Entries: len(entries), Sources: status}
	for k, e := range entries {
		if o, ok := old[k]; !ok {
			ch.Added = append(ch.Added, k)
		} else if !reflect.DeepEqual(o, e) {
			ch.Changed = append(ch.Changed, k)
		}
	}
	for k := range old {
		if _, ok := entries[k]; !ok {
			ch.Removed = append(ch.Removed, k)
		}
	}
	sort.Strings(ch.Added)
	sort.Strings(ch.Removed)
	sort.Strings(ch.Changed)
	return ch, nil
}

func (c *Catalog) read(ctx context.Context, src string) ([]byte, error) {
	if !strings.HasPrefix(src, "http://") && !strings.HasPrefix(src, "https://") {
		f, err := os.Open(src)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return readLimited(f)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", src, resp.Status)
	}
	return readLimited(resp.Body)
}

func readLimited(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxSourceBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSourceBytes {
		return nil, fmt.Errorf("catalogue source larger than %d bytes", maxSourceBytes)
	}
	return b, nil
}

func parseCatalog(b []byte) ([]Entry, error) {
	var f catalogFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	if len(f.Entries) > maxSourceEntries {
		return nil, fmt.Errorf("more than %d entries", maxSourceEntries)
	}
	seen := map[string]bool{}
	var errs []error
	for i := range f.Entries {
		if err := f.Entries[i].Validate(); err != nil {
			errs = append(errs, err)
		}
		if seen[f.Entries[i].Key] {
			errs = append(errs, fmt.Errorf("key %s listed twice", f.Entries[i].Key))
		}
		seen[f.Entries[i].Key] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return f.Entries, nil
}

// parseCards reads a source's registered cards; keys must be canonical
// ids and every card needs a publisher, source and licence.
func parseCards(b []byte) (map[string]Card, error) {
	var f catalogFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	for k, c := range f.Cards {
		if !IsCanonicalID(k) {
			return nil, fmt.Errorf("card %q: not a canonical id <runtime>/<family>/<variant>", k)
		}
		if c.Publisher == "" || c.Source == "" || c.License == "" {
			return nil, fmt.Errorf("card %s: publisher, source and license are required", k)
		}
	}
	return f.Cards, nil
}

// Card returns the model card registered for a canonical id: the
// catalogue entry's, else one of the sources' registered cards.
func (c *Catalog) Card(key string) (Card, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e, ok := c.entries[key]; ok && e.Card != nil {
		return *e.Card, true
	}
	card, ok := c.cards[key]
	return card, ok
}

// Entries returns every entry, sorted by key.
func (c *Catalog) Entries() []Entry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Entry, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Get returns the entry for a canonical key, or for a wire id
// <name>:<tag> of its install recipe.
func (c *Catalog) Get(key string) (Entry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e, ok := c.entries[key]; ok {
		return *e, true
	}
	for _, e := range c.entries {
		if e.Install.Name+":"+e.Install.Tag == key {
			return *e, true
		}
	}
	return Entry{}, false
}

// Status reports how each source loaded at the last refresh.
func (c *Catalog) Status() []SourceStatus {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return append([]SourceStatus(nil), c.status...)
}
