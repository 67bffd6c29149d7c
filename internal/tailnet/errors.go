package tailnet

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Reasons of an [Error]. They are stable: controllers copy them into status conditions.
const (
	// ReasonUnauthorized: the OAuth client credentials were rejected (401).
	ReasonUnauthorized = "Unauthorized"
	// ReasonForbidden: the OAuth client lacks a scope or a permission (403).
	ReasonForbidden = "Forbidden"
	// ReasonTagsNotPermitted: the OAuth client may not use the requested tags.
	ReasonTagsNotPermitted = "TagsNotPermitted"
	// ReasonNotFound: the device, service or tailnet does not exist (404).
	ReasonNotFound = "NotFound"
	// ReasonRateLimited: too many requests (429); see [RetryAfter].
	ReasonRateLimited = "RateLimited"
	// ReasonUnavailable: the API could not be reached or failed (5xx, network errors).
	ReasonUnavailable = "Unavailable"
	// ReasonInvalidRequest: the API refused the request as malformed (other 4xx).
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonCredentialsUnavailable: the OAuth client ID or secret file cannot be read or is empty.
	ReasonCredentialsUnavailable = "CredentialsUnavailable"
)

// Error is a failed call to the control plane.
type Error struct {
	// Op names the call, e.g. "create auth key".
	Op     string
	Reason string
	// Status is the HTTP status, or 0 when no response arrived.
	Status int
	// Message is the API's own explanation, if any.
	Message string
	// RetryAfter is what the API asked the caller to wait, or 0.
	RetryAfter time.Duration
	// cause is kept for errors.Is (context cancellation, network errors); it carries no
	// credentials because nothing that could (token responses, request bodies) is kept.
	cause error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("tailnet")
	if e.Op != "" {
		b.WriteString(": " + e.Op)
	}
	b.WriteString(": " + e.Reason)
	if e.Status != 0 {
		fmt.Fprintf(&b, " (HTTP %d)", e.Status)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, "; retry after %v", e.RetryAfter)
	}
	if e.cause != nil && e.Message == "" {
		b.WriteString(": " + e.cause.Error())
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.cause }

// ReasonOf returns the Reason of the *Error in err's chain, or "" when there is none.
func ReasonOf(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Reason
	}
	return ""
}

// RetryAfter returns how long the API asked the caller to wait before trying again.
func RetryAfter(err error) (time.Duration, bool) {
	if e, ok := errors.AsType[*Error](err); ok && e.RetryAfter > 0 {
		return e.RetryAfter, true
	}
	return 0, false
}

// IsNotFound reports whether err says the thing asked for does not exist.
func IsNotFound(err error) bool { return ReasonOf(err) == ReasonNotFound }

// reasonForStatus maps an HTTP error status and the API's message to a Reason.
func reasonForStatus(status int, msg string) string {
	switch {
	case status == http.StatusUnauthorized:
		return ReasonUnauthorized
	case (status == http.StatusForbidden || status == http.StatusBadRequest) && tagsNotPermitted(msg):
		// Tailscale answers a key request for tags the client does not own with 400 and
		// "requested tags [...] are invalid or not permitted"; other servers use 403.
		return ReasonTagsNotPermitted
	case status == http.StatusForbidden:
		return ReasonForbidden
	case status == http.StatusNotFound:
		return ReasonNotFound
	case status == http.StatusTooManyRequests:
		return ReasonRateLimited
	case status >= 500:
		return ReasonUnavailable
	default:
		return ReasonInvalidRequest
	}
}

func tagsNotPermitted(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "tag") && (strings.Contains(msg, "not permitted") || strings.Contains(msg, "not allowed"))
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
