package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// slugOf is the anchor a Markdown renderer gives a heading: lower case,
// letters, digits, hyphens and underscores kept, spaces as hyphens,
// everything else dropped.
func slugOf(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchorsOf lists the heading anchors of a Markdown file (outside code
// blocks).
func anchorsOf(text string) map[string]bool {
	out := map[string]bool{}
	inCode := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
			continue
		}
		if m := mdHeading.FindStringSubmatch(l); m != nil && !inCode {
			out[slugOf(m[1])] = true
		}
	}
	return out
}

// TestDocsLinksResolve: every relative link in the README, the guides
// under docs/ and the DESIGN.md files names a file of the repository and,
// with a #fragment, a heading of that file.
func TestDocsLinksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	files := []string{filepath.Join(root, "README.md")}
	for _, pat := range []string{"docs/*.md", "*/DESIGN.md"} {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
			}
			db, err := os.ReadFile(dest)
			if err != nil {
				if st, serr := os.Stat(dest); serr == nil && st.IsDir() {
					checked++
					continue
				}
				t.Errorf("%s: link %q: %v", f, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(string(db))[frag] {
				t.Errorf("%s: link %q: %s has no heading #%s", f, target, dest, frag)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found; the walk is broken")
	}
}
