package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
)

// nodeURL is the base URL admin subcommands talk to: --node, else
// SERVICE_NODE_URL, else the default client address.
func nodeFlag(f *envFlags) *string {
	u := "http://127.0.0.1:11436"
	f.String(&u, "node", "SERVICE_NODE_URL", u, "base URL of any node of the mesh")
	return &u
}

// getJSON fetches path from a node and decodes the JSON answer into v,
// turning an OpenAI error body into an error.
func getJSON(base, path string, v any) error {
	return adminCall(base, http.MethodGet, path, nil, v)
}

// membersCmd prints the mesh as one node sees it.
func membersCmd(args []string, stdout, stderr io.Writer) int {
	f := newEnvFlags("members")
	f.fs.SetOutput(stderr)
	base := nodeFlag(f)
	format := formatFlag(f)
	if err := f.Parse(args); err != nil {
		if code := parseExit(err); code != 0 {
			fmt.Fprintf(stderr, "infermesh members: %v\n", err)
			return code
		}
		return 0
	}
	if err := checkFormat(*format); err != nil {
		fmt.Fprintf(stderr, "infermesh members: %v\n", err)
		return 2
	}
	if *format == "json" {
		var raw any
		if err := getJSON(*base, "/v1/server/members", &raw); err != nil {
			fmt.Fprintf(stderr, "infermesh members: %v\n", err)
			return 1
		}
		printJSON(stdout, raw)
		return 0
	}
	var out struct {
		Data []struct {
			ID       string   `json:"id"`
			HTTPAddr string   `json:"http_addr"`
			State    string   `json:"state"`
			Self     bool     `json:"self"`
			Ejected  bool     `json:"ejected"`
			InFlight int      `json:"inflight"`
			Cap      int      `json:"cap"`
			Canary   bool     `json:"canary"`
			Warm     []string `json:"warm"`
		} `json:"data"`
	}
	if err := getJSON(*base, "/v1/server/members", &out); err != nil {
		fmt.Fprintf(stderr, "infermesh members: %v\n", err)
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tSTATE\tIN FLIGHT\tWARM MODELS")
	for _, m := range out.Data {
		id, state := m.ID, m.State
		if m.Self {
			id += " (this)"
		}
		if m.Ejected {
			state += ",ejected"
		}
		if m.Canary {
			state += ",canary"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\n", id, m.HTTPAddr, state, m.InFlight, m.Cap, strings.Join(m.Warm, " "))
	}
	tw.Flush()
	return 0
}
