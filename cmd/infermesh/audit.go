package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/infermesh/infermesh/node/audit"
)

const auditUsage = `Usage:
  infermesh audit export [--since RFC3339|DURATION] [--format jsonl] [--node URL] [--admin-key K]
        write the mesh's signed audit records as JSON Lines to stdout
        (--since 24h: the last day; default: everything kept)
  infermesh audit verify FILE [--keys FILE] [--node URL] [--admin-key K]
        check every record's signature and each node's chain; exits 1
        naming the first bad line. FILE - reads stdin. Without --keys the
        node public keys are fetched from --node.
`

// auditCmd fetches and verifies the signed audit records (node/audit).
func auditCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, auditUsage)
		return 2
	}
	sub := args[0]
	f := newEnvFlags("audit " + sub)
	f.fs.SetOutput(stderr)
	f.fs.Usage = func() { fmt.Fprint(stderr, auditUsage) }
	base := nodeFlag(f)
	adminKey := ""
	f.String(&adminKey, "admin-key", "SERVICE_ADMIN_KEY", "", "admin API key")
	since, format, keysFile := "", "jsonl", ""
	switch sub {
	case "export":
		f.fs.StringVar(&since, "since", "", "records at or after this RFC 3339 time, or this long ago (24h)")
		f.fs.StringVar(&format, "format", "jsonl", "output format: jsonl")
	case "verify":
		f.fs.StringVar(&keysFile, "keys", "", `node public keys: {"keys": {"<node id>": "<base64>"}} (default: fetched from --node)`)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, auditUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "infermesh audit: unknown command %q\n\n%s", sub, auditUsage)
		return 2
	}
	var pos []string
	for rest := args[1:]; len(rest) > 0; {
		if err := f.fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		rest = f.fs.Args()
		if len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	if len(f.errs) > 0 {
		fmt.Fprintf(stderr, "infermesh audit %s: bad environment:\n  %s\n", sub, strings.Join(f.errs, "\n  "))
		return 2
	}
	c := auditClient{base: strings.TrimRight(*base, "/"), key: adminKey}
	if sub == "export" {
		if len(pos) != 0 || format != "jsonl" {
			fmt.Fprintf(stderr, "infermesh audit export: want no arguments and --format jsonl\n\n%s", auditUsage)
			return 2
		}
		from, err := audit.ParseSince(since, time.Now())
		if err != nil {
			fmt.Fprintf(stderr, "infermesh audit export: %v\n", err)
			return 2
		}
		if err := c.export(from, stdout); err != nil {
			fmt.Fprintf(stderr, "infermesh audit export: %v\n", err)
			return 1
		}
		return 0
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "infermesh audit verify: want one FILE\n\n%s", auditUsage)
		return 2
	}
	return auditVerify(c, pos[0], keysFile, stdout, stderr)
}

// auditVerify checks FILE and prints the report or the first bad line.
func auditVerify(c auditClient, file, keysFile string, stdout, stderr io.Writer) int {
	var keys map[string]ed25519.PublicKey
	var err error
	if keysFile != "" {
		var b []byte
		if b, err = os.ReadFile(keysFile); err == nil {
			keys, err = audit.ParseKeys(b)
		}
	} else {
		keys, err = c.keys()
	}
	if err != nil {
		fmt.Fprintf(stderr, "infermesh audit verify: %v\n", err)
		return 1
	}
	in := io.Reader(os.Stdin)
	if file != "-" {
		fh, err := os.Open(file)
		if err != nil {
			fmt.Fprintf(stderr, "infermesh audit verify: %v\n", err)
			return 1
		}
		defer fh.Close()
		in = fh
	}
	rep, err := audit.Verify(in, keys)
	var ve *audit.VerifyError
	if errors.As(err, &ve) {
		fmt.Fprintf(stderr, "infermesh audit verify: %s: FAILED at %v\n(%d records verified before it)\n", file, ve, rep.Records)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "infermesh audit verify: %s: %v\n", file, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: OK, %s\n", file, rep)
	return 0
}

// auditClient calls a node's audit admin routes.
type auditClient struct {
	base, key string
}

// get sends an authenticated GET and returns the response when it is 200.
func (c auditClient) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = time.Minute
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %d %s", path, resp.StatusCode, strings.TrimSpace(audit.ErrorMessage(b)))
	}
	return resp, nil
}

// export streams GET /v1/server/audit?since=... to w; a transfer that
// breaks off is an error, so a short export never passes for a whole one.
func (c auditClient) export(since time.Time, w io.Writer) error {
	path := "/v1/server/audit"
	if !since.IsZero() {
		path += "?since=" + url.QueryEscape(since.UTC().Format(time.RFC3339Nano))
	}
	resp, err := c.get(context.Background(), path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("export broke off: %w", err)
	}
	return nil
}

// keys fetches the node public keys from GET /v1/server/audit/keys.
func (c auditClient) keys() (map[string]ed25519.PublicKey, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.get(ctx, "/v1/server/audit/keys")
	if err != nil {
		return nil, fmt.Errorf("fetching node keys (or pass --keys FILE): %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	return audit.ParseKeys(b)
}
