package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Version is the record format version written in every record's "v".
const Version = 1

// MaxFieldBytes bounds every string field of a record; Append cuts longer
// values at a UTF-8 boundary.
const MaxFieldBytes = 256

// MaxLineBytes bounds one encoded record line (without its newline). A
// record built from fields of MaxFieldBytes stays well below it even when
// every byte needs a six-byte escape.
const MaxLineBytes = 16 << 10

// VisionPrefix is the endpoint prefix of vision routes. Records of these
// endpoints keep only the endpoint, model, status and timing.
const VisionPrefix = "/v1/vision"

// Record is what one counted request leaves in the audit log. It has no
// field for prompt, response, image or audio content, by design.
type Record struct {
	// Time is when the request arrived (zero: when Append was called).
	Time time.Time
	// Endpoint is the route path, e.g. /v1/chat/completions.
	Endpoint string
	// Model is the model id the request named or was served by.
	Model string
	// KeyID is the API key's id (never the key itself); "" for keyless.
	KeyID string
	// App is the key's application.
	App string
	// Worker is the node id of the node that served the request.
	Worker string
	// Status is the HTTP status code answered.
	Status int
	// Duration is how long the request took; stored to the microsecond.
	Duration time.Duration
	// RequestID is the request's id (X-Request-ID).
	RequestID string
}

// IsVision reports whether endpoint is a vision route.
func IsVision(endpoint string) bool {
	return endpoint == VisionPrefix || strings.HasPrefix(endpoint, VisionPrefix+"/")
}

// normalize applies the privacy and size rules Append enforces: vision
// records lose everything but endpoint, model, status and timing; strings
// become valid UTF-8 of at most MaxFieldBytes; times are UTC with
// microsecond precision (the precision the encoding keeps).
func (r Record) normalize(now time.Time) Record {
	if r.Time.IsZero() {
		r.Time = now
	}
	r.Time = r.Time.UTC().Round(0).Truncate(time.Microsecond)
	if r.Duration < 0 {
		r.Duration = 0
	}
	r.Duration = r.Duration.Truncate(time.Microsecond)
	if IsVision(r.Endpoint) {
		r.KeyID, r.App, r.Worker, r.RequestID = "", "", "", ""
	}
	r.Endpoint = clean(r.Endpoint)
	r.Model = clean(r.Model)
	r.KeyID = clean(r.KeyID)
	r.App = clean(r.App)
	r.Worker = clean(r.Worker)
	r.RequestID = clean(r.RequestID)
	return r
}

// clean makes s valid UTF-8 of at most MaxFieldBytes bytes.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= MaxFieldBytes {
		return s
	}
	s = s[:MaxFieldBytes]
	for len(s) > 0 {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// Entry is a record as the log holds it: the request's Record plus the
// chain position (Node, Seq, Prev) and the signature.
type Entry struct {
	Record
	// Node is the id of the node that wrote and signed the record.
	Node string
	// Seq is the record's position in Node's chain, from 1.
	Seq uint64
	// Prev is the SHA-256 of the previous record's line in Node's chain,
	// or Genesis(Node) for Seq 1.
	Prev [32]byte
	// Sig is the ed25519 signature of the record's signed bytes.
	Sig []byte
}

// Genesis is the Prev of a node's first record: the SHA-256 of
// "infermesh-audit-genesis\x00" followed by the node id.
func Genesis(node string) [32]byte {
	h := sha256.New()
	h.Write([]byte("infermesh-audit-genesis\x00"))
	h.Write([]byte(node))
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// LineHash is the chain hash of a record: the SHA-256 of its complete line
// without the newline.
func LineHash(line []byte) [32]byte { return sha256.Sum256(line) }

// appendSigned appends the signed bytes of e: the canonical JSON object of
// every field but "sig".
func (e *Entry) appendSigned(dst []byte) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, Version, 10)
	dst = appendStr(dst, "node", e.Node)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, e.Seq, 10)
	dst = append(dst, `,"time":"`...)
	dst = e.Time.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, '"')
	dst = appendStr(dst, "endpoint", e.Endpoint)
	dst = appendStr(dst, "model", e.Model)
	dst = appendStr(dst, "key_id", e.KeyID)
	dst = appendStr(dst, "app", e.App)
	dst = appendStr(dst, "worker", e.Worker)
	dst = append(dst, `,"status":`...)
	dst = strconv.AppendInt(dst, int64(e.Status), 10)
	us := max(0, int64(e.Duration/time.Microsecond))
	dst = append(dst, `,"duration_ms":`...)
	dst = strconv.AppendInt(dst, us/1000, 10)
	dst = append(dst, '.')
	frac := us % 1000
	if frac < 100 {
		dst = append(dst, '0')
	}
	if frac < 10 {
		dst = append(dst, '0')
	}
	dst = strconv.AppendInt(dst, frac, 10)
	dst = appendStr(dst, "request_id", e.RequestID)
	dst = append(dst, `,"prev":"`...)
	dst = hex.AppendEncode(dst, e.Prev[:])
	return append(dst, '"', '}')
}

// SignedBytes returns the bytes the signature covers: the record's
// canonical JSON object without its "sig" field.
func (e *Entry) SignedBytes() []byte { return e.appendSigned(nil) }

// AppendLine appends the record's complete canonical line (without the
// newline): the signed bytes with `,"sig":"<hex>"` before the closing
// brace.
func (e *Entry) AppendLine(dst []byte) []byte {
	dst = e.appendSigned(dst)
	dst = dst[:len(dst)-1]
	dst = append(dst, `,"sig":"`...)
	dst = hex.AppendEncode(dst, e.Sig)
	return append(dst, '"', '}')
}

// Sign sets e.Sig from key and appends the signed line to dst.
func (e *Entry) Sign(key ed25519.PrivateKey, dst []byte) []byte {
	start := len(dst)
	dst = e.appendSigned(dst)
	e.Sig = ed25519.Sign(key, dst[start:])
	dst = dst[:len(dst)-1]
	dst = append(dst, `,"sig":"`...)
	dst = hex.AppendEncode(dst, e.Sig)
	return append(dst, '"', '}')
}

// VerifySig reports whether e.Sig is pub's signature of e's signed bytes.
func (e *Entry) VerifySig(pub ed25519.PublicKey) bool {
	return len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, e.SignedBytes(), e.Sig)
}

// appendStr appends `,"name":"value"`, or nothing when value is empty.
func appendStr(dst []byte, name, value string) []byte {
	if value == "" {
		return dst
	}
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':', '"')
	for i := 0; i < len(value); {
		c := value[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
			i++
			continue
		case '\n':
			dst = append(dst, '\\', 'n')
			i++
			continue
		case '\r':
			dst = append(dst, '\\', 'r')
			i++
			continue
		case '\t':
			dst = append(dst, '\\', 't')
			i++
			continue
		}
		if c < 0x20 {
			dst = append(dst, `\u00`...)
			dst = append(dst, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(value[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, value[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// wireEntry is the decoding shape of a line.
type wireEntry struct {
	V          *int        `json:"v"`
	Node       string      `json:"node"`
	Seq        uint64      `json:"seq"`
	Time       string      `json:"time"`
	Endpoint   string      `json:"endpoint"`
	Model      string      `json:"model"`
	KeyID      string      `json:"key_id"`
	App        string      `json:"app"`
	Worker     string      `json:"worker"`
	Status     int         `json:"status"`
	DurationMS json.Number `json:"duration_ms"`
	RequestID  string      `json:"request_id"`
	Prev       string      `json:"prev"`
	Sig        string      `json:"sig"`
}

// ErrNotCanonical is wrapped by ParseEntry's error when a line is valid
// JSON but not the canonical encoding of the record it holds.
var ErrNotCanonical = errors.New("not the canonical encoding")

// ParseEntry decodes one record line (without its newline). It accepts
// only the canonical encoding: the line must be byte for byte what
// AppendLine writes for the decoded record, so any changed byte either
// fails here or changes the signed bytes. It checks no signature.
func ParseEntry(line []byte) (Entry, error) {
	var e Entry
	if len(line) > MaxLineBytes {
		return e, fmt.Errorf("line longer than %d bytes", MaxLineBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var w wireEntry
	if err := dec.Decode(&w); err != nil {
		return e, fmt.Errorf("not a record: %v", err)
	}
	if dec.More() {
		return e, errors.New("not a record: data after the object")
	}
	if w.V == nil || *w.V != Version {
		return e, fmt.Errorf("unsupported record version (want %d)", Version)
	}
	if w.Node == "" {
		return e, errors.New("record without node")
	}
	if w.Seq == 0 {
		return e, errors.New("record without seq")
	}
	t, err := time.Parse(time.RFC3339Nano, w.Time)
	if err != nil {
		return e, fmt.Errorf("bad time: %v", err)
	}
	d, err := parseMillis(string(w.DurationMS))
	if err != nil {
		return e, err
	}
	if len(w.Prev) != 64 {
		return e, errors.New("bad prev: want 64 hex digits")
	}
	if _, err := hex.Decode(e.Prev[:], []byte(w.Prev)); err != nil {
		return e, fmt.Errorf("bad prev: %v", err)
	}
	if len(w.Sig) != 2*ed25519.SignatureSize {
		return e, fmt.Errorf("bad sig: want %d hex digits", 2*ed25519.SignatureSize)
	}
	if e.Sig, err = hex.DecodeString(w.Sig); err != nil {
		return e, fmt.Errorf("bad sig: %v", err)
	}
	e.Record = Record{
		Time: t, Endpoint: w.Endpoint, Model: w.Model, KeyID: w.KeyID, App: w.App,
		Worker: w.Worker, Status: w.Status, Duration: d, RequestID: w.RequestID,
	}
	e.Node, e.Seq = w.Node, w.Seq
	if !bytes.Equal(e.AppendLine(make([]byte, 0, len(line))), line) {
		return Entry{}, fmt.Errorf("record: %w", ErrNotCanonical)
	}
	return e, nil
}

// parseMillis reads "duration_ms": digits, a dot and three digits.
func parseMillis(s string) (time.Duration, error) {
	whole, frac, ok := strings.Cut(s, ".")
	if !ok || len(frac) != 3 || whole == "" {
		return 0, errors.New("bad duration_ms: want milliseconds with three decimals")
	}
	ms, err1 := strconv.ParseUint(whole, 10, 63)
	us, err2 := strconv.ParseUint(frac, 10, 16)
	if err1 != nil || err2 != nil || ms > uint64(1<<62)/uint64(time.Millisecond) {
		return 0, errors.New("bad duration_ms: want milliseconds with three decimals")
	}
	return time.Duration(ms)*time.Millisecond + time.Duration(us)*time.Microsecond, nil
}
