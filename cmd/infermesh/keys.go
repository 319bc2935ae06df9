package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/infermesh/infermesh/node/api"
)

// keysCmd manages API keys through any node's admin API. The admin key is
// taken from SERVICE_ADMIN_KEY (a loopback-only node accepts its own
// computer's callers without one).
func keysCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	sub := args[0]
	switch sub {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "create", "list", "revoke":
	default:
		fmt.Fprintf(stderr, "infermesh keys: unknown command %q\n\n%s", sub, usage)
		return 2
	}
	f := newEnvFlags("keys " + sub)
	f.fs.SetOutput(stderr)
	base := nodeFlag(f)
	format := formatFlag(f)
	var req api.KeyRequest // the body of POST /v1/server/keys
	if sub == "create" {
		f.fs.StringVar(&req.Name, "name", "", "key name (required)")
		f.fs.StringVar(&req.App, "app", "", "application the key belongs to")
		f.fs.BoolVar(&req.Admin, "admin", false, "may use the admin API")
		f.fs.Func("allow", "endpoint allowlist, comma-separated (chat, embeddings, images, audio, vision, models, pull, usage)", func(s string) error {
			req.Allow = append(req.Allow, splitList(s)...)
			return nil
		})
		f.fs.Int64Var(&req.RPM, "rpm", 0, "requests per minute (0: unlimited)")
		f.fs.Int64Var(&req.DailyQuota, "daily-quota", 0, "counted requests per UTC day (0: unlimited)")
		f.fs.Float64Var(&req.MonthlyBudget, "monthly-budget", 0, "estimated cost per month (0: unlimited)")
		f.fs.Func("expires", "when the key stops working: a duration from now (720h) or an RFC 3339 time (default: never)", func(s string) error {
			at, err := parseExpiry(s, time.Now())
			if err != nil {
				return err
			}
			req.ExpiresAt = &at
			return nil
		})
	}
	rest := args[1:]
	var pos []string
	for len(rest) > 0 {
		if err := f.fs.Parse(rest); err != nil {
			return parseExit(err)
		}
		rest = f.fs.Args()
		if len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	if err := checkFormat(*format); err != nil {
		fmt.Fprintf(stderr, "infermesh keys %s: %v\n", sub, err)
		return 2
	}
	var err error
	switch {
	case *format == "json" && (sub == "create" && len(pos) == 0 || sub == "list" && len(pos) == 0):
		var out any
		if sub == "create" {
			err = adminCall(*base, http.MethodPost, "/v1/server/keys", req, &out)
		} else {
			err = adminCall(*base, http.MethodGet, "/v1/server/keys", nil, &out)
		}
		if err == nil {
			printJSON(stdout, out)
		}
	case sub == "create" && len(pos) == 0:
		var out map[string]any
		if err = adminCall(*base, http.MethodPost, "/v1/server/keys", req, &out); err == nil {
			fmt.Fprintf(stdout, "created %v (%v)\nkey: %v\nThe key is shown only now; store it safely.\n", out["id"], out["name"], out["key"])
		}
	case sub == "list" && len(pos) == 0:
		var out struct {
			Data []struct {
				ID, Name, App  string
				Admin, Revoked bool
				Allow          []string
				ExpiresAt      *int64 `json:"expires_at"`
			} `json:"data"`
		}
		if err = adminCall(*base, http.MethodGet, "/v1/server/keys", nil, &out); err == nil {
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tAPP\tADMIN\tALLOW\tEXPIRES\tREVOKED")
			for _, k := range out.Data {
				expires := "never"
				if k.ExpiresAt != nil {
					expires = time.Unix(*k.ExpiresAt, 0).UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\t%v\n", k.ID, k.Name, k.App, k.Admin, strings.Join(k.Allow, ","), expires, k.Revoked)
			}
			tw.Flush()
		}
	case sub == "revoke" && len(pos) == 1:
		if err = adminCall(*base, http.MethodDelete, "/v1/server/keys/"+pos[0], nil, nil); err == nil {
			fmt.Fprintf(stdout, "revoked %s\n", pos[0])
		}
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "infermesh keys %s: %v\n", sub, err)
		return 1
	}
	return 0
}

// adminCall sends a JSON request with SERVICE_ADMIN_KEY and decodes the answer.
func adminCall(base, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, strings.TrimRight(base, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if k := os.Getenv("SERVICE_ADMIN_KEY"); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		json.Unmarshal(b, &e)
		return fmt.Errorf("%d %s", resp.StatusCode, e.Error.Message)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// policyCmd reads or replaces the replicated pool policy.
func policyCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	f := newEnvFlags("policy " + args[0])
	f.fs.SetOutput(stderr)
	base := nodeFlag(f)
	// The policy is a JSON document: text and json print it the same way.
	format := formatFlag(f)
	pos, err := parseInterleaved(f, args[1:])
	if err != nil {
		return parseExit(err)
	}
	if err := checkFormat(*format); err != nil {
		fmt.Fprintf(stderr, "infermesh policy: %v\n", err)
		return 2
	}
	var out any
	switch {
	case args[0] == "get" && len(pos) == 0:
		err = adminCall(*base, http.MethodGet, "/v1/server/policy", nil, &out)
	case args[0] == "set" && len(pos) == 1:
		var doc any
		b, rerr := os.ReadFile(pos[0])
		if rerr == nil {
			rerr = json.Unmarshal(b, &doc)
		}
		if rerr != nil {
			fmt.Fprintf(stderr, "infermesh policy set: %v\n", rerr)
			return 1
		}
		err = adminCall(*base, http.MethodPut, "/v1/server/policy", doc, &out)
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "infermesh policy: %v\n", err)
		return 1
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	fmt.Fprintln(stdout, string(b))
	return 0
}

// parseExpiry reads --expires: a positive duration from now or an RFC 3339
// time, as Unix seconds.
func parseExpiry(s string, now time.Time) (int64, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return 0, fmt.Errorf("--expires %q: want a positive duration", s)
		}
		return now.Add(d).Unix(), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return 0, fmt.Errorf("--expires %q: want a duration (720h) or an RFC 3339 time (2027-01-31T00:00:00Z)", s)
	}
	return t.Unix(), nil
}
