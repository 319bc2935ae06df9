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

	// Free plan refusals (429, or 403 for the local-only rule); Upgrade
	// reports true for them.
	CodeFreeDaily     = "free_plan_daily_limit_exceeded"
	CodeFreeRate      = "free_plan_rate_limit_exceeded"
	CodeFreeLocalOnly = "free_plan_local_only"
)

// Upgrade reports whether a paid plan would lift the refusal d: the
// response then carries "X-Service-Upgrade: 1".
func Upgrade(d *auth.Denial) bool {
	if d == nil {
		return false
	}
	switch d.Code {
	case CodeFreeDaily, CodeFreeRate, CodeFreeLocalOnly:
		return true
	}
	return false
}

func denyFreeRate(wait time.Duration) *auth.Denial {
	s := auth.RetryAfterSeconds(wait)
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: auth.TypeRateLimit, Code: CodeFreeRate, RetryAfter: s,
		Message: fmt.Sprintf("This server is on the Free plan: third-party tools may make %d request a minute per client. Retry in %d s, or upgrade the server's plan.", FreeClientRPM, s),
	}
}

func denyFreeDaily(now time.Time) *auth.Denial {
	_, end := consensus.Period(consensus.LeaseDailyRequests, now)
	s := auth.RetryAfterSeconds(end.Sub(now))
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: auth.TypeRateLimit, Code: CodeFreeDaily, RetryAfter: s,
		Message: fmt.Sprintf("This server is on the Free plan: third-party tools share %d requests a day and today's are used up; they reset at midnight UTC, in %d s. Upgrade the server's plan to lift the limit.", FreeDailyRequests, s),
	}
}

func denyFreeLocalOnly() *auth.Denial {
	return &auth.Denial{
		Status: http.StatusForbidden, Type: auth.TypePermission, Code: CodeFreeLocalOnly,
		Message: "This server is on the Free plan: requests without an API key are served to its own computer only. Use an API key, or upgrade the server's plan.",
	}
}

// freeDenial turns a refusal of the Free allowance's ledger into the
// Free plan's words.
func freeDenial(d *auth.Denial, now time.Time) *auth.Denial {
	switch d.Code {
	case CodeDailyQuota:
		return denyFreeDaily(now)
	case CodeQuotaUnavailable:
		out := *d
		out.Message = "This node cannot extend its share of the Free plan's daily allowance: the cluster's leader could not be reached. Retry shortly, or on another node."
		return &out
	case auth.CodeInvalidAPIKey:
		// The leader keeps no Free allowance ledger: a node of an older
		// version leads. Refuse rather than count nothing.
		return &auth.Denial{
			Status: http.StatusServiceUnavailable, Type: auth.TypeServer, Code: CodeQuotaUnavailable, RetryAfter: DefaultUnavailableRetryFor,
			Message: "The cluster's leader keeps no Free plan allowance yet (a node of an older version leads); retry shortly.",
		}
	}
	return d
}

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
