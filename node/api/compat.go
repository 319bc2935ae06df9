package api

import (
	"net/http"

	"github.com/infermesh/infermesh/node/apierr"
)

// The names below keep package node (the composition root) compiling
// while it moves to node/apierr, which owns the error vocabulary; new code
// uses apierr directly. Delete this file once package node no longer
// refers to them.

// APIError is apierr.Error.
type APIError = apierr.Error

// Error types and codes package node still names through this package.
const (
	TypeInvalidRequest   = apierr.TypeInvalidRequest
	TypePermission       = apierr.TypePermission
	TypeServer           = apierr.TypeServer
	CodeGovernanceDenied = apierr.CodeGovernanceDenied
	CodeInternal         = apierr.CodeInternal
	CodeInvalidValue     = apierr.CodeInvalidValue
	CodeModelBlocked     = apierr.CodeModelBlocked
	CodeOverloaded       = apierr.CodeOverloaded
)

// Errorf is apierr.New.
func Errorf(status int, typ, code, param, msg string) *APIError {
	return apierr.New(status, typ, code, param, msg)
}

// BadRequest is apierr.BadRequest.
func BadRequest(code, param, msg string) *APIError { return apierr.BadRequest(code, param, msg) }

// WriteError is apierr.Write.
func WriteError(w http.ResponseWriter, e *APIError) { apierr.Write(w, e) }
