package chaos

import (
	"context"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
)

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// keyCreate creates a key with a fresh name. The book remembers the attempt
// before it is sent, so a create whose answer is lost is still in the
// history (as an operation with unknown outcome).
func (l *Load) keyCreate(ctx context.Context, n *Node, rec *Record) (Response, error) {
	l.mu.Lock()
	e := &KeyEntry{Name: l.cfg.KeyPrefix + strconv.Itoa(len(l.keys)), CreateCalled: l.rec.Since()}
	l.keys = append(l.keys, e)
	l.mu.Unlock()
	rec.KeyName = e.Name
	k, res, err := l.api.CreateKey(ctx, n.BaseURL(), KeySpec{Name: e.Name, App: "chaos", Allow: []string{"models", "embeddings"}})
	if err == nil && res.Status/100 == 2 {
		at := l.rec.Since()
		l.mu.Lock()
		e.ID, e.plain, e.CreateAcked, e.CreateAt = k.ID, k.Key, true, at
		l.mu.Unlock()
		rec.KeyID = k.ID
	}
	return res, err
}

// keyRevoke revokes a key whose creation was acknowledged and that no
// revoke has been sent for yet; with none, it reads instead.
func (l *Load) keyRevoke(ctx context.Context, n *Node, rec *Record) (Response, error) {
	l.mu.Lock()
	var cands []*KeyEntry
	for _, e := range l.keys {
		if e.CreateAcked && !e.revoking && e.RevokeCalled == 0 {
			cands = append(cands, e)
		}
	}
	if len(cands) == 0 {
		l.mu.Unlock()
		rec.Kind = OpKeyList
		return l.keyList(ctx, n, rec)
	}
	e := cands[l.rng.IntN(len(cands))]
	e.revoking, e.RevokeCalled = true, l.rec.Since()
	l.mu.Unlock()
	rec.KeyName, rec.KeyID = e.Name, e.ID
	res, err := l.api.RevokeKey(ctx, n.BaseURL(), e.ID)
	if err == nil && res.Status/100 == 2 {
		at := l.rec.Since()
		l.mu.Lock()
		e.RevokeAcked, e.RevokeAt = true, at
		l.mu.Unlock()
	}
	return res, err
}

// keyList reads the node's key list and keeps our keys.
func (l *Load) keyList(ctx context.Context, n *Node, rec *Record) (Response, error) {
	keys, res, err := l.api.ListKeys(ctx, n.BaseURL())
	if err != nil {
		return res, err
	}
	for _, k := range keys {
		if strings.HasPrefix(k.Name, l.cfg.KeyPrefix) {
			rec.Keys = append(rec.Keys, KeyObs{Name: k.Name, ID: k.ID, Revoked: k.Revoked})
		}
	}
	return res, nil
}

// keyProbe sends GET /v1/models with one of the created keys (revoked ones
// included) from the probe address. 2xx means the key was accepted.
func (l *Load) keyProbe(ctx context.Context, n *Node, rec *Record) (Response, error) {
	l.mu.Lock()
	var cands []*KeyEntry
	for _, e := range l.keys {
		if e.CreateAcked {
			cands = append(cands, e)
		}
	}
	if len(cands) == 0 {
		l.mu.Unlock()
		rec.Kind = OpModelsSDK
		return l.modelsSDK(ctx, n.ID)
	}
	e := cands[l.rng.IntN(len(cands))]
	l.mu.Unlock()
	rec.KeyName, rec.KeyID = e.Name, e.ID
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.BaseURL()+"/v1/models", nil)
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Authorization", "Bearer "+e.plain)
	return readResponse(l.probe.Do(req))
}

// FinalReads lists the keys once on every node that is up, marked final.
func (l *Load) FinalReads(ctx context.Context) []*Record {
	var out []*Record
	for _, id := range l.cl.InState(StateUp) {
		rec := l.Do(ctx, OpKeyList, id)
		rec.Final = true
		out = append(out, rec)
	}
	return out
}
