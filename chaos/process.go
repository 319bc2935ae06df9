package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// crashMarkers are log fragments that mean a node crashed or misbehaved,
// whatever its exit status.
func crashMarkers() []string {
	return []string{"panic: ", "fatal error: ", "WARNING: DATA RACE", "SIGSEGV"}
}

// proc is one incarnation of a node process.
type proc struct {
	cmd     *exec.Cmd
	started time.Time
	log     *lineWatcher
	done    chan struct{} // closed when the process has exited and logs are flushed
	// recorded is closed once the cluster has recorded the exit (the
	// node's state is down), after done.
	recorded chan struct{}
	ended    time.Time
	state    *os.ProcessState
	waitErr  error
}

// startProc starts bin with args, logging both output streams to logPath
// (appended). The process gets its own process group, dies with the harness
// (Pdeathsig), and runs with group gid when gid > 0.
func startProc(bin string, args, env []string, logPath string, gid int) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "\n==== %s start: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	lw := newLineWatcher(f)
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = lw, lw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if gid > 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(gid), Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, started: time.Now(), log: lw, done: make(chan struct{}), recorded: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.ended = time.Now()
		p.state, p.waitErr = cmd.ProcessState, err
		fmt.Fprintf(f, "==== %s exit: %v\n", p.ended.Format(time.RFC3339Nano), cmd.ProcessState)
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// signal sends sig to the process (not its group: a node has no children).
func (p *proc) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("process %d already exited", p.cmd.Process.Pid)
	default:
	}
	return syscall.Kill(p.cmd.Process.Pid, sig)
}

// wait waits up to d for the process to exit.
func (p *proc) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// exitDesc describes how the process ended: exit code, or the signal.
func (p *proc) exitDesc() (code int, sig string) {
	if p.state == nil {
		return -1, ""
	}
	if ws, ok := p.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal().String()
	}
	return p.state.ExitCode(), ""
}

// lineWatcher copies a process's output to a file and remembers the lines
// the harness looks for: the listening line and crash markers.
type lineWatcher struct {
	mu        sync.Mutex
	out       *os.File
	partial   []byte
	listening chan string // receives the addr= value of the first "node listening" line
	sentAddr  bool
	crashes   []string
	tail      []string // the last lines, for exits nobody asked for
}

func newLineWatcher(out *os.File) *lineWatcher {
	return &lineWatcher{out: out, listening: make(chan string, 1)}
}

// Write implements io.Writer.
func (w *lineWatcher) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.out.Write(b); err != nil {
		return 0, err
	}
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.scan(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) > 64<<10 { // a runaway line: scan what we have
		w.scan(string(w.partial))
		w.partial = w.partial[:0]
	}
	return len(b), nil
}

func (w *lineWatcher) scan(line string) {
	if len(w.tail) == 4 {
		w.tail = w.tail[1:]
	}
	w.tail = append(w.tail, truncate(line, 300))
	if !w.sentAddr && strings.Contains(line, "node listening") {
		addr := ""
		if i := strings.Index(line, "addr="); i >= 0 {
			addr = strings.Fields(line[i+len("addr="):] + " ")[0]
		}
		w.sentAddr = true
		w.listening <- strings.Trim(addr, `"`)
	}
	for _, m := range crashMarkers() {
		if strings.Contains(line, m) && len(w.crashes) < 20 {
			w.crashes = append(w.crashes, strings.TrimSpace(line))
		}
	}
}

// lastLines returns the last lines the process wrote.
func (w *lineWatcher) lastLines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.tail...)
}

// crashLines returns the crash markers seen so far.
func (w *lineWatcher) crashLines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.crashes...)
}
