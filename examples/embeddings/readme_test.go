package main

import (
	"os"
	"strings"
	"testing"
)

// The README's Go SDK example is this program, byte for byte (the test
// builds it, so it compiles).
func TestREADMEQuotesThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	block := "```go\n" + string(src) + "```\n"
	if !strings.Contains(string(readme), block) {
		t.Fatal("README.md does not quote examples/embeddings/main.go in a ```go block; copy the file into it")
	}
}
