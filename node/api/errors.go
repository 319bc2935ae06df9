package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// ModelNotFound is the spec's 404 model_not_found.
func ModelNotFound(id string) *apierr.Error {
	return apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeModelNotFound, "model",
		"The model '"+id+"' does not exist or is not installed on this mesh.")
}

// writeErr maps any error to an API error: apierr.Error as is, engine input
// errors to 400, everything else to 500 without leaking internals.
func writeErr(w http.ResponseWriter, err error) {
	var ae *apierr.Error
	if errors.As(err, &ae) {
		apierr.Write(w, ae)
		return
	}
	var pe *engine.ProviderError
	if errors.As(err, &pe) {
		// An upstream provider's answer, written as the provider gave it
		// (4xx) or as the outage it stands for (502/503/504).
		e := apierr.New(pe.Status, pe.Type, pe.Code, pe.Param, pe.Message)
		e.RetryAfter = pe.RetryAfter
		apierr.Write(w, e)
		return
	}
	var ie *engine.InputError
	if errors.As(err, &ie) {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, ie.Param, ie.Msg))
		return
	}
	if errors.Is(err, engine.ErrBusy) {
		// The model's batch and its queue are full: retry shortly.
		e := apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, apierr.CodeOverloaded, "", "The model is serving as many requests as it can hold; retry shortly.")
		e.RetryAfter = 1
		var be *engine.BusyError
		if errors.As(err, &be) && be.RetryAfter > time.Second {
			e.RetryAfter = int((be.RetryAfter + time.Second - 1) / time.Second)
		}
		apierr.Write(w, e)
		return
	}
	if errors.Is(err, ErrModelNotFound) {
		apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeModelNotFound, "model", err.Error()))
		return
	}
	if errors.Is(err, ErrWrongTask) {
		apierr.Write(w, apierr.BadRequest(apierr.CodeModelNotSupported, "model", err.Error()))
		return
	}
	apierr.Write(w, apierr.New(http.StatusInternalServerError, apierr.TypeServer, apierr.CodeInternal, "", "The server had an error while processing your request."))
}

// writeJSON writes v as a 200 JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.Encode(v)
}
