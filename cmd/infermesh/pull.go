package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pullHelp documents `infermesh pull`, including what Ctrl-C does.
const pullHelp = `usage: infermesh pull [--node URL] [--to NODE_ID] MODEL_KEY

Pulls a model through any node (from a peer that has it, else from the
catalogue's source) and draws the progress the node streams; the bar fits
the terminal's width. --to names the node that installs it (default: the
node --node points at).

Ctrl-C stops following, not the download: the node keeps downloading and
installs the model whether or not anyone is waiting (another client asking
for the same model shares the same download). Run the same command again to
follow it from where it is. A download stops only when it fails, stalls
past the node's --pull-stall-timeout on every source, or the node shuts
down (what it fetched stays staged, and the next pull resumes it).

Exit status: 0 installed, 1 the pull failed or the node could not be
reached, 2 bad usage, 130 interrupted (the download goes on).

Flags:
`

// pullCmd pulls a model through any node and draws the progress the node
// streams. --to names the node that installs it (default: the node asked).
// SIGINT (Ctrl-C) or SIGTERM stops following; the node's download goes on.
func pullCmd(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return pullRun(ctx, args, stdout, stderr)
}

// pullRun is pullCmd with the cancellation given.
func pullRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newEnvFlags("pull")
	f.fs.SetOutput(stderr)
	f.fs.Usage = func() {
		fmt.Fprint(f.fs.Output(), pullHelp)
		f.fs.PrintDefaults()
	}
	base := nodeFlag(f)
	target := ""
	f.fs.StringVar(&target, "to", "", "node id that installs the model (default: the node --node points at)")
	var pos []string
	rest := args
	for len(rest) > 0 {
		if err := f.fs.Parse(rest); err != nil {
			return parseExit(err)
		}
		rest = f.fs.Args()
		if len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	if len(pos) != 1 {
		fmt.Fprint(stderr, "usage: infermesh pull [--node URL] [--to NODE_ID] MODEL_KEY\n")
		return 2
	}
	bar := newProgressBar(stdout, isTerminal(stdout))
	bar.width = func() int { return termWidth(stdout, os.Getenv) }
	err := streamPull(ctx, *base, pos[0], target, bar.event)
	bar.finish()
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "infermesh pull: interrupted: stopped following %s; the node keeps downloading it (run the same command to follow it again)\n", pos[0])
		return 130
	}
	fmt.Fprintf(stderr, "infermesh pull: %v\n", err)
	return 1
}

// pullEvent is one parsed Server-Sent Event of a pull.
type pullEvent struct {
	Name string
	Data json.RawMessage
}

// streamPull posts the pull and calls on for each event; it returns the
// error event's message as an error, or an error when the stream ends
// without done. Cancelling ctx closes the connection at once: the node
// stops sending to this client and the pull goes on (see pullHelp).
func streamPull(ctx context.Context, base, key, target string, on func(pullEvent)) error {
	body, _ := json.Marshal(map[string]string{"model_key": key, "node": target})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/v1/models/pull", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if k := os.Getenv("SERVICE_ADMIN_KEY"); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	} else if k := os.Getenv("SERVICE_API_KEY"); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		json.Unmarshal(b, &e)
		return fmt.Errorf("%d %s (%s)", resp.StatusCode, e.Error.Message, e.Error.Code)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var ev pullEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = json.RawMessage(strings.TrimPrefix(line, "data: "))
		case line == "" && ev.Name != "":
			on(ev)
			switch ev.Name {
			case "done":
				return nil
			case "error":
				var e struct {
					Error struct{ Message, Code string } `json:"error"`
				}
				json.Unmarshal(ev.Data, &e)
				return fmt.Errorf("%s (%s)", e.Error.Message, e.Error.Code)
			}
			ev = pullEvent{}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the stream ended before the pull finished")
}

// progressBar draws pull progress: one redrawn line on a terminal, a line
// per phase (and per 10%) otherwise.
type progressBar struct {
	w   io.Writer
	tty bool
	// width returns the terminal's columns, read again at every redraw
	// (the window may be resized); nil means 80.
	width     func() int
	lastPhase string
	lastTenth int64
	drawn     bool
}

func newProgressBar(w io.Writer, tty bool) *progressBar {
	return &progressBar{w: w, tty: tty, lastTenth: -1}
}

func (b *progressBar) event(e pullEvent) {
	switch e.Name {
	case "started":
		var d struct {
			ModelKey string `json:"model_key"`
		}
		json.Unmarshal(e.Data, &d)
		fmt.Fprintf(b.w, "pulling %s\n", d.ModelKey)
	case "progress":
		var p struct {
			Phase      string `json:"phase"`
			Completed  int64  `json:"completed"`
			Total      int64  `json:"total"`
			BPS        int64  `json:"bps"`
			ETASeconds int64  `json:"eta_seconds"`
		}
		json.Unmarshal(e.Data, &p)
		if b.tty {
			w := 80
			if b.width != nil {
				w = b.width()
			}
			line := progressLine(w, p.Phase, p.Completed, p.Total, p.BPS, p.ETASeconds)
			fmt.Fprintf(b.w, "\r\033[K%s", line)
			b.drawn = true
			return
		}
		line := progressLine(noWidthLimit, p.Phase, p.Completed, p.Total, p.BPS, p.ETASeconds)
		tenth := int64(-1)
		if p.Total > 0 {
			tenth = p.Completed * 10 / p.Total
		}
		if p.Phase != b.lastPhase || tenth != b.lastTenth {
			fmt.Fprintln(b.w, line)
			b.lastPhase, b.lastTenth = p.Phase, tenth
		}
	case "done":
		var d struct {
			ModelKey   string `json:"model_key"`
			DurationMS int64  `json:"duration_ms"`
		}
		json.Unmarshal(e.Data, &d)
		b.finish()
		fmt.Fprintf(b.w, "done: %s in %s\n", d.ModelKey, (time.Duration(d.DurationMS) * time.Millisecond).Round(time.Millisecond))
	}
}

func (b *progressBar) finish() {
	if b.drawn {
		fmt.Fprintln(b.w)
		b.drawn = false
	}
}

// noWidthLimit is the width of progress lines written to a file or pipe:
// each is a line of its own, so nothing is left out.
const noWidthLimit = 1 << 16

// progressLine renders "[#####-----]  50%  1.0 MiB/2.0 MiB  512 KiB/s  eta 2s  phase"
// in at most width-1 columns (the last column is left free, so the cursor
// never wraps and "\r" redraws the same line). The bar takes the room the
// text leaves, up to 40 cells; on narrow terminals the fields go in order
// of least use (phase, cut first, then speed and eta, sizes, bar) until the
// rest fits.
func progressLine(width int, phase string, done, total, bps, eta int64) string {
	avail := width - 1
	if avail < 1 {
		return ""
	}
	pct := int64(0)
	if total > 0 {
		pct = min(done*100/total, 100)
	}
	pctText := fmt.Sprintf("%3d%%", pct)
	sizes := humanBytes(done) + "/" + humanBytes(total)
	speed := fmt.Sprintf("%s/s  eta %ds", humanBytes(bps), eta)
	candidates := [][]string{
		{pctText, sizes, speed, phase},
		{pctText, sizes, speed},
		{pctText, sizes},
		{pctText},
	}
	const minBar, maxBar = 10, 40
	// A phase too long for the line is cut ("...") while 12 or more of its
	// characters fit beside a bar of minBar.
	if rest := strings.Join(candidates[1], "  ") + "  "; len(rest)+len(phase)+3+minBar > avail {
		if keep, r := avail-3-minBar-len(rest)-3, []rune(phase); keep >= 12 && keep < len(r) {
			candidates[0][3] = string(r[:keep]) + "..." // byte lengths below: never wider than counted
		}
	}
	for _, fields := range candidates {
		text := strings.Join(fields, "  ")
		room := avail - len(text) - 3 // "[", "] "
		if room >= minBar {
			cells := min(room, maxBar)
			fill := int(pct * int64(cells) / 100)
			return "[" + strings.Repeat("#", fill) + strings.Repeat("-", cells-fill) + "] " + text
		}
	}
	// Too narrow for a bar: the percentage alone, cut to fit.
	return pctText[:min(len(pctText), avail)]
}

// termWidth is the number of columns of the terminal w writes to: the
// window size from the terminal (TIOCGWINSZ), else $COLUMNS, else 80.
func termWidth(w io.Writer, getenv func(string) string) int {
	if f, ok := w.(*os.File); ok {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
			return int(ws.Col)
		}
	}
	if n, err := strconv.Atoi(strings.TrimSpace(getenv("COLUMNS"))); err == nil && n > 0 {
		return n
	}
	return 80
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
