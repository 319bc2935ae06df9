package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// pullCmd pulls a model through any node and draws the progress the node
// streams. --to names the node that installs it (default: the node asked).
func pullCmd(args []string, stdout, stderr io.Writer) int {
	f := newEnvFlags("pull")
	f.fs.SetOutput(stderr)
	base := nodeFlag(f)
	target := ""
	f.fs.StringVar(&target, "to", "", "node id that installs the model (default: the node --node points at)")
	var pos []string
	rest := args
	for len(rest) > 0 {
		if err := f.fs.Parse(rest); err != nil {
			return 2
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
	if err := streamPull(*base, pos[0], target, bar.event); err != nil {
		bar.finish()
		fmt.Fprintf(stderr, "infermesh pull: %v\n", err)
		return 1
	}
	bar.finish()
	return 0
}

// pullEvent is one parsed Server-Sent Event of a pull.
type pullEvent struct {
	Name string
	Data json.RawMessage
}

// streamPull posts the pull and calls on for each event; it returns the
// error event's message as an error, or an error when the stream ends
// without done.
func streamPull(base, key, target string, on func(pullEvent)) error {
	body, _ := json.Marshal(map[string]string{"model_key": key, "node": target})
	req, err := http.NewRequest(http.MethodPost, strings.TrimRight(base, "/")+"/v1/models/pull", bytes.NewReader(body))
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
	w         io.Writer
	tty       bool
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
		line := progressLine(p.Phase, p.Completed, p.Total, p.BPS, p.ETASeconds)
		if b.tty {
			fmt.Fprintf(b.w, "\r\033[K%s", line)
			b.drawn = true
			return
		}
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

// progressLine renders "[#####-----]  50%  1.0 MiB/2.0 MiB  512 KiB/s  eta 2s  phase".
func progressLine(phase string, done, total, bps, eta int64) string {
	const width = 30
	pct := int64(0)
	if total > 0 {
		pct = min(done*100/total, 100)
	}
	fill := int(pct * width / 100)
	bar := strings.Repeat("#", fill) + strings.Repeat("-", width-fill)
	return fmt.Sprintf("[%s] %3d%%  %s/%s  %s/s  eta %ds  %s", bar, pct, humanBytes(done), humanBytes(total), humanBytes(bps), eta, phase)
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
