package audit

import (
	"bufio"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Report is what Verify checked.
type Report struct {
	// Records is the number of records that verified.
	Records int
	// Nodes holds each node's chain as seen in the input.
	Nodes map[string]*Chain
}

// Chain is one node's part of a verified input.
type Chain struct {
	// Records is how many records of the node verified.
	Records int
	// FirstSeq and LastSeq are the first and last sequence numbers seen.
	FirstSeq, LastSeq uint64
	// FromGenesis is true when the first record is the chain's first
	// (Seq 1, Prev the genesis value). Otherwise the input starts inside
	// the chain (an export with --since, or files removed by retention)
	// and the records before FirstSeq are not checked.
	FromGenesis bool
	// Head is the hex SHA-256 of the node's last verified line: anyone who
	// noted it can later check that the chain still passes through it.
	Head string
}

// String summarises the report, one line per node in id order.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d records verified", r.Records)
	ids := make([]string, 0, len(r.Nodes))
	for id := range r.Nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c := r.Nodes[id]
		start := "from genesis"
		if !c.FromGenesis {
			start = "earlier records not in the input"
		}
		fmt.Fprintf(&b, "\n  node %s: %d records, seq %d..%d (%s), head %s", id, c.Records, c.FirstSeq, c.LastSeq, start, c.Head)
	}
	return b.String()
}

// VerifyError names the first line that failed verification.
type VerifyError struct {
	// Line is the 1-based line number in the input.
	Line int
	// Node and Seq identify the record when the line parsed.
	Node string
	Seq  uint64
	// Reason says what is wrong.
	Reason string
}

func (e *VerifyError) Error() string {
	if e.Node != "" {
		return fmt.Sprintf("line %d (node %s seq %d): %s", e.Line, e.Node, e.Seq, e.Reason)
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Reason)
}

// Verify reads JSON Lines records and checks, for every line: that it is
// a canonical record, that its signature verifies with its node's key in
// keys, and that it continues its node's chain: Seq one more than the
// node's previous record in the input and Prev the SHA-256 of that
// record's line (a node's first record in the input must be Seq 1 with
// the genesis Prev, or it anchors the check where the input starts; see
// Chain.FromGenesis). Records of several nodes may be interleaved in any
// way; each node's records must keep their order. It stops at the first
// bad line and returns the report so far with a *VerifyError; other
// errors are read errors.
func Verify(r io.Reader, keys map[string]ed25519.PublicKey) (Report, error) {
	rep := Report{Nodes: map[string]*Chain{}}
	heads := map[string][32]byte{}
	br := bufio.NewReaderSize(r, MaxLineBytes+2)
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return rep, &VerifyError{Line: n, Reason: fmt.Sprintf("line longer than %d bytes", MaxLineBytes)}
		}
		if err != nil && err != io.EOF {
			return rep, err
		}
		if len(line) == 0 && err == io.EOF {
			return rep, nil
		}
		body := line
		if body[len(body)-1] == '\n' {
			body = body[:len(body)-1]
		}
		if verr := checkLine(&rep, heads, keys, n, body); verr != nil {
			return rep, verr
		}
		if err == io.EOF {
			return rep, nil
		}
	}
}

// checkLine verifies one line and advances its node's chain.
func checkLine(rep *Report, heads map[string][32]byte, keys map[string]ed25519.PublicKey, n int, body []byte) *VerifyError {
	if len(body) == 0 {
		return &VerifyError{Line: n, Reason: "empty line"}
	}
	e, err := ParseEntry(body)
	if err != nil {
		return &VerifyError{Line: n, Reason: err.Error()}
	}
	bad := func(format string, args ...any) *VerifyError {
		return &VerifyError{Line: n, Node: e.Node, Seq: e.Seq, Reason: fmt.Sprintf(format, args...)}
	}
	pub, ok := keys[e.Node]
	if !ok {
		return bad("no public key for node %q", e.Node)
	}
	if !e.VerifySig(pub) {
		return bad("bad signature (record altered, or not signed by key %s)", Fingerprint(pub))
	}
	c := rep.Nodes[e.Node]
	if c == nil {
		if e.Seq == 1 && e.Prev != Genesis(e.Node) {
			return bad("first record of the chain does not refer to the genesis value")
		}
		c = &Chain{FirstSeq: e.Seq, FromGenesis: e.Seq == 1}
		rep.Nodes[e.Node] = c
	} else {
		if e.Seq != c.LastSeq+1 {
			return bad("chain broken: seq %d follows seq %d (record missing, repeated or out of order)", e.Seq, c.LastSeq)
		}
		if e.Prev != heads[e.Node] {
			return bad("chain broken: prev does not match the hash of seq %d", c.LastSeq)
		}
	}
	h := LineHash(body)
	heads[e.Node] = h
	c.LastSeq = e.Seq
	c.Records++
	c.Head = hex.EncodeToString(h[:])
	rep.Records++
	return nil
}
