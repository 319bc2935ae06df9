package node

import (
	"encoding/json"
	"testing"

	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/apierr"
)

// TestPolicyValidateNamesTheField: every bad part of a policy document is
// refused with a 400 that names its field; good documents pass.
func TestPolicyValidateNamesTheField(t *testing.T) {
	bad := map[string]string{
		`{"strategy":"fastest"}`:                                            "strategy",
		`{"governance":"anarchy"}`:                                          "governance",
		`{"workers":{"a":{"weight":-1}}}`:                                   "workers.a.weight",
		`{"workers":{"a":{"canary_percent":101}}}`:                          "workers.a.canary_percent",
		`{"workers":{"a":{"inflight_cap":-2}}}`:                             "workers.a.inflight_cap",
		`{"models":{"tiny-bert:test":{}}}`:                                  "models",
		`{"models":{"onnx/a/b":{"lifecycle":"gone"}}}`:                      "models.onnx/a/b.lifecycle",
		`{"models":{"onnx/a/b":{"price_per_request":-0.5}}}`:                "models.onnx/a/b.price_per_request",
		`{"models":{"onnx/a/b":{"price_per_million_output_tokens":1e300}}}`: "models.onnx/a/b.price_per_million_output_tokens",
	}
	for body, param := range bad {
		// node/api decodes the document strictly (TestPolicyDecodeNamesTheField
		// there); this checks what the node validates.
		var d api.Policy
		err := json.Unmarshal([]byte(body), &d)
		if err == nil {
			if e := validatePolicy(d); e != nil {
				err = e
			}
		}
		ae, ok := err.(*apierr.Error)
		if !ok || ae.Status != 400 || ae.Param != param {
			t.Errorf("%s: %v, want a 400 naming %s", body, err, param)
		}
	}
	for _, body := range []string{
		`{}`,
		`{"strategy":"weighted","governance":"federated","workers":{"node-a":{"weight":3,"canary":true,"canary_percent":10,"inflight_cap":32}},
		  "models":{"onnx/tiny-bert/test-128":{"lifecycle":"deprecated","replacement":"onnx/minilm/l6","price_per_request":0.0001,"price_per_million_input_tokens":0.02}}}`,
	} {
		var d api.Policy
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if e := validatePolicy(d); e != nil {
			t.Errorf("%s: %v", body, e)
		}
	}
}
