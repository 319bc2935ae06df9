package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// The progress line never takes more than width-1 columns, keeps the
// percentage as long as there is room for it, shows the phase when the
// terminal is wide enough, and fills the bar in proportion.
func TestProgressLineFitsTheWidth(t *testing.T) {
	phases := []string{"", "verifying", "downloading model.onnx from http://files.example.invalid:8080/a/very/long/path/model.onnx"}
	sizes := [][2]int64{{0, 0}, {512, 1 << 10}, {3 << 30, 7 << 30}, {1 << 62, 1 << 62}}
	for width := 0; width <= 220; width++ {
		for _, ph := range phases {
			for _, sz := range sizes {
				line := progressLine(width, ph, sz[0], sz[1], 123456789, 99999)
				if n := utf8.RuneCountInString(line); n > max(width-1, 0) {
					t.Fatalf("width %d: %d columns: %q", width, n, line)
				}
				if width >= 6 && !strings.Contains(line, "%") {
					t.Fatalf("width %d: no percentage: %q", width, line)
				}
			}
		}
	}
	wide := progressLine(120, "verifying", 1<<20, 2<<20, 1<<20, 1)
	if !strings.HasPrefix(wide, "[") || !strings.Contains(wide, "verifying") || !strings.Contains(wide, " 50%") {
		t.Fatalf("120 columns: %q", wide)
	}
	bar := wide[1:strings.Index(wide, "]")]
	if len(bar) != 40 || strings.Count(bar, "#") != 20 {
		t.Fatalf("a 50%% bar of 40 cells: %q", bar)
	}
	// Narrower: the phase goes before the bar shrinks below 10 cells.
	narrow := progressLine(40, "verifying", 1<<20, 2<<20, 1<<20, 1)
	if strings.Contains(narrow, "verifying") || !strings.HasPrefix(narrow, "[") {
		t.Fatalf("40 columns: %q", narrow)
	}
	if got := progressLine(5, "x", 1, 2, 0, 0); got != " 50%" {
		t.Fatalf("5 columns: %q", got)
	}
	t.Logf("80 columns: %s", progressLine(80, "downloading model.onnx from peer a", 3<<20, 7<<20, 1<<20, 4))
	t.Logf("50 columns: %s", progressLine(50, "downloading model.onnx from peer a", 3<<20, 7<<20, 1<<20, 4))
	t.Logf("25 columns: %s", progressLine(25, "downloading model.onnx from peer a", 3<<20, 7<<20, 1<<20, 4))
}

// openPTY opens a pseudo-terminal pair and sets its window size.
func openPTY(t *testing.T, cols, rows uint16) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := unix.IoctlSetWinsize(int(m.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows}); err != nil {
		t.Fatal(err)
	}
	return m, s
}

// The width comes from the terminal itself (a real pseudo-terminal here),
// follows a resize, and falls back to $COLUMNS and then 80 for anything
// that is not a terminal.
func TestTermWidth(t *testing.T) {
	noEnv := func(string) string { return "" }
	m, s := openPTY(t, 57, 20)
	if got := termWidth(s, func(string) string { return "200" }); got != 57 {
		t.Fatalf("pty of 57 columns: %d", got)
	}
	if err := unix.IoctlSetWinsize(int(m.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: 133, Row: 20}); err != nil {
		t.Fatal(err)
	}
	if got := termWidth(s, noEnv); got != 133 {
		t.Fatalf("after the resize to 133: %d", got)
	}
	if !isTerminal(s) {
		t.Fatal("the pty is not a terminal to isTerminal")
	}
	var buf bytes.Buffer
	if got := termWidth(&buf, func(k string) string { return map[string]string{"COLUMNS": " 72 "}[k] }); got != 72 {
		t.Fatalf("COLUMNS=72: %d", got)
	}
	if got := termWidth(&buf, func(string) string { return "wide" }); got != 80 {
		t.Fatalf("COLUMNS=wide: %d", got)
	}
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	if got := termWidth(w, noEnv); got != 80 {
		t.Fatalf("a pipe: %d", got)
	}

	// The bar drawn on the terminal is redrawn in place at its width.
	bar := newProgressBar(s, true)
	bar.width = func() int { return termWidth(s, noEnv) }
	data, _ := json.Marshal(map[string]any{"phase": "downloading model.onnx from a peer with a long name", "completed": 10, "total": 40, "bps": 5, "eta_seconds": 6})
	var out bytes.Buffer
	bar.w = &out
	for _, cols := range []uint16{133, 30} {
		unix.IoctlSetWinsize(int(m.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: 20})
		out.Reset()
		bar.event(pullEvent{Name: "progress", Data: data})
		line, ok := strings.CutPrefix(out.String(), "\r\033[K")
		if !ok || len(line) > int(cols)-1 || !strings.Contains(line, " 25%") {
			t.Fatalf("%d columns: %q", cols, out.String())
		}
	}
}
