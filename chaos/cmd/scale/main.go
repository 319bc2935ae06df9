// Command scale starts a mesh of N real infermesh processes on loopback
// (100 by default, the model on a few of them), measures convergence,
// gossip and raft traffic, leader load, memory, routing after SIGKILL and
// quota exactness, and writes report.json and report.md. Every process it
// starts is killed before it exits (also on SIGINT and SIGTERM, and at
// -timeout); node folders are removed unless -keep-data.
//
//	go run ./chaos/cmd/scale -bin bin/infermesh
//	go run ./chaos/cmd/scale -nodes 20 -phases converge,idle -window 10s
//	go run ./chaos/cmd/scale -timers deploy -phases converge,idle
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
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "bin/infermesh", "infermesh binary (make build)")
	out := fs.String("out", "", "output folder (default chaos/out/scale-<time>)")
	nodes := fs.Int("nodes", 100, fmt.Sprintf("processes to start (1..%d)", chaos.MaxNodes))
	modelNodes := fs.Int("model-nodes", 5, "how many nodes hold the model")
	defModels, _ := chaos.DefaultModels()
	models := fs.String("models", defModels[0], "comma-separated model folders imported into the model nodes")
	model := fs.String("model", "tiny-bert:test-128", "embeddings model id the traffic sends")
	timers := fs.String("timers", "fast", "fast (--fast-timers) or deploy (the defaults)")
	phases := fs.String("phases", "converge,idle,traffic,kill,quota", "phases to run, in order")
	window := fs.Duration("window", 30*time.Second, "length of the idle and traffic measurements")
	rate := fs.Int("rate", 50, "requests per second of mixed traffic")
	kills := fs.Int("kills", 2, "model nodes to SIGKILL in the kill phase")
	quota := fs.Int("quota", 1000, "daily quota spent in the quota phase")
	seed := fs.Uint64("seed", 1, "random seed")
	timeout := fs.Duration("timeout", 30*time.Minute, "the whole run's bound")
	keep := fs.Bool("keep-data", false, "keep the nodes' folders (logs, data)")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *timers != "fast" && *timers != "deploy" {
		fmt.Fprintln(stderr, "-timers: fast or deploy")
		return 2
	}
	if *out == "" {
		*out = filepath.Join("chaos", "out", "scale-"+time.Now().UTC().Format("20060102-150405"))
	}
	nodesDir := filepath.Join(*out, "nodes")
	if err := os.MkdirAll(nodesDir, 0o755); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	rep, err := chaos.RunScale(ctx, chaos.ScaleConfig{Bin: absBin, Dir: nodesDir, Nodes: *nodes, ModelNodes: *modelNodes,
		Models: split(*models), Model: *model, Timers: *timers, Phases: split(*phases), Window: *window, Rate: *rate,
		Kills: *kills, QuotaLimit: *quota, Seed: *seed, Log: log})
	code := 0
	if err != nil {
		log.Error("scale run", "err", err)
		code = 1
		if rep != nil {
			rep.Error = err.Error()
		}
	}
	if rep != nil {
		if werr := rep.Write(*out); werr != nil {
			fmt.Fprintln(stderr, werr)
			return 1
		}
		fmt.Fprint(stdout, rep.Markdown())
		fmt.Fprintf(stdout, "\nreport: %s\n", filepath.Join(*out, "report.md"))
	}
	if !*keep && code == 0 {
		_ = os.RemoveAll(nodesDir)
	}
	return code
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
