// Command chaos runs the infermesh chaos scenarios against real infermesh
// processes in a private network namespace and writes a JSON report, a
// summary and a PNG timeline. It exits non-zero on any checker violation.
//
//	go run ./chaos/cmd/chaos -scenarios all
//	go run ./chaos/cmd/chaos -scenarios all -secure
//	go run ./chaos/cmd/chaos -scenarios short-random-kill -bin bin/infermesh
//	go run ./chaos/cmd/chaos -list
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/infermesh/infermesh/chaos"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scenarios := fs.String("scenarios", "all", "comma-separated scenario names, or all (the full-length ones) or short")
	bin := fs.String("bin", "bin/infermesh", "infermesh binary (make build)")
	out := fs.String("out", "", "output folder (default chaos/out/<time> when ./chaos exists, else a temp folder)")
	defModels, defChat := chaos.DefaultModels()
	models := fs.String("models", strings.Join(defModels, ","), "comma-separated model folders imported into every node")
	model := fs.String("model", "tiny-bert:test-128", "embeddings model id the load sends")
	chat := fs.String("chat-model", defChat, "chat model id for plain and streamed chat requests (empty: no chat)")
	vision := fs.String("vision-image", "", "PNG file: adds background-removal requests (needs the isnet model in -models; ~2.5 s of CPU each)")
	rate := fs.Float64("rate", 20, "requests per second over all nodes")
	seed := fs.Uint64("seed", 0, "random seed (0: random, reported)")
	convergence := fs.Duration("convergence-bound", 30*time.Second, "how long the cluster may take to agree after the last recovery")
	propagation := fs.Duration("propagation-bound", 2*time.Second, "how long an acknowledged key write may take to reach a connected node")
	standalone := fs.Bool("standalone", false, "when the binary has no mesh flags, run on independent nodes anyway (harness development only)")
	disable := fs.String("disable", "", "comma-separated features to treat as missing: mesh, partitions, state-digest, members, keys")
	secure := fs.Bool("secure", false, "TLS on every client port and mutual TLS between nodes, with certificates from a CA made for the run (a cluster secret and keyed clients are always on)")
	keep := fs.Bool("keep-data", false, "keep node data directories of passing scenarios")
	list := fs.Bool("list", false, "list the scenarios and what each needs, then exit")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *list {
		for _, s := range chaos.Catalog() {
			needs := make([]string, len(s.Needs))
			for i, n := range s.Needs {
				needs[i] = string(n)
			}
			fmt.Fprintf(stdout, "%-26s %d nodes, %3.0fs  needs %-34s %s\n", s.Name, s.Nodes, s.Load.Seconds(), strings.Join(needs, ","), s.Title)
		}
		return 0
	}
	scs, err := chaos.Select(*scenarios)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if _, inside := chaos.CurrentNamespace(); !inside {
		if *out == "" {
			*out = defaultOut()
		}
		abs, err := filepath.Abs(*out)
		if err != nil {
			fmt.Fprintln(stderr, "chaos:", err)
			return 2
		}
		if b, err := filepath.Abs(*bin); err == nil {
			*bin = b
		}
		if _, err := os.Stat(*bin); err != nil {
			fmt.Fprintf(stderr, "chaos: binary %s: %v (build it with make build, or pass -bin)\n", *bin, err)
			return 2
		}
		// Re-run this program inside a private network namespace, with
		// every path made absolute.
		child := append(replaceFlag(replaceFlag(args, "out", abs), "bin", *bin), "-out="+abs, "-bin="+*bin)
		return chaos.Outside(ctx, child, abs, stdout, stderr)
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var dis []chaos.Need
	for _, d := range strings.Split(*disable, ",") {
		if d = strings.TrimSpace(d); d != "" {
			dis = append(dis, chaos.Need(d))
		}
	}
	var image []byte
	if *vision != "" {
		if image, err = os.ReadFile(*vision); err != nil {
			fmt.Fprintln(stderr, "chaos:", err)
			return 2
		}
	}
	rep, err := chaos.RunSuite(ctx, chaos.SuiteConfig{VisionImage: image, Bin: *bin, Out: *out, Scenarios: scs, Models: splitList(*models), Model: *model, ChatModel: *chat,
		Standalone: *standalone, Disable: dis, Rate: *rate, Seed: *seed, ConvergenceBound: *convergence,
		PropagationBound: *propagation, Secure: *secure, KeepData: *keep, Summary: stdout, Log: log})
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 2
	}
	if !rep.Pass {
		return 1
	}
	return 0
}

func defaultOut() string {
	stamp := time.Now().Format("20060102-150405")
	if st, err := os.Stat("chaos"); err == nil && st.IsDir() {
		return filepath.Join("chaos", "out", stamp)
	}
	return filepath.Join(os.TempDir(), "infermesh-chaos", stamp)
}

// replaceFlag drops -name/--name (with its value) from args.
func replaceFlag(args []string, name, _ string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-"+name || a == "--"+name:
			i++ // skip the value
		case strings.HasPrefix(a, "-"+name+"=") || strings.HasPrefix(a, "--"+name+"="):
		default:
			out = append(out, a)
		}
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
