package auth

import (
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
)

// Denial is a refused request. Its fields map one to one onto the OpenAI
// error body and the Retry-After header; node/limits uses the same type.
type Denial struct {
	Status     int    // HTTP status
	Type       string // OpenAI error type
	Code       string // machine-readable code
	Message    string // what happened and what to do
	RetryAfter int    // seconds for Retry-After; zero sends none
}

// Error describes the denial.
func (d *Denial) Error() string {
	return fmt.Sprintf("%d %s: %s", d.Status, d.Code, d.Message)
}

// RetryAfterSeconds rounds a wait up to whole seconds, at least one.
func RetryAfterSeconds(d time.Duration) int {
	s := math.Ceil(d.Seconds())
	if s < 1 {
		return 1
	}
	if s > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(s)
}

func denyKey(msg string) *Denial {
	return &Denial{Status: http.StatusUnauthorized, Type: apierr.TypeAuthentication, Code: apierr.CodeInvalidAPIKey, Message: msg}
}

func denyPermission(msg string) *Denial {
	return &Denial{Status: http.StatusForbidden, Type: apierr.TypePermission, Code: apierr.CodePermissionDenied, Message: msg}
}

func denyThrottled(wait time.Duration) *Denial {
	s := RetryAfterSeconds(wait)
	return &Denial{
		Status: http.StatusTooManyRequests, Type: apierr.TypeRateLimit, Code: apierr.CodeTooManyFailedAuth, RetryAfter: s,
		Message: fmt.Sprintf("Too many requests with wrong API keys from this address; retry in %d s with a valid key.", s),
	}
}

const (
	msgMissingKey = "You didn't provide an API key. Send it as 'Authorization: Bearer <key>', 'api-key' or 'x-api-key'."
	msgWrongKey   = "Incorrect API key provided."
	msgInactive   = "This API key has been revoked or has expired."
)
