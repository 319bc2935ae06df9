package limits

import (
	"fmt"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/auth"
)

// Upgrade reports whether a paid plan would lift the refusal d: the
// response then carries "X-Service-Upgrade: 1".
func Upgrade(d *auth.Denial) bool {
	if d == nil {
		return false
	}
	switch d.Code {
	case apierr.CodeFreeDaily, apierr.CodeFreeRate, apierr.CodeFreeLocalOnly:
		return true
	}
	return false
}

func denyFreeRate(wait time.Duration) *auth.Denial {
	s := auth.RetryAfterSeconds(wait)
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: apierr.TypeRateLimit, Code: apierr.CodeFreeRate, RetryAfter: s,
		Message: fmt.Sprintf("This server is on the Free plan: third-party tools may make %d request a minute per client. Retry in %d s, or upgrade the server's plan.", FreeClientRPM, s),
	}
}

func denyFreeDaily(now time.Time) *auth.Denial {
	_, end := consensus.Period(consensus.LeaseDailyRequests, now)
	s := auth.RetryAfterSeconds(end.Sub(now))
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: apierr.TypeRateLimit, Code: apierr.CodeFreeDaily, RetryAfter: s,
		Message: fmt.Sprintf("This server is on the Free plan: third-party tools share %d requests a day and today's are used up; they reset at midnight UTC, in %d s. Upgrade the server's plan to lift the limit.", FreeDailyRequests, s),
	}
}

func denyFreeLocalOnly() *auth.Denial {
	return &auth.Denial{
		Status: http.StatusForbidden, Type: apierr.TypePermission, Code: apierr.CodeFreeLocalOnly,
		Message: "This server is on the Free plan: requests without an API key are served to its own computer only. Use an API key, or upgrade the server's plan.",
	}
}

// freeDenial turns a refusal of the Free allowance's ledger into the
// Free plan's words.
func freeDenial(d *auth.Denial, now time.Time) *auth.Denial {
	switch d.Code {
	case apierr.CodeDailyQuota:
		return denyFreeDaily(now)
	case apierr.CodeQuotaUnavailable:
		out := *d
		out.Message = "This node cannot extend its share of the Free plan's daily allowance: the cluster's leader could not be reached. Retry shortly, or on another node."
		return &out
	case apierr.CodeInvalidAPIKey:
		// The leader keeps no Free allowance ledger: a node of an older
		// version leads. Refuse rather than count nothing.
		return &auth.Denial{
			Status: http.StatusServiceUnavailable, Type: apierr.TypeServer, Code: apierr.CodeQuotaUnavailable, RetryAfter: DefaultUnavailableRetryFor,
			Message: "The cluster's leader keeps no Free plan allowance yet (a node of an older version leads); retry shortly.",
		}
	}
	return d
}

func denyKeyRate(keyID string, rpm int64, wait time.Duration) *auth.Denial {
	s := auth.RetryAfterSeconds(wait)
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: apierr.TypeRateLimit, Code: apierr.CodeRateLimit, RetryAfter: s,
		Message: fmt.Sprintf("Rate limit reached for API key %s: %d requests per minute. Retry in %d s.", keyID, rpm, s),
	}
}

func denyClientRate(rpm int64, wait time.Duration) *auth.Denial {
	s := auth.RetryAfterSeconds(wait)
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: apierr.TypeRateLimit, Code: apierr.CodeClientRateLimit, RetryAfter: s,
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
	code, amount := apierr.CodeDailyQuota, fmt.Sprintf("%d requests", limit)
	if kind == consensus.LeaseMonthlyBudget {
		code, amount = apierr.CodeMonthlyBudget, fmt.Sprintf("%d micro-units of estimated cost", limit)
	}
	return &auth.Denial{
		Status: http.StatusTooManyRequests, Type: apierr.TypeRateLimit, Code: code, RetryAfter: s,
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
		Status: http.StatusServiceUnavailable, Type: apierr.TypeServer, Code: apierr.CodeQuotaUnavailable,
		RetryAfter: DefaultUnavailableRetryFor,
		Message: fmt.Sprintf("This node cannot extend its share of the %s of API key %s: %s, and the share it held is used up or expired. Retry shortly, or on another node.",
			what, keyID, reason),
	}
}

func denyRetry(keyID string, kind consensus.LeaseKind, why string) *auth.Denial {
	what, _ := kindWords(kind)
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: apierr.TypeServer, Code: apierr.CodeQuotaUnavailable, RetryAfter: 1,
		Message: fmt.Sprintf("This node could not secure a share of the %s of API key %s: %s. Retry in a second.", what, keyID, why),
	}
}

func denyInactive() *auth.Denial {
	return &auth.Denial{
		Status: http.StatusUnauthorized, Type: apierr.TypeAuthentication, Code: apierr.CodeInvalidAPIKey,
		Message: "This API key has been revoked or has expired.",
	}
}

func denyDraining() *auth.Denial {
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: apierr.TypeServer, Code: apierr.CodeDraining, RetryAfter: 1,
		Message: "This node is draining; retry on another node.",
	}
}

func denyCanceled(err error) *auth.Denial {
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: apierr.TypeServer, Code: apierr.CodeOverloaded, RetryAfter: 1,
		Message: "The request ended while waiting for admission: " + err.Error() + ".",
	}
}

func denyBusy(retry int, why string) *auth.Denial {
	return &auth.Denial{
		Status: http.StatusServiceUnavailable, Type: apierr.TypeServer, Code: apierr.CodeOverloaded, RetryAfter: retry,
		Message: "This node is busy (" + why + "); retry in " + fmt.Sprint(retry) + " s.",
	}
}
