package main

import (
	"fmt"
	"io"
	"net/url"
	"text/tabwriter"

	"github.com/infermesh/infermesh/node/api"
)

// usageCmd prints the replicated usage totals grouped by app, model, key
// or worker (GET /v1/server/usage; admin key from SERVICE_ADMIN_KEY).
func usageCmd(args []string, stdout, stderr io.Writer) int {
	f := newEnvFlags("usage")
	f.fs.SetOutput(stderr)
	base := nodeFlag(f)
	format := formatFlag(f)
	by := f.fs.String("by", "model", "group by app, model, key or worker")
	since := f.fs.String("since", "", "first UTC day counted, YYYY-MM-DD (default: all)")
	until := f.fs.String("until", "", "last UTC day counted, YYYY-MM-DD (default: today)")
	if err := f.Parse(args); err != nil {
		if code := parseExit(err); code != 0 {
			fmt.Fprintf(stderr, "infermesh usage: %v\n", err)
			return code
		}
		return 0
	}
	if err := checkFormat(*format); err != nil {
		fmt.Fprintf(stderr, "infermesh usage: %v\n", err)
		return 2
	}
	q := url.Values{"by": {*by}}
	if *since != "" {
		q.Set("since", *since)
	}
	if *until != "" {
		q.Set("until", *until)
	}
	var out struct {
		Object string         `json:"object"`
		By     string         `json:"by"`
		Since  string         `json:"since,omitempty"`
		Until  string         `json:"until,omitempty"`
		Data   []api.UsageRow `json:"data"`
	}
	if err := getJSON(*base, "/v1/server/usage?"+q.Encode(), &out); err != nil {
		fmt.Fprintf(stderr, "infermesh usage: %v\n", err)
		return 1
	}
	if *format == "json" {
		printJSON(stdout, out)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tREQUESTS\tPROMPT TOKENS\tCOMPLETION TOKENS\tCOST\tERRORS\t\n", map[string]string{"app": "APP", "model": "MODEL", "key": "KEY", "worker": "WORKER"}[*by])
	for _, r := range out.Data {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.6f\t%d\t\n", r.Group, r.Requests, r.PromptTokens, r.CompletionTokens, r.EstimatedCost, r.Errors)
	}
	tw.Flush()
	return 0
}
