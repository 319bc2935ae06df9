package limits

import (
	"fmt"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/auth"
)

// Error codes of limit refusals (type rate_limit_error for 429,
// server_error for 503).
const (
	CodeRateLimit        = "rate_limit_exceeded"
	CodeClientRateLimit  = "client_rate_limit_exceeded"
	CodeDailyQuota       = "daily_quota_exceeded"
	CodeMonthlyBudget    = "monthly_budget_exceeded"
	CodeQuotaUnavailable = "quota_unavailable"
	CodeOverloaded       = "server_overloaded"
	CodeDraining         = "server_draining"
)

func denyKeyRate(keyID string, rpm int64, wait time.Duration) *auth.Denial {
	s := auth.RetryAfterSeconds(wait)
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: auth.TypeRateLimit, Code: CodeRateLimit, RetryAfter: s,
		Message: fmt.Sprintf("Rate limit reached for API key %s: %d requests per minute. Retry in %d s.", keyID, rpm, s),
	}
}

func denyClientRate(rpm int64, wait time.Duration) *auth.Denial {
	s := auth.RetryAfterSeconds(wait)
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: auth.TypeRateLimit, Code: CodeClientRateLimit, RetryAfter: s,
		Message: fmt.Sprintf("Rate limit reached for this client address: %d requests per minute. Retry in %d s.", rpm, s),
	}
}

func kindWords(kind consensus.LeaseKind) (limit, resets string) {
	if kind == consensus.LeaseMonthlyBudget {
		return "monthly budget", "on the 1st of next month (UTC)"
	}
	return "daily request quota", "at midnight UTC"
}

func denyExhausted(keyID string, kind consensus.LeaseKind, limit int64, now time.Time) *auth.Denial {
	_, end := consensus.Period(kind, now)
	s := auth.RetryAfterSeconds(end.Sub(now))
	what, resets := kindWords(kind)
	code, amount := CodeDailyQuota, fmt.Sprintf("%d requests", limit)
	if kind == consensus.LeaseMonthlyBudget {
		code, amount = CodeMonthlyBudget, fmt.Sprintf("%d micro-units of estimated cost", limit)
	}
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: auth.TypeRateLimit, Code: code, RetryAfter: s,
		Message: fmt.Sprintf("The %s of API key %s (%s) is used up; it resets %s, in %d s.", what, keyID, amount, resets, s),
	}
}

func denyUnavailable(keyID string, kind consensus.LeaseKind, cause error) *auth.Denial {
	what, _ := kindWords(kind)
	reason := "the cluster's leader could not be reached"
	if cause != nil {
		reason += " (" + cause.Error() + ")"
	}
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: auth.TypeServer, Code: CodeQuotaUnavailable,
		RetryAfter: DefaultUnavailableRetryFor,
		Message: fmt.Sprintf("This node cannot extend its share of the %s of API key %s: %s, and the share it held is used up or expired. Retry shortly, or on another node.",
			what, keyID, reason),
	}
}

func denyRetry(keyID string, kind consensus.LeaseKind, why string) *auth.Denial {
	what, _ := kindWords(kind)
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: auth.TypeServer, Code: CodeQuotaUnavailable, RetryAfter: 1,
		Message: fmt.Sprintf("This node could not secure a share of the %s of API key %s: %s. Retry in a second.", what, keyID, why),
	}
}

func denyInactive() *auth.Denial {
	return &auth.Denial{
		Status: http.StatusUnauthorized, Type: auth.TypeAuthentication, Code: auth.CodeInvalidAPIKey,
		Message: "This API key has been revoked or has expired.",
	}
}

func denyDraining() *auth.Denial {
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: auth.TypeServer, Code: CodeDraining, RetryAfter: 1,
		Message: "This node is draining; retry on another node.",
	}
}

func denyCanceled(err error) *auth.Denial {
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: auth.TypeServer, Code: CodeOverloaded, RetryAfter: 1,
		Message: "The request ended while waiting for admission: " + err.Error() + ".",
	}
}

func denyBusy(retry int, why string) *auth.Denial {
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: auth.TypeServer, Code: CodeOverloaded, RetryAfter: retry,
		Message: "This node is busy (" + why + "); retry in " + fmt.Sprint(retry) + " s.",
	}
}
