package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
)

// formatFlag adds --format text|json (SERVICE_OUTPUT_FORMAT) to a read
// command.
func formatFlag(f *envFlags) *string {
	v := "text"
	f.String(&v, "format", "SERVICE_OUTPUT_FORMAT", v, "output: text (tables) or json (the API's JSON, indented)")
	return &v
}

// checkFormat refuses a --format other than text or json.
func checkFormat(v string) error {
	if v != "text" && v != "json" {
		return fmt.Errorf("--format %q: want text or json", v)
	}
	return nil
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Fprintln(w, string(b))
}

// parseExit is the exit code of a failed flag parse: 0 after -h/--help
// (the flag package printed the usage), 2 for a bad flag.
func parseExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// parseInterleaved parses flags that may come before, between or after
// the positional arguments, and returns the positional ones.
func parseInterleaved(f *envFlags, args []string) ([]string, error) {
	var pos []string
	for rest := args; len(rest) > 0; {
		if err := f.fs.Parse(rest); err != nil {
			return nil, err
		}
		rest = f.fs.Args()
		if len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	return pos, nil
}
