package main

import (
	"os"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node"
)

// TestEveryServeFlagIsInTheREADME: the configuration reference
// (docs/configuration.md, linked from the README) names every flag of
// `infermesh serve` with its SERVICE_* variable.
func TestEveryServeFlagIsInTheREADME(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	cfg := node.Defaults()
	var level string
	f := serveFlags(&cfg, &level)
	for _, r := range f.rows {
		if !strings.Contains(readme, "| `--"+r[0]+"` | `"+r[1]+"` |") {
			t.Errorf("docs/configuration.md has no row for --%s (%s)", r[0], r[1])
		}
	}
}
