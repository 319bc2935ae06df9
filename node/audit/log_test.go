package audit

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAuditChainAndSignatureRoundTrip(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, "a", Options{})
	appendN(t, l, 0, 100)
	data := export(t, l)
	if n := len(lines(data)); n != 100 {
		t.Fatalf("exported %d lines, want 100", n)
	}
	keys := map[string]ed25519.PublicKey{"a": l.PublicKey()}
	rep := mustVerify(t, data, keys)
	c := rep.Nodes["a"]
	if rep.Records != 100 || c == nil || !c.FromGenesis || c.FirstSeq != 1 || c.LastSeq != 100 {
		t.Fatalf("report: %v", rep)
	}
	first, _ := ParseEntry(lines(data)[0])
	if first.Prev != Genesis("a") || first.RequestID != "req-0000" || first.Worker != "b" {
		t.Fatalf("first record: %+v", first)
	}
	// The same records under another node's key fail at line 1.
	if line, _ := badLine(t, data, map[string]ed25519.PublicKey{"a": pubOf(testKey("b"))}); line != 1 {
		t.Fatalf("wrong key: bad line %d, want 1", line)
	}
	if line, reason := badLine(t, data, map[string]ed25519.PublicKey{}); line != 1 || !strings.Contains(reason, "no public key") {
		t.Fatalf("no key: line %d %q", line, reason)
	}
	st, err := os.Stat(filepath.Join(dir, fileName(1)))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("log file mode: %v %v", st.Mode(), err)
	}
}

// Every single flipped byte of a record, wherever it is, makes Verify fail
// naming that record's line.
func TestAuditFlippedByteNamesTheLine(t *testing.T) {
	l := openLog(t, t.TempDir(), "a", Options{})
	appendN(t, l, 0, 8)
	data := export(t, l)
	keys := map[string]ed25519.PublicKey{"a": l.PublicKey()}
	ls := lines(data)
	start := 0
	for _, x := range ls[:5] {
		start += len(x) + 1
	}
	// Line 6, every byte and its newline, with two different flips.
	for i := start; i <= start+len(ls[5]); i++ {
		for _, mask := range []byte{0x01, 0x40} {
			bad := bytes.Clone(data)
			bad[i] ^= mask
			if line, reason := badLine(t, bad, keys); line != 6 {
				t.Fatalf("byte %d ^%#x (%q): bad line %d (%s), want 6", i-start, mask, data[i], line, reason)
			}
		}
	}
	// A sample of bytes of every other line.
	off := 0
	for n, x := range ls {
		for _, j := range []int{0, 7, len(x) / 2, len(x) - 3, len(x) - 1} {
			bad := bytes.Clone(data)
			bad[off+j] ^= 0x01
			if line, _ := badLine(t, bad, keys); line != n+1 {
				t.Fatalf("line %d byte %d: bad line %d", n+1, j, line)
			}
		}
		off += len(x) + 1
	}
}

func TestAuditReorderDeleteRepeatFail(t *testing.T) {
	l := openLog(t, t.TempDir(), "a", Options{})
	appendN(t, l, 0, 6)
	keys := map[string]ed25519.PublicKey{"a": l.PublicKey()}
	ls := lines(export(t, l))
	cases := map[string]struct {
		ls   [][]byte
		line int
	}{
		"swap 3 and 4":  {[][]byte{ls[0], ls[1], ls[3], ls[2], ls[4], ls[5]}, 3},
		"delete 4":      {[][]byte{ls[0], ls[1], ls[2], ls[4], ls[5]}, 4},
		"repeat 2":      {[][]byte{ls[0], ls[1], ls[1], ls[2]}, 3},
		"delete first":  {[][]byte{ls[1], ls[2], ls[0]}, 3},
		"move last up":  {[][]byte{ls[0], ls[5], ls[1]}, 2},
		"empty line":    {[][]byte{ls[0], {}, ls[1]}, 2},
		"truncated rec": {[][]byte{ls[0], ls[1][:len(ls[1])-10]}, 2},
	}
	for name, c := range cases {
		if line, reason := badLine(t, join(c.ls), keys); line != c.line {
			t.Errorf("%s: bad line %d (%s), want %d", name, line, reason, c.line)
		}
	}
	// Starting inside the chain is allowed and reported.
	rep := mustVerify(t, join(ls[2:]), keys)
	if c := rep.Nodes["a"]; c.FromGenesis || c.FirstSeq != 3 || c.LastSeq != 6 {
		t.Fatalf("anchored start: %+v", c)
	}
}

func TestAuditSeveralNodesInterleaved(t *testing.T) {
	la := openLog(t, t.TempDir(), "a", Options{})
	lb := openLog(t, t.TempDir(), "b", Options{})
	appendN(t, la, 0, 5)
	appendN(t, lb, 0, 5)
	a, b := lines(export(t, la)), lines(export(t, lb))
	keys := map[string]ed25519.PublicKey{"a": la.PublicKey(), "b": lb.PublicKey()}
	mixed := join([][]byte{a[0], b[0], b[1], a[1], a[2], b[2], b[3], b[4], a[3], a[4]})
	rep := mustVerify(t, mixed, keys)
	if rep.Records != 10 || rep.Nodes["a"].LastSeq != 5 || rep.Nodes["b"].LastSeq != 5 {
		t.Fatalf("report: %v", rep)
	}
	// Concatenated exports verify too.
	mustVerify(t, append(export(t, la), export(t, lb)...), keys)
	// b's records under a's key: b's first line fails.
	if line, _ := badLine(t, mixed, map[string]ed25519.PublicKey{"a": la.PublicKey(), "b": la.PublicKey()}); line != 2 {
		t.Fatalf("swapped key: bad line %d, want 2", line)
	}
}

func TestAuditRestartContinuesTheChain(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, "a", Options{})
	appendN(t, l, 0, 10)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, dir, "a", Options{})
	if s := l2.Stats(); s.Seq != 10 || s.TornBytes != 0 {
		t.Fatalf("after restart: %+v", s)
	}
	appendN(t, l2, 10, 10)
	rep := mustVerify(t, export(t, l2), map[string]ed25519.PublicKey{"a": l2.PublicKey()})
	if c := rep.Nodes["a"]; rep.Records != 20 || !c.FromGenesis || c.LastSeq != 20 {
		t.Fatalf("report: %v", rep)
	}
	// Appends after Close are dropped and counted.
	l2.Close()
	if l2.Append(rec(99)) || l2.Stats().Dropped != 1 {
		t.Fatal("Append after Close was accepted")
	}
}

func TestAuditTornTailTruncated(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, "a", Options{})
	appendN(t, l, 0, 5)
	l.Close()
	path := filepath.Join(dir, fileName(1))
	before, _ := os.ReadFile(path)
	torn := []byte(`{"v":1,"node":"a","seq":6,"time":"2026-01-3`)
	if err := os.WriteFile(path, append(bytes.Clone(before), torn...), 0o600); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, dir, "a", Options{})
	if s := l2.Stats(); s.TornBytes != int64(len(torn)) || s.Seq != 5 {
		t.Fatalf("stats: %+v, want %d torn bytes and seq 5", s, len(torn))
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(after, before) {
		t.Fatal("torn bytes not truncated")
	}
	appendN(t, l2, 5, 5)
	rep := mustVerify(t, export(t, l2), map[string]ed25519.PublicKey{"a": l2.PublicKey()})
	if rep.Records != 10 {
		t.Fatalf("report: %v", rep)
	}
	// A file holding nothing but a torn line is emptied.
	dir2 := t.TempDir()
	os.WriteFile(filepath.Join(dir2, fileName(1)), torn, 0o600)
	l3 := openLog(t, dir2, "a", Options{})
	appendN(t, l3, 0, 2)
	if rep := mustVerify(t, export(t, l3), map[string]ed25519.PublicKey{"a": l3.PublicKey()}); !rep.Nodes["a"].FromGenesis {
		t.Fatalf("report: %v", rep)
	}
}

func TestAuditOpenRefusesACorruptOrForeignTail(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, "a", Options{})
	appendN(t, l, 0, 3)
	l.Close()
	if _, err := Open(dir, Options{NodeID: "a", Key: testKey("other")}); !errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("other key: want ErrKeyMismatch, got %v", err)
	}
	path := filepath.Join(dir, fileName(1))
	data, _ := os.ReadFile(path)
	data[len(data)-20] ^= 0x01
	os.WriteFile(path, data, 0o600)
	if _, err := Open(dir, Options{NodeID: "a", Key: testKey("a")}); err == nil {
		t.Fatal("opened a log whose last record is corrupt")
	}
}

func TestAuditNodeIDChangeKeepsEachChain(t *testing.T) {
	dir := t.TempDir()
	key := testKey("shared")
	for _, step := range []struct {
		node  string
		first int
	}{{"a", 0}, {"b", 10}, {"a", 20}} {
		l := openLog(t, dir, step.node, Options{Key: key})
		appendN(t, l, step.first, 3)
		l.Close()
	}
	l := openLog(t, dir, "a", Options{Key: key})
	rep := mustVerify(t, export(t, l), map[string]ed25519.PublicKey{"a": pubOf(key), "b": pubOf(key)})
	if rep.Nodes["a"].LastSeq != 6 || rep.Nodes["b"].LastSeq != 3 || !rep.Nodes["a"].FromGenesis {
		t.Fatalf("report: %v", rep)
	}
}

func TestAuditRotationAndFileRetention(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, "a", Options{MaxFileBytes: 2000})
	appendN(t, l, 0, 60)
	files, _ := listFiles(dir)
	if len(files) < 5 {
		t.Fatalf("%d files after 60 records with 2000-byte files", len(files))
	}
	for _, i := range files {
		st, _ := os.Stat(filepath.Join(dir, fileName(i)))
		if st.Size() > 2000 || st.Size() == 0 {
			t.Fatalf("file %d is %d bytes", i, st.Size())
		}
	}
	keys := map[string]ed25519.PublicKey{"a": l.PublicKey()}
	if rep := mustVerify(t, export(t, l), keys); rep.Records != 60 || !rep.Nodes["a"].FromGenesis {
		t.Fatalf("report: %v", rep)
	}
	l.Close()

	// Reopened with MaxFiles 3: the oldest go, the rest still verifies.
	l2 := openLog(t, dir, "a", Options{MaxFileBytes: 2000, MaxFiles: 3})
	if got, _ := listFiles(dir); len(got) != 3 || got[2] != files[len(files)-1] {
		t.Fatalf("files after retention: %v (had %v)", got, files)
	}
	appendN(t, l2, 60, 30)
	got, _ := listFiles(dir)
	if len(got) != 3 {
		t.Fatalf("files after more rotations: %v", got)
	}
	if l2.Stats().Removed == 0 || l2.Stats().Files != 3 {
		t.Fatalf("stats: %+v", l2.Stats())
	}
	rep := mustVerify(t, export(t, l2), keys)
	if c := rep.Nodes["a"]; c.FromGenesis || c.LastSeq != 90 || c.FirstSeq == 1 {
		t.Fatalf("report: %v", rep)
	}
}

func TestAuditAgeRetention(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, "a", Options{MaxFileBytes: 2000})
	appendN(t, l, 0, 30)
	l.Close()
	files, _ := listFiles(dir)
	old := time.Now().Add(-48 * time.Hour)
	for _, i := range files[:2] {
		os.Chtimes(filepath.Join(dir, fileName(i)), old, old)
	}
	// Every file old, the active one included: the active one stays.
	last := filepath.Join(dir, fileName(files[len(files)-1]))
	os.Chtimes(last, old, old)
	l2 := openLog(t, dir, "a", Options{MaxFileBytes: 2000, MaxAge: 24 * time.Hour})
	got, _ := listFiles(dir)
	if len(got) != len(files)-2 || got[0] != files[2] {
		t.Fatalf("files %v after age retention, had %v", got, files)
	}
	appendN(t, l2, 30, 2)
	mustVerify(t, export(t, l2), map[string]ed25519.PublicKey{"a": l2.PublicKey()})
}

func TestAuditConcurrentAppendKeepsOneChain(t *testing.T) {
	l := openLog(t, t.TempDir(), "a", Options{MaxFileBytes: 256 << 10, QueueSize: 1 << 16})
	const workers, each = 32, 300
	var wg sync.WaitGroup
	var accepted atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if l.Append(rec(w*each + i)) {
					accepted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	flush(t, l)
	s := l.Stats()
	if int64(s.Written) != accepted.Load() || s.Written+s.Dropped != workers*each || s.Dropped != 0 {
		t.Fatalf("stats %+v, accepted %d of %d", s, accepted.Load(), workers*each)
	}
	rep := mustVerify(t, export(t, l), map[string]ed25519.PublicKey{"a": l.PublicKey()})
	if rep.Records != workers*each || rep.Nodes["a"].LastSeq != workers*each {
		t.Fatalf("report: %v", rep)
	}
	seen := map[string]bool{}
	for _, x := range lines(export(t, l)) {
		e, _ := ParseEntry(x)
		seen[e.RequestID] = true
	}
	if len(seen) != workers*each {
		t.Fatalf("%d distinct request ids, want %d", len(seen), workers*each)
	}
}

// A full queue drops and counts; it never blocks the caller.
func TestAuditFullQueueDropsWithoutBlocking(t *testing.T) {
	l := openLog(t, t.TempDir(), "a", Options{QueueSize: 4})
	l.mu.Lock() // stalls the writer at its next write
	// An Append that blocked on the stalled writer would hang the test.
	const n = 2000
	accepted := 0
	for i := range n {
		if l.Append(rec(i)) {
			accepted++
		}
	}
	l.mu.Unlock()
	flush(t, l)
	s := l.Stats()
	// While it waits the writer holds one batch: the record it received
	// and whatever fill took from the queue meanwhile (at most maxBatch;
	// usually about the queue's size, but Appends racing with fill can
	// add a few), and the queue holds 4 more.
	if accepted > maxBatch+4 || s.Dropped != uint64(n-accepted) || s.Written != uint64(accepted) {
		t.Fatalf("accepted %d, stats %+v", accepted, s)
	}
	mustVerify(t, export(t, l), map[string]ed25519.PublicKey{"a": l.PublicKey()})
}

// A failed write leaves no gap: the chain continues in a new file.
func TestAuditWriteFailureKeepsTheChain(t *testing.T) {
	l := openLog(t, t.TempDir(), "a", Options{})
	appendN(t, l, 0, 3)
	l.mu.Lock()
	l.f.Close() // the next write fails
	l.mu.Unlock()
	l.Append(rec(3))
	if err := l.Flush(t.Context()); err == nil {
		t.Fatal("Flush after a failed write returned nil")
	}
	if s := l.Stats(); s.WriteFailed != 1 || s.Written != 3 {
		t.Fatalf("stats: %+v", s)
	}
	appendN(t, l, 4, 3)
	rep := mustVerify(t, export(t, l), map[string]ed25519.PublicKey{"a": l.PublicKey()})
	if rep.Records != 6 || rep.Nodes["a"].LastSeq != 6 || l.Stats().Files != 2 {
		t.Fatalf("report: %v, stats %+v", rep, l.Stats())
	}
}

func TestAuditExportSince(t *testing.T) {
	l := openLog(t, t.TempDir(), "a", Options{MaxFileBytes: 1500})
	appendN(t, l, 0, 10)
	var b bytes.Buffer
	if err := l.Export(rec(6).Time, &b); err != nil {
		t.Fatal(err)
	}
	rep := mustVerify(t, b.Bytes(), map[string]ed25519.PublicKey{"a": l.PublicKey()})
	if c := rep.Nodes["a"]; rep.Records != 4 || c.FirstSeq != 7 || c.FromGenesis {
		t.Fatalf("report: %v", rep)
	}
}

func TestAuditKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", KeyFileName)
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", st.Mode())
	}
	os.Chmod(path, 0o644)
	k2, err := LoadOrCreateKey(path)
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("second load: %v, same %v", err, k1.Equal(k2))
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode not tightened: %v", st.Mode())
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Fatalf("left temporary files: %v", ents)
	}
	os.WriteFile(path, []byte("junk"), 0o600)
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("loaded a junk key")
	}
	keys := map[string]ed25519.PublicKey{"a": pubOf(k1), "b": pubOf(testKey("b"))}
	back, err := ParseKeys(MarshalKeys(keys))
	if err != nil || len(back) != 2 || !back["a"].Equal(keys["a"]) {
		t.Fatalf("keys round trip: %v %v", back, err)
	}
	if _, err := ParseKeys([]byte(`{"keys":{"a":"c2hvcnQ="}}`)); err == nil {
		t.Fatal("accepted a short key")
	}
}
