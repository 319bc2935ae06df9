package api

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
)

// Key creation bodies: each bad one names the field at fault with a
// precise message; the good ones pass.
func TestCheckKeyRequest(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cases := []struct {
		body  string
		param string // "" = accepted
	}{
		{`{"name":"a"}`, ""},
		{`{"name":"a","expires_at":1800003600,"rpm":10,"daily_quota":5,"monthly_budget":12.5}`, ""},
		{`{"name":"a","monthly_budget":1e12}`, ""},
		{`{}`, "name"},
		{`{"name":"a","expires_at":0}`, "expires_at"},
		{`{"name":"a","expires_at":-5}`, "expires_at"},
		{`{"name":"a","expires_at":1800000000}`, "expires_at"},
		{`{"name":"a","expires_at":999999999999}`, "expires_at"},
		{`{"name":"a","monthly_budget":1e308}`, "monthly_budget"},
		{`{"name":"a","monthly_budget":-1}`, "monthly_budget"},
		{`{"name":"a","rpm":-1}`, "rpm"},
		{`{"name":"a","rpm":9000000000000000000}`, "rpm"},
		{`{"name":"a","daily_quota":-2}`, "daily_quota"},
		{`{"name":"a","daily_quota":9000000000000000000}`, "daily_quota"},
	}
	for _, c := range cases {
		var req KeyRequest
		if err := json.Unmarshal([]byte(c.body), &req); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		e := checkKeyRequest(&req, now)
		switch {
		case c.param == "" && e != nil:
			t.Errorf("%s: refused: %s", c.body, e.Message)
		case c.param != "" && e == nil:
			t.Errorf("%s: accepted, want a 400 naming %s", c.body, c.param)
		case c.param != "" && (e.Param != c.param || e.Status != 400):
			t.Errorf("%s: got %d param %q (%s), want 400 param %q", c.body, e.Status, e.Param, e.Message, c.param)
		}
	}
}

// TestPolicyDecodeNamesTheField: a policy document of the wrong shape is
// refused by the strict decoding PUT /v1/server/policy does, with a 400
// naming the field, before the node sees it.
func TestPolicyDecodeNamesTheField(t *testing.T) {
	for body, param := range map[string]string{
		`{"strategy":5}`:                   "strategy",
		`{"stratgy":"x"}`:                  "stratgy",
		`{"workers":{"a":{"weight":"3"}}}`: "workers.weight",
	} {
		var p Policy
		err := decodeStrict([]byte(body), &p)
		var e *apierr.Error
		if !errors.As(err, &e) || e.Status != 400 || e.Param != param {
			t.Errorf("%s: %v, want a 400 naming %s", body, err, param)
		}
	}
}
