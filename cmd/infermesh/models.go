package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/infermesh/infermesh/node"
	"github.com/infermesh/infermesh/node/engine/llama"
	"github.com/infermesh/infermesh/node/models"
)

// modelsCmd manages the model store of a data directory directly. Run it
// while the node is stopped, or restart the node afterwards.
func modelsCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "import", "list", "rm", "quantize":
	default:
		fmt.Fprintf(stderr, "infermesh models: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	cfg := node.Defaults()
	f := newEnvFlags("models " + args[0])
	f.String(&cfg.DataDir, "data-dir", "SERVICE_DATA_DIR", cfg.DataDir, "data directory (models, state)")
	f.String(&cfg.LlamaDir, "llama-dir", "SERVICE_LLAMA_DIR", cfg.LlamaDir, "folder of llama.cpp's shared libraries (quantize)")
	base := nodeFlag(f)
	format := formatFlag(f)
	f.fs.SetOutput(stderr)
	sub, rest := args[0], args[1:]
	var pos []string
	// Positional arguments may come before or after flags.
	for len(rest) > 0 {
		if err := f.fs.Parse(rest); err != nil {
			return parseExit(err)
		}
		rest = f.fs.Args()
		if len(rest) > 0 {
			pos = append(pos, rest[0])
			rest = rest[1:]
		}
	}
	if err := checkFormat(*format); err != nil {
		fmt.Fprintf(stderr, "infermesh models %s: %v\n", sub, err)
		return 2
	}
	if len(f.errs) > 0 {
		fmt.Fprintf(stderr, "infermesh models %s: bad environment:\n  %s\n", sub, strings.Join(f.errs, "\n  "))
		return 2
	}
	if sub == "quantize" {
		if len(pos) != 3 {
			fmt.Fprintf(stderr, "infermesh models quantize: want SRC.gguf DST.gguf TYPE\n\n%s", usage)
			return 2
		}
		return quantizeGGUF(cfg.LlamaDir, pos[0], pos[1], pos[2], stdout, stderr)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	store, err := models.Open(filepath.Join(cfg.DataDir, "models"), log, time.Now)
	if err != nil {
		fmt.Fprintf(stderr, "infermesh models: %v\n", err)
		return 1
	}
	switch {
	case sub == "import" && len(pos) >= 1:
		for _, dir := range pos {
			m, err := store.Import(dir)
			if err != nil {
				fmt.Fprintf(stderr, "infermesh models import: %v\n", err)
				return 1
			}
			fmt.Fprintf(stdout, "installed %s (%s), %d bytes\n", m.ID, m.WireID(), m.TotalSize())
		}
		return 0
	case sub == "list" && len(pos) == 0 && *format == "json":
		out := []map[string]any{}
		for _, m := range store.List() {
			out = append(out, map[string]any{"id": m.ID, "wire_id": m.WireID(), "task": m.Task, "size_bytes": m.TotalSize()})
		}
		printJSON(stdout, map[string]any{"object": "list", "data": out})
		return 0
	case sub == "list" && len(pos) == 0:
		for _, m := range store.List() {
			fmt.Fprintf(stdout, "%-40s %-24s %-20s %d\n", m.ID, m.WireID(), m.Task, m.TotalSize())
		}
		return 0
	case sub == "rm" && len(pos) == 1:
		// A node running here unloads and uninstalls it (and tells the
		// mesh); with no node answering, the folder is removed directly.
		err := adminCall(*base, http.MethodDelete, "/v1/server/models/"+pos[0], nil, nil)
		if err == nil {
			fmt.Fprintf(stdout, "removed %s (through %s)\n", pos[0], *base)
			return 0
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			fmt.Fprintf(stderr, "infermesh models rm: %s: %v\n", pos[0], err)
			return 1
		}
		if err := store.Remove(pos[0]); err != nil {
			fmt.Fprintf(stderr, "infermesh models rm: %s: %v\n", pos[0], err)
			return 1
		}
		fmt.Fprintf(stdout, "removed %s\n", pos[0])
		return 0
	}
	fmt.Fprint(stderr, usage)
	return 2
}

// quantizeGGUF writes src quantised to typ (q8_0, q4_0, q4_k_m, ...) into
// dst with llama.cpp's llama_model_quantize, from the libraries in dir.
func quantizeGGUF(dir, src, dst, typ string, stdout, stderr io.Writer) int {
	ftype, ok := llama.FileTypes()[strings.ToLower(typ)]
	if !ok {
		fmt.Fprintf(stderr, "infermesh models quantize: unknown type %q (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_m, q4_k_s, q5_k_m, q6_k, f16)\n", typ)
		return 2
	}
	if _, err := models.CheckGGUF(src); err != nil {
		fmt.Fprintf(stderr, "infermesh models quantize: %v\n", err)
		return 1
	}
	lib, err := llama.Open(dir)
	if err != nil {
		fmt.Fprintf(stderr, "infermesh models quantize: %v\n", err)
		return 1
	}
	defer lib.Close()
	if err := lib.Quantize(src, dst, ftype, runtime.NumCPU()); err != nil {
		fmt.Fprintf(stderr, "infermesh models quantize: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (%s)\n", dst, strings.ToLower(typ))
	return 0
}
