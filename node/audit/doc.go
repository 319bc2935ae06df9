// Package audit keeps a node's signed, hash-chained audit log: one record
// per counted request, never any content.
//
// # Records
//
// A Record holds the request's time, endpoint, model, key id, app, the
// serving worker's node id, the status code, the duration and the request
// id. It has no field for prompt, response, image or audio content.
// Records of vision endpoints (under /v1/vision) keep only endpoint,
// model, status and timing: Append clears their key id, app, worker and
// request id. Strings are made valid UTF-8 and cut to MaxFieldBytes.
//
// # Format
//
// The log is JSON Lines: one record per line, each line the record's
// canonical encoding, with the fields in this fixed order and no spaces:
//
//	{"v":1,"node":"a","seq":7,"time":"2026-01-31T12:00:00.123456Z",
//	 "endpoint":"/v1/chat/completions","model":"m","key_id":"k","app":"x",
//	 "worker":"b","status":200,"duration_ms":41.250,"request_id":"r",
//	 "prev":"<64 hex>","sig":"<128 hex>"}
//
// (one line on disk). v is the format version (1). node is the id of the
// node that wrote and signed the record and whose chain it belongs to;
// worker is the node that served the request (they differ when the
// request was forwarded). seq counts the node's records from 1. time is
// RFC 3339 in UTC with up to nanosecond digits, trailing zeros dropped
// (Go's RFC3339Nano; Append keeps microseconds). duration_ms is
// milliseconds with exactly three decimals. String fields are omitted
// when empty and escaped minimally: \" \\ \n \r \t, other control
// characters as \u00XX, everything else (valid UTF-8) as is. Other numbers are
// plain decimal integers. prev and sig are lowercase hex.
//
// The decoder (ParseEntry) accepts only this encoding: it decodes the
// line and re-encodes it, and the bytes must match. So any change to a
// line either fails to parse or changes the signed bytes.
//
// # Signature and chain
//
// Each node has an ed25519 key pair. The private key is in the node's
// data dir (KeyFileName, PEM PKCS #8, mode 0600), created at first start
// (LoadOrCreateKey). The public keys travel in replicated state: each
// node writes its own once at start, and a KeyDirectory gives them all.
//
// A record's signed bytes are its line without the sig field (the object
// ends after prev). sig is the ed25519 signature of those bytes. The
// chain hash of a record is the SHA-256 of its complete line (sig
// included, newline excluded); prev is the chain hash of the node's
// previous record, and the first record of a node's chain (seq 1) has
// prev = Genesis(node) = SHA-256("infermesh-audit-genesis\x00" + node).
// Sequence numbers and prev are assigned by the single writer, so records
// appended concurrently still form one chain.
//
// Verify checks each line's encoding and signature and each node's chain
// separately, so exports of several nodes may be concatenated or
// interleaved. Deleting, repeating, reordering or altering a record
// breaks the check at a named line. Removing records at the start of the
// input (retention, or an export with since) cannot be told from a
// shorter log: the report says where each chain starts (FromGenesis,
// FirstSeq), and its Head lets an operator who noted it check later that
// the chain still passes through that record. Removing records at the end
// can only be found by comparing with an earlier noted Head or seq.
//
// # Files, rotation and retention
//
// Records go to <data>/audit/audit-000001.jsonl, audit-000002.jsonl, ...
// (DirName). A new file starts when the next record would take the file
// past Options.MaxFileBytes; the chain continues across files. Retention
// removes whole files, never the one being written: the oldest ones
// beyond Options.MaxFiles, and those whose last write is older than
// Options.MaxAge. It runs at open, after each rotation and every minute.
//
// # Writing and fsync
//
// Append never blocks a request: it puts the record in a bounded queue
// (Options.QueueSize) and returns; when the queue is full the record is
// dropped and counted (Stats.Dropped, the dropped result of
// infermesh_audit_records_total). One writer goroutine takes up to 512
// queued records at a time, numbers, chains and signs them, and writes
// them with one write call. fsync follows Options.SyncInterval: 0 (the
// default) syncs after every batch, so a record is durable a few
// milliseconds after Append; a positive interval syncs at most that
// often; a negative one leaves it to the operating system. Rotation,
// Flush and Close always sync. A process crash loses only the records
// still queued; a power loss also loses those written since the last
// sync. A failed write is cut back to the last complete line and the
// chain head restored, so the file never holds a gap; its records are
// counted in Stats.WriteFailed.
//
// # Restart and recovery
//
// Open continues the chain from the node's last record on disk. A crash
// mid-write can leave a torn last line: Open truncates the bytes after
// the last newline, logs it and reports it in Stats.TornBytes. The
// node's last complete record must then parse and verify with the node's
// key; otherwise Open fails (ErrKeyMismatch when the key file was
// replaced) rather than continuing a chain it cannot vouch for.
//
// # Export
//
// Export streams the stored lines unchanged, in order across files,
// keeping those whose time is at or after since (lines that do not parse
// are always included, for Verify to report). ExportHandler serves it as
// GET /v1/server/audit?since=... for the admin API, and KeysHandler the
// public keys. The infermesh audit command fetches and verifies exports.
package audit
